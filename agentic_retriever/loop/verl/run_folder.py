"""The folder of one verl run (`prepare_verl_run`): its data, tool config, overrides and launch script.

**data**: parquet rows ``{data_source, prompt: [{"role": "user", "content": <our Search-R1 prompt>}], ability,
reward_model: {"style": "rule", "ground_truth": {"target": [golden answers]}}, extra_info: {split, index, id,
question, need_tools_kwargs, tools_kwargs: {"search": {"create_kwargs": {...}}}}, agent_name: "tool_agent"}``.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from agent.dialects.search_r1 import SearchR1Dialect
from agent.qa_data import QARow, read_qa_rows
from agent.rl.config import RLConfig
from agentic_retriever.jsonl import atomic_write

from .overrides import final_step, verl_overrides
from .search_tool import TOOL_NAME, search_tool_config
from .settings import VerlRun, VerlSettings

DATA_SOURCE = "agentic_retriever"


def _row(qa: QARow, split: str, index: int) -> dict[str, Any]:
    """One verl RL row: the Search-R1 prompt as chat messages, the golden answers, what the tool loop reads."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": SearchR1Dialect().build_prompt(qa.question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(qa.golden_answers)}},
        "extra_info": {"split": split, "index": index, "id": qa.id, "question": qa.question,
                       "need_tools_kwargs": True,
                       "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"question": qa.question}}}},
        "agent_name": "tool_agent",
    }


def write_verl_parquet(qa_path: str | os.PathLike, split: str, path: Path) -> int:
    """The questions of `qa_path` (FlashRAG JSONL) as verl parquet rows at `path` (atomically); the row count."""
    rows = [_row(qa, split, i) for i, qa in enumerate(read_qa_rows(qa_path))]
    if not rows:
        raise ValueError(f"{qa_path}: no questions for verl's {split} data")
    with atomic_write(path, "wb") as handle:
        pq.write_table(pa.Table.from_pylist(rows), handle)
    return len(rows)


def _write_text(path: Path, text: str, executable: bool = False) -> None:
    with atomic_write(path) as handle:
        handle.write(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _launch_script(command: list[str], out_dir: Path) -> str:
    lines = " \\\n    ".join(shlex.quote(part) for part in command)
    return (f"#!/usr/bin/env bash\n# verl run of the co-training loop's agent step (agentic_retriever/loop/verl)\n"
            f"set -euo pipefail\ncd {shlex.quote(str(out_dir))}\nexec {lines}\n")


def prepare_verl_run(out_dir: str | os.PathLike, settings: VerlSettings, rl: RLConfig, service_url: str,
                     init_model: str, train_qa: str | os.PathLike, val_qa: str | os.PathLike) -> VerlRun:
    """Write a verl PPO run of the agent against the retrieval service at `service_url` into `out_dir`.

    Files: ``train.parquet`` / ``val.parquet`` (verl rows, see the module docstring), ``search_tool.yaml``
    (`search_tool_config`), ``overrides.txt`` (one Hydra override a line, `verl_overrides`) and ``launch.sh``
    (``LAUNCHER -m verl.trainer.main_ppo OVERRIDES...``, run from `out_dir`). Checkpoints go to
    ``out_dir/checkpoints``; the log of a launched run to ``out_dir/verl.log``.
    """
    if not service_url:
        raise ValueError("prepare_verl_run needs the retrieval service URL (verl's search tool calls it)")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_verl_parquet(train_qa, "train", out / "train.parquet")
    write_verl_parquet(val_qa, "test", out / "val.parquet")
    _write_text(out / "search_tool.yaml", yaml.safe_dump(search_tool_config(service_url, rl.env.topk), sort_keys=False))
    overrides = verl_overrides(settings, rl, out, init_model)
    _write_text(out / "overrides.txt", "\n".join(overrides) + "\n")
    command = [*shlex.split(settings.launcher), "-m", "verl.trainer.main_ppo", *overrides]
    _write_text(out / "launch.sh", _launch_script(command, out), executable=True)
    return VerlRun(out, command, out / "launch.sh", out / "verl.log", out / "checkpoints", final_step(settings, rl))
