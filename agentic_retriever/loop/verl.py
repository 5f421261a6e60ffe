"""The co-training loop's agent step on verl: write the run, launch it (or let the user), pick up its checkpoint.

Algorithm 1 of "Agentic-R: Learning to Retrieve for Agentic Search" (arXiv 2601.11888) trains Agent_i with PPO
against the retriever of the iteration. With ``agent_trainer: verl`` that step runs on verl ("HybridFlow: A
Flexible and Efficient RLHF Framework", arXiv 2409.19256; written against verl 0.9.1) instead of the embedded
trainer (`agent.rl`): `prepare_verl_run` writes everything verl needs into one folder, `start_verl_run` starts it
(``VerlSettings.launch``) and `wait_for_checkpoint` returns the trained policy as a Hugging Face model folder.

The agent is Search-R1's ("Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement
Learning", arXiv 2503.09516) on verl's multi-turn tool agent loop (``tool_agent``, hermes tool calls):

* **data**: parquet rows ``{data_source, prompt: [{"role": "user", "content": <our Search-R1 prompt>}], ability,
  reward_model: {"style": "rule", "ground_truth": {"target": [golden answers]}}, extra_info: {split, index, id,
  question, need_tools_kwargs, tools_kwargs: {"search": {"create_kwargs": {...}}}}, agent_name: "tool_agent"}``;
* **search tool**: verl 0.9.1 ships no search tool (``verl.tools`` holds only the base and function-tool
  classes; the ``SearchTool`` of earlier verl releases is gone), so the tool config names `SearchTool` below,
  a native verl tool that queries our service through `HttpRetrievalClient` (``POST /retrieve`` with
  ``{"queries", "topk", "return_scores": true}``, the request verl's former search tool sent) and returns
  Search-R1's ``<information>Doc 1(Title: ...) ...</information>`` text (`SearchR1Dialect.format_observation`);
* **reward**: ``reward.custom_reward_function`` = ``agent/rewards/verl.py`` (absolute path), ``compute_score``,
  ``reward_kwargs`` = ``{"reward": rl.reward, **rl.reward_options}``;
* **checkpoints**: ``checkpoint.save_contents`` includes ``hf_model``, so every save holds a Hugging Face folder at
  ``checkpoints/global_step_N/actor/huggingface`` (no model-merger step; it costs one extra copy of the weights
  per save). verl saves on the last step whenever ``save_freq > 0`` and writes
  ``checkpoints/latest_checkpointed_iteration.txt`` after the save; `wait_for_checkpoint` waits for that file
  to name the final step and for the folder to hold a config and weights.

**Known mismatch**: verl's tool loop parses hermes ``<tool_call>{"name": "search", "arguments": {"query_list":
[...]}}</tool_call>`` and renders the tool's answer with the chat template's tool role, while our Search-R1
prompt asks for ``<search> query </search>``. The chat template (e.g. Qwen2.5's) adds the tool-call instructions
from the tool schema; a policy that keeps writing ``<search>`` tags gets no retrieval on verl. The Search-R1
rewards that check the tag sequence (``search_r1_format``, ``search_r1_retrieval``) read ``<information>`` blocks,
which the tool's text keeps, but not ``<search>`` tags; ``search_r1_em`` scores the last ``<answer>`` only.

RLConfig fields without a verl counterpart (refused when they differ from what verl does, else ignored):
``whiten_advantages`` (verl always whitens GAE advantages; False is refused), ``value_clip`` None (verl always
clips; refused), ``dynamic_sampling`` / ``dynamic_sampling_max_batches`` (not in ``verl.trainer.main_ppo``; True is
refused), ``env.dialect`` other than ``search_r1`` (refused), ``env.max_new_tokens_per_turn`` (verl bounds the
whole response, ``VerlSettings.max_response_length``), ``env.max_context_tokens`` (verl: max_prompt_length +
max_response_length), ``env.seed``, ``env.store_token_ids``, ``logprob_chunk_size``, ``generation_batch_size``,
``progress``, ``report_to``, ``limit``, ``qa`` and ``retrieval`` (the loop passes the questions and the service
URL), ``out`` (the run folder is `prepare_verl_run`'s ``out_dir``), ``agent`` (the loop passes ``init_model``;
verl picks device and precision itself).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from uuid import uuid4

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

import agent.rewards.verl as verl_rewards
from agent.dialects.search_r1 import SearchR1Dialect
from agent.qa_data import QARow, read_qa_rows
from agent.rl.config import RLConfig
from agentic_retriever.client import HttpRetrievalClient
from agentic_retriever.jsonl import atomic_write

__all__ = ["SearchTool", "VerlRun", "VerlSettings", "finished_checkpoint", "prepare_verl_run", "search_tool_config",
           "start_verl_run", "verl_overrides", "write_verl_parquet",
           "wait_for_checkpoint"]

DATA_SOURCE = "agentic_retriever"
TOOL_NAME = "search"
CHARS_PER_TOKEN = 4  # verl cuts tool responses by characters; our observation cut is in tokens
REWARD_FILE = Path(verl_rewards.__file__).resolve()


@dataclass
class VerlSettings:
    """The ``verl`` section of the loop's config: the launch details of a verl run that `RLConfig` does not hold."""

    n_gpus_per_node: int = field(default=8, metadata={"help": "GPUs per node (trainer.n_gpus_per_node)"})
    nnodes: int = field(default=1, metadata={"help": "nodes (trainer.nnodes)"})
    rollout_engine: Literal["vllm", "sglang"] = field(default="vllm", metadata={
        "help": "rollout engine (actor_rollout_ref.rollout.name)"})
    tensor_parallel_size: int = field(default=1, metadata={
        "help": "tensor parallel size of the rollout engine (actor_rollout_ref.rollout.tensor_model_parallel_size)"})
    gpu_memory_utilization: float = field(default=0.5, metadata={
        "help": "share of GPU memory the rollout engine takes (actor_rollout_ref.rollout.gpu_memory_utilization)"})
    total_training_steps: int | None = field(default=None, metadata={
        "help": "PPO steps (trainer.total_training_steps; None: the agent step's RLConfig.steps)"})
    save_freq: int | None = field(default=None, metadata={
        "help": "checkpoint every N steps, and always on the last (trainer.save_freq; None: RLConfig.save_steps)"})
    test_freq: int = field(default=-1, metadata={"help": "validate every N steps (trainer.test_freq; -1: never)"})
    max_prompt_length: int = field(default=1024, metadata={"help": "prompt token budget (data.max_prompt_length)"})
    max_response_length: int = field(default=3072, metadata={
        "help": "token budget of all turns, tool answers included (data.max_response_length)"})
    launcher: str = field(default="python3", metadata={
        "help": "the python executable or launcher prefix that runs `-m verl.trainer.main_ppo` (split like a shell)"})
    overrides: list[str] = field(default_factory=list, metadata={
        "help": "extra Hydra overrides, appended last (they win over the generated ones)"})
    launch: bool = field(default=False, metadata={
        "help": "start launch.sh from the loop (log in verl.log); false: write it and wait for the user to run it"})
    poll_seconds: float = field(default=30.0, metadata={"help": "seconds between checks for the final checkpoint"})
    timeout_seconds: float = field(default=7 * 24 * 3600.0, metadata={
        "help": "give up waiting for the final checkpoint after this many seconds"})

    def __post_init__(self):
        for name in ("n_gpus_per_node", "nnodes", "tensor_parallel_size", "max_prompt_length", "max_response_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"VerlSettings.{name} must be at least 1, got {getattr(self, name)}")
        if self.rollout_engine not in ("vllm", "sglang"):
            raise ValueError(f"VerlSettings.rollout_engine must be vllm or sglang, got {self.rollout_engine!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"VerlSettings.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("total_training_steps", "save_freq"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"VerlSettings.{name} must be None or at least 1 (the loop picks up the final "
                                 f"checkpoint), got {getattr(self, name)}")
        if self.poll_seconds <= 0 or self.timeout_seconds <= 0:
            raise ValueError("VerlSettings.poll_seconds and timeout_seconds must be positive")
        if not shlex.split(self.launcher):
            raise ValueError("VerlSettings.launcher is empty: give the python executable, e.g. python3")


@dataclass(frozen=True)
class VerlRun:
    """What `prepare_verl_run` wrote: the run folder, the command, its script, its log and where checkpoints go."""

    out_dir: Path
    command: list[str]
    launch_script: Path
    log_path: Path
    checkpoint_root: Path
    final_step: int


# ------------------------------------------------------------------------------------------------ settings map

def _kl_overrides(rl: RLConfig) -> dict[str, Any]:
    """The KL to the reference: in the reward (algorithm.*) or in the actor's loss (actor.*), or none."""
    use = rl.uses_reference
    return {
        "algorithm.use_kl_in_reward": use and rl.kl_in_reward,    # kl_placement reward: -coef * KL in the reward
        "algorithm.kl_penalty": rl.kl_kind,                       # kl_estimator (verl: kl|k1, mse|k2, low_var_kl|k3)
        "algorithm.kl_ctrl.kl_coef": rl.kl_coef,                  # kl_coef, fixed controller
        "actor_rollout_ref.actor.use_kl_loss": use and not rl.kl_in_reward,  # kl_placement loss
        "actor_rollout_ref.actor.kl_loss_coef": rl.kl_coef,       # kl_coef
        "actor_rollout_ref.actor.kl_loss_type": rl.kl_kind,       # kl_estimator
    }


def _check_mappable(rl: RLConfig) -> None:
    """Refuse RLConfig settings verl's PPO trainer cannot honour (module docstring, "without a verl counterpart")."""
    refused = {
        "whiten_advantages=False": rl.uses_critic and not rl.whiten_advantages,
        "value_clip=None": rl.uses_critic and rl.value_clip is None,
        "dynamic_sampling=True": rl.dynamic_sampling,
        f"env.dialect={rl.env.dialect}": rl.env.dialect != "search_r1",
    }
    bad = [name for name, is_bad in refused.items() if is_bad]
    if bad:
        raise ValueError(f"RLConfig settings verl's main_ppo cannot run: {', '.join(bad)} (agentic_retriever/loop/verl.py)")
    sequences = rl.mini_batch_size or rl.prompts_per_step * rl.samples_per_prompt
    if sequences % rl.samples_per_prompt:
        raise ValueError(f"RLConfig.mini_batch_size ({rl.mini_batch_size} sequences) must be a multiple of "
                         f"samples_per_prompt ({rl.samples_per_prompt}): verl counts mini-batches in prompts")


def _rl_overrides(rl: RLConfig) -> dict[str, Any]:
    """Our RLConfig onto verl's names, one entry per setting (comment: our field)."""
    mini_prompts = (rl.mini_batch_size or rl.prompts_per_step * rl.samples_per_prompt) // rl.samples_per_prompt
    actor, critic = "actor_rollout_ref.actor", "critic"
    return {
        "algorithm.adv_estimator": "gae" if rl.uses_critic else "grpo",  # algorithm (ppo: GAE + critic)
        "algorithm.gamma": rl.gamma,                                     # gamma
        "algorithm.lam": rl.lam,                                         # lam
        "algorithm.norm_adv_by_std_in_grpo": rl.grpo_normalize_std,      # grpo_normalize_std
        "data.train_batch_size": rl.prompts_per_step,                    # prompts_per_step
        "data.seed": rl.seed,                                            # seed (question order)
        "actor_rollout_ref.rollout.n": rl.samples_per_prompt,            # samples_per_prompt
        f"{actor}.ppo_mini_batch_size": mini_prompts,                    # mini_batch_size (verl: in prompts)
        f"{actor}.ppo_micro_batch_size_per_gpu": rl.micro_batch_size,    # micro_batch_size
        f"{critic}.ppo_micro_batch_size_per_gpu": rl.micro_batch_size,   # micro_batch_size
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": rl.micro_batch_size,  # micro_batch_size
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": rl.micro_batch_size,      # micro_batch_size
        f"{actor}.ppo_epochs": rl.ppo_epochs,                            # ppo_epochs (critic follows)
        f"{actor}.optim.lr": rl.actor_lr,                                # actor_lr
        f"{critic}.optim.lr": rl.critic_lr,                              # critic_lr
        f"{actor}.optim.lr_warmup_steps": rl.warmup_steps,               # warmup_steps
        f"{critic}.optim.lr_warmup_steps": rl.warmup_steps,              # warmup_steps
        f"{actor}.optim.weight_decay": rl.weight_decay,                  # weight_decay
        f"{critic}.optim.weight_decay": rl.weight_decay,                 # weight_decay
        f"{actor}.grad_clip": rl.grad_clip,                              # grad_clip
        f"{critic}.grad_clip": rl.grad_clip,                             # grad_clip
        f"{actor}.clip_ratio_low": rl.clip_low,                          # clip_low
        f"{actor}.clip_ratio_high": rl.clip_high,                        # clip_high
        f"{critic}.cliprange_value": rl.value_clip if rl.value_clip is not None else 0.5,  # value_clip
        f"{actor}.loss_agg_mode": rl.loss_aggregation,                   # loss_aggregation (same names)
        f"{actor}.entropy_coeff": rl.entropy_coef,                       # entropy_coef
        **_kl_overrides(rl),                                             # kl_coef, kl_placement, kl_estimator
        "actor_rollout_ref.model.lora_rank": rl.lora_r if rl.lora else 0,  # lora, lora_r (0: no LoRA)
        "actor_rollout_ref.model.lora_alpha": rl.lora_alpha,             # lora_alpha
        "actor_rollout_ref.model.enable_gradient_checkpointing": rl.gradient_checkpointing,  # gradient_checkpointing
        f"{critic}.model.enable_gradient_checkpointing": rl.gradient_checkpointing,         # gradient_checkpointing
        "actor_rollout_ref.rollout.temperature": rl.env.temperature,     # env.temperature
        "actor_rollout_ref.rollout.top_p": rl.env.top_p,                 # env.top_p
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": rl.env.max_turns + 1,  # env.max_turns + the last
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": rl.env.max_turns,           # env.max_turns (searches)
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length":                   # env.observation_max_tokens
            rl.env.observation_max_tokens * CHARS_PER_TOKEN,
        "reward.custom_reward_function.name": "compute_score",           # reward (by the reward_kwargs below)
        "+reward.custom_reward_function.reward_kwargs.reward": rl.reward,  # reward
        **{f"+reward.custom_reward_function.reward_kwargs.{k}": v for k, v in rl.reward_options.items()},  # reward_options
    }


def _run_overrides(settings: VerlSettings, rl: RLConfig, out_dir: Path, init_model: str) -> dict[str, Any]:
    """The launch, data, model, tool, reward-file and checkpoint settings of one run."""
    rollout, turn = "actor_rollout_ref.rollout", "actor_rollout_ref.rollout.multi_turn"
    return {
        "data.train_files": str(out_dir / "train.parquet"),
        "data.val_files": str(out_dir / "val.parquet"),
        "data.max_prompt_length": settings.max_prompt_length,
        "data.max_response_length": settings.max_response_length,
        "data.return_raw_chat": True,
        "data.truncation": "error",
        "actor_rollout_ref.model.path": init_model,
        "critic.model.path": rl.critic_model or init_model,
        f"{rollout}.name": settings.rollout_engine,
        f"{rollout}.mode": "async",
        f"{rollout}.tensor_model_parallel_size": settings.tensor_parallel_size,
        f"{rollout}.gpu_memory_utilization": settings.gpu_memory_utilization,
        f"{rollout}.agent.default_agent_loop": "tool_agent",
        f"{turn}.enable": True,
        f"{turn}.format": "hermes",
        f"{turn}.tool_config_path": str(out_dir / "search_tool.yaml"),
        f"{turn}.tool_response_truncate_side": "right",
        "reward.custom_reward_function.path": str(REWARD_FILE),
        "actor_rollout_ref.actor.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
        "trainer.default_local_dir": str(out_dir / "checkpoints"),
        "trainer.n_gpus_per_node": settings.n_gpus_per_node,
        "trainer.nnodes": settings.nnodes,
        "trainer.total_training_steps": _final_step(settings, rl),
        "trainer.save_freq": settings.save_freq or rl.save_steps,
        "trainer.test_freq": settings.test_freq,
        "trainer.resume_mode": "auto",
        "trainer.project_name": "agentic_retriever",
        "trainer.experiment_name": out_dir.name,
        "trainer.logger": ["console"],
    }


def _final_step(settings: VerlSettings, rl: RLConfig) -> int:
    return settings.total_training_steps or rl.steps


_PLAIN = re.compile(r"[A-Za-z0-9_./:~@%+-]+")


def _hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: lists as [a,b], booleans as true/false, odd strings single-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def verl_overrides(settings: VerlSettings, rl: RLConfig, out_dir: str | os.PathLike, init_model: str) -> list[str]:
    """verl's Hydra overrides for the run in `out_dir`: ours, then ``settings.overrides`` (last wins)."""
    _check_mappable(rl)
    merged = {**_rl_overrides(rl), **_run_overrides(settings, rl, Path(out_dir).resolve(), init_model)}
    return [f"{key}={_hydra_value(value)}" for key, value in merged.items()] + list(settings.overrides)


# ------------------------------------------------------------------------------------------------ written files

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


def search_tool_config(service_url: str, topk: int) -> dict[str, Any]:
    """verl's native-tool config (``multi_turn.tool_config_path``): `SearchTool` at our service."""
    return {"tools": [{
        "class_name": f"{__name__}.SearchTool",
        "config": {"type": "native", "retrieval_service_url": service_url, "topk": topk, "timeout": 60},
        "tool_schema": {"type": "function", "function": {
            "name": TOOL_NAME,
            "description": "Searches the knowledge corpus for passages relevant to each query.",
            "parameters": {"type": "object", "required": ["query_list"], "properties": {
                "query_list": {"type": "array", "description": "the search queries"}}}}},
    }]}


def _write_text(path: Path, text: str, executable: bool = False) -> None:
    with atomic_write(path) as handle:
        handle.write(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _launch_script(command: list[str], out_dir: Path) -> str:
    lines = " \\\n    ".join(shlex.quote(part) for part in command)
    return (f"#!/usr/bin/env bash\n# verl run of the co-training loop's agent step (agentic_retriever/loop/verl.py)\n"
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
    return VerlRun(out, command, out / "launch.sh", out / "verl.log", out / "checkpoints", _final_step(settings, rl))


# ------------------------------------------------------------------------------------------------ run and pick up

def start_verl_run(run: VerlRun) -> subprocess.Popen:
    """Start ``run.launch_script`` in its own process group, stdout and stderr appended to ``run.log_path``."""
    with open(run.log_path, "ab") as log:
        return subprocess.Popen(["bash", str(run.launch_script)], cwd=run.out_dir, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _log_tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"(no log at {path})"
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def finished_checkpoint(run: VerlRun) -> Path | None:
    """The Hugging Face folder of the final step's checkpoint when verl has finished writing it, else None."""
    marker = run.checkpoint_root / "latest_checkpointed_iteration.txt"
    try:
        step = int(marker.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    folder = run.checkpoint_root / f"global_step_{step}" / "actor" / "huggingface"
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    if step < run.final_step or not (folder / "config.json").is_file() or not has_weights:
        return None
    return folder


def wait_for_checkpoint(run: VerlRun, settings: VerlSettings, process: subprocess.Popen | None = None) -> Path:
    """Wait until verl's final checkpoint is complete and return its Hugging Face model folder.

    Complete: ``checkpoints/latest_checkpointed_iteration.txt`` names a step >= ``run.final_step`` (verl writes it
    after the save) and ``global_step_N/actor/huggingface`` holds ``config.json`` and weights (``hf_model`` is in
    ``checkpoint.save_contents``), which `agentic_retriever.llm` loads as ``LLMConfig(model=folder)``. With the
    `process` of `start_verl_run`, a non-zero exit fails at once with the log's tail; an exit 0 without the
    checkpoint fails too. Polls every ``settings.poll_seconds``; TimeoutError after ``settings.timeout_seconds``.
    """
    deadline = time.monotonic() + settings.timeout_seconds
    while (folder := finished_checkpoint(run)) is None:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"verl exited with status {process.returncode} before writing the final checkpoint "
                               f"(step {run.final_step}) under {run.checkpoint_root}; last lines of "
                               f"{run.log_path}:\n{_log_tail(run.log_path)}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no complete verl checkpoint of step {run.final_step} under {run.checkpoint_root} "
                               f"after {settings.timeout_seconds:g} s (expected global_step_{run.final_step}/actor/"
                               f"huggingface and latest_checkpointed_iteration.txt); run: bash {run.launch_script}")
        time.sleep(min(settings.poll_seconds, max(deadline - time.monotonic(), 0.0)))
    return folder


# ------------------------------------------------------------------------------------------------ verl's tool

class SearchTool:
    """A native verl tool (``verl.tools.base_tool.BaseTool``'s interface) searching our retrieval service.

    verl builds it from `search_tool_config`: ``config`` holds ``retrieval_service_url``, ``topk`` and ``timeout``;
    ``tool_schema`` is verl's ``OpenAIFunctionToolSchema``. The model calls it with ``{"query_list": [...]}``; the
    answer is Search-R1's observation of all passages (`SearchR1Dialect.format_observation`). Each instance keeps
    the row's question (its ``create_kwargs``) and sends it along with every query, so a service serving an
    Agentic-R retriever searches with ``Q [SEP] q``, as our own environment does. verl is imported only inside
    `create` and `execute`, which run in verl's workers, so this module imports without it.
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any):
        self.config, self.tool_schema = config, tool_schema
        self.name = tool_schema.function.name
        self.topk = int(config.get("topk", 3))
        self._client = HttpRetrievalClient(config["retrieval_service_url"], timeout=float(config.get("timeout", 60)))
        self._questions: dict[str, str | None] = {}

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema

    def search(self, query_list: list[str] | str, question: str | None = None) -> str:
        """The Search-R1 ``<information>`` text of the top-k passages of every query (`question`: the agent's
        question, for retrievers that compose ``Q [SEP] q``)."""
        queries = [query_list] if isinstance(query_list, str) else [str(q) for q in query_list]
        queries = [q.strip() for q in queries if q and q.strip()]
        if not queries:
            return "No search query given: call search with a non-empty query_list."
        return SearchR1Dialect().format_observation(
            self._client.retrieve(queries, self.topk, questions=[question] * len(queries) if question else None))

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        from verl.tools.schemas import ToolResponse

        instance_id = instance_id or str(uuid4())
        self._questions[instance_id] = kwargs.get("question")
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[Any, float, dict]:
        from verl.tools.schemas import ToolResponse

        text = await asyncio.to_thread(self.search, parameters.get("query_list", []), self._questions.get(instance_id))
        return ToolResponse(text=text), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._questions.pop(instance_id, None)
