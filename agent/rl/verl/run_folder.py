"""The folder of one verl run (`prepare_verl_run`): its data, agent-loop or tool config, overrides and launch script.

**data**: parquet rows ``{data_source, prompt: [{"role": "user", "content": <the prompt>}], ability,
reward_model: {"style": "rule", "ground_truth": {"target": [golden answers]}}, extra_info: {split, index, id,
question}, agent_name}``; the ``tool_agent`` loop's rows add ``need_tools_kwargs`` and ``tools_kwargs: {"search":
{"create_kwargs": {"question"}}}`` (verl hands ``create_kwargs`` to the tool's ``create``). With the
``dialect`` agent loop, ``agent_name`` is ``agentic_retriever_agent`` and the prompt is the dialect's (for s3,
whose prompt holds the documents of its first search, the prompt with no documents: the agent loop retrieves them
and builds the real one); with ``tool_agent`` it is verl's tool loop and `TOOL_PROMPT`.

**validation**: ``val.parquet`` holds `VerlSettings.val_questions` questions held out of the training questions
(`split_heldout`, by normalised question, so no question is on both sides); the dev questions never go to verl.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from agent.dialects import get_dialect
from agent.env import EnvConfig
from agent.rl.config import RLConfig
from agentic_retriever.base.client import API_KEY_ENV
from agentic_retriever.base.jsonl import atomic_write
from agentic_retriever.base.qa_metrics import normalize_answer
from agentic_retriever.base.qa_sources import QARow, read_qa_rows
from agentic_retriever.base.sessions import command_words

from .overrides import (AGENT_LOOP_FILE, AGENT_LOOP_NAME, TOOL_AGENT_LOOP_NAME, TOOL_FILE, check_mappable,
                        epochs_for_steps, final_step, verl_overrides)
from .checkpoint import KILL_GRACE_SECONDS, TRAPPED_SIGNALS
from .cpu import cpu_environment
from .search_tool import TOOL_NAME, search_tool_config
from .settings import VerlRun, VerlSettings

DATA_SOURCE = "agentic_retriever"

#: The prompt of the ``tool_agent`` loop: the chat template adds the search tool's schema and call format.
TOOL_PROMPT = ("Answer the given question. Call the search tool whenever you lack knowledge. When no further "
               "knowledge is needed, give the final answer inside <answer> and </answer>, without detailed "
               "illustrations, for example <answer> Beijing </answer>. Question: {question}\n")


def agent_loop_config(env: EnvConfig, service_url: str, timeout: float = 60.0,
                      api_key: str | None = None) -> list[dict[str, Any]]:
    """verl's agent-loop config file (a list of Hydra ``instantiate`` entries): `agent_loop.DialectAgentLoop` with
    the environment settings of `env` (sampling is verl's) and our retrieval service at `service_url` (with its
    `api_key`, when it takes one), and `agent_loop.SearchToolAgentLoop` (verl's tool loop, which reads its settings
    from verl's ``multi_turn``)."""
    settings = {name: getattr(env, name) for name in ("dialect", "max_turns", "topk", "max_new_tokens_per_turn",
                                                      "observation_max_tokens", "max_context_tokens")}
    return [{"name": AGENT_LOOP_NAME, "_target_": f"{__package__}.agent_loop.DialectAgentLoop", "_convert_": "all",
             "env": settings, "retrieval_service_url": service_url, "timeout": timeout}
            | ({"api_key": api_key} if api_key else {}),
            {"name": TOOL_AGENT_LOOP_NAME, "_target_": f"{__package__}.agent_loop.SearchToolAgentLoop"}]


def _prompt(qa: QARow, agent_loop: str, dialect: str) -> str:
    if agent_loop == "tool_agent":
        return TOOL_PROMPT.format(question=qa.question.strip())
    speaker = get_dialect(dialect)
    return speaker.build_prompt(qa.question, [[] for _ in speaker.initial_queries(qa.question)])


def _row(qa: QARow, split: str, index: int, agent_loop: str, dialect: str) -> dict[str, Any]:
    """One verl RL row: the prompt as chat messages, the golden answers, what the agent loop reads."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": _prompt(qa, agent_loop, dialect)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(qa.golden_answers)}},
        "extra_info": {"split": split, "index": index, "id": qa.id, "question": qa.question} | ({
            "need_tools_kwargs": True, "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"question": qa.question}}}}
            if agent_loop == "tool_agent" else {}),
        "agent_name": AGENT_LOOP_NAME if agent_loop == "dialect" else TOOL_AGENT_LOOP_NAME,
    }


def split_heldout(rows: list[QARow], count: int, seed: int = 0) -> tuple[list[QARow], list[QARow]]:
    """(training rows, held-out rows): the `count` normalised questions first in a seeded hash order are held out,
    with every row that asks them, so a question and its duplicates stay on one side."""
    keys = {normalize_answer(row.question) for row in rows}
    if count >= len(keys):
        raise ValueError(f"{len(keys)} distinct training questions cannot spare {count} for verl's validation "
                         "(VerlSettings.val_questions)")
    order = sorted(keys, key=lambda key: hashlib.sha256(f"{seed}|{key}".encode()).hexdigest())
    held = set(order[:count])
    return ([row for row in rows if normalize_answer(row.question) not in held],
            [row for row in rows if normalize_answer(row.question) in held])


def write_verl_parquet(rows: list[QARow], split: str, path: Path, agent_loop: str = "dialect",
                       dialect: str = "search_r1") -> int:
    """`rows` as verl parquet rows at `path` (atomically); the row count."""
    if not rows:
        raise ValueError(f"no questions for verl's {split} data ({path})")
    table = pa.Table.from_pylist([_row(qa, split, i, agent_loop, dialect) for i, qa in enumerate(rows)])
    with atomic_write(path, "wb") as handle:
        pq.write_table(table, handle)
    return len(rows)


def _write_text(path: Path, text: str, executable: bool = False, private: bool = False) -> None:
    with atomic_write(path, private=private) as handle:
        handle.write(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def launch_script(command: list[str], out_dir: Path, settings: VerlSettings) -> str:
    """``launch.sh``: the environment of the run (`cpu.cpu_environment` for ``device: cpu``), the command under
    coreutils' ``timeout`` (``settings.timeout_seconds``; SIGTERM, SIGKILL `KILL_GRACE_SECONDS` later; exit 124
    when the limit was reached; an INT, TERM or HUP of the script is passed on as TERM), and an EXIT trap removing
    the shared-memory segments the run left (`leftovers`)."""
    python = command_words(settings.launcher)[0]
    environment = cpu_environment(settings) if settings.device == "cpu" else {}
    exports = "".join(f"export {name}={shlex.quote(value)}"  # a list of modules keeps the caller's own after ours
                      + (f"${{{name}:+,${name}}}" if name == "VERL_USE_EXTERNAL_MODULES" else "") + "\n"
                      for name, value in environment.items())
    lines = " \\\n    ".join(shlex.quote(part) for part in command)
    return (f"#!/usr/bin/env bash\n# verl run of the co-training loop's agent step (agent/rl/verl)\n"
            f"set -uo pipefail\ncd {shlex.quote(str(out_dir))}\n{exports}"
            f"started=$(date +%s)\n"
            f"trap '{shlex.quote(python)} -m {__package__}.leftovers --since \"$started\"' EXIT\n"
            # timeout runs verl in a process group of its own, out of reach of a terminal's Ctrl-C: pass signals on.
            # The trap is set before verl starts, so a signal that arrives before `child` is known is passed on after
            f"child=\nstop=\ntrap 'stop=1; [ -z \"$child\" ] || kill -TERM \"$child\" 2>/dev/null' {' '.join(TRAPPED_SIGNALS)}\n"
            f"timeout --kill-after={KILL_GRACE_SECONDS} {settings.timeout_seconds:.0f} {lines} &\n"
            f"child=$!\n[ -z \"$stop\" ] || kill -TERM \"$child\" 2>/dev/null\n"
            f"while wait \"$child\"; status=$?; kill -0 \"$child\" 2>/dev/null; do :; done\nexit \"$status\"\n")


def prepare_verl_run(out_dir: str | os.PathLike, settings: VerlSettings, rl: RLConfig, service_url: str,
                     init_model: str, train_qa: str | os.PathLike) -> VerlRun:
    """Write a verl PPO run of the agent against the retrieval service at `service_url` into `out_dir`.

    Files: ``train.parquet`` / ``val.parquet`` (the questions of `train_qa`, `settings.val_questions` of them held
    out for validation; see the module docstring), ``agent_loop.yaml`` (`agent_loop_config`: both of our loops),
    ``search_tool.yaml`` (`search_tool_config`; agent loop ``tool_agent`` only), ``overrides.txt`` (one Hydra
    override a line, `verl_overrides`) and ``launch.sh`` (``LAUNCHER -m verl.trainer.main_ppo OVERRIDES...``, run
    from `out_dir`). When ``$AGENTIC_RETRIEVER_API_KEY`` holds the service's key (the loop puts a fresh one there
    when its service leaves loopback), both config files carry it, readable by their owner alone (0600): verl's
    workers on other nodes do not inherit this process's environment. ``trainer.total_epochs`` follows from the
    training rows (`epochs_for_steps`). Checkpoints go to ``out_dir/checkpoints``; the log of a launched run to
    ``out_dir/verl.log``.
    """
    if not service_url:
        raise ValueError("prepare_verl_run needs the retrieval service URL (the agent loop calls it)")
    check_mappable(settings, rl)  # before reading the questions: settings verl cannot run name themselves first
    out = Path(out_dir).resolve()
    train, held_out = split_heldout(read_qa_rows(train_qa), settings.val_questions, rl.seed)
    overrides = verl_overrides(settings, rl, out, init_model, len(train))  # refuses what verl cannot run
    out.mkdir(parents=True, exist_ok=True)
    write_verl_parquet(train, "train", out / "train.parquet", settings.agent_loop, rl.env.dialect)
    write_verl_parquet(held_out, "heldout", out / "val.parquet", settings.agent_loop, rl.env.dialect)
    api_key = os.environ.get(API_KEY_ENV) or None  # the service's key, for verl's workers on every node
    loops = agent_loop_config(rl.env, service_url, api_key=api_key)
    if settings.agent_loop == "tool_agent":
        _write_text(out / TOOL_FILE, yaml.safe_dump(search_tool_config(service_url, rl.env.topk, api_key),
                                                     sort_keys=False), private=api_key is not None)
    _write_text(out / AGENT_LOOP_FILE, yaml.safe_dump(loops, sort_keys=False), private=api_key is not None)
    _write_text(out / "overrides.txt", "\n".join(overrides) + "\n")
    command = [*command_words(settings.launcher), "-m", "verl.trainer.main_ppo", *overrides]
    _write_text(out / "launch.sh", launch_script(command, out, settings), executable=True)
    return VerlRun(out, command, out / "launch.sh", out / "verl.log", out / "checkpoints", final_step(settings, rl),
                   epochs_for_steps(len(train), rl.prompts_per_step, final_step(settings, rl)))
