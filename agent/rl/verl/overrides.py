"""Our `RLConfig` and `VerlSettings` as verl's Hydra overrides of ``verl.trainer.main_ppo`` (`verl_overrides`).

**trainer path**: ``trainer.use_v1=true`` and ``trainer.v1.trainer_mode=sync``, pinned: verl 0.9.1's default V1
trainer (``TaskRunnerV1``, its agent-loop worker ``AgentLoopWorkerTQ`` handing trajectories over through
TransferQueue, which our ``verl`` extra installs), synchronous and so on-policy like Search-R1's PPO; the path the
agent-loop tests drive (tests/agent/rl/verl/test_verl_agent_loop.py). ``trainer.total_epochs`` is derived from the
training rows (`epochs_for_steps`), so verl's epoch limit never stops the run before ``total_training_steps``.

**sizes** (`per_gpu_micro_batches`): verl 0.9 takes micro-batches per GPU; ours are global, all GPUs together, as
Search-R1's old verl took them (``train_ppo.sh``: actor 64, log-prob 128, critic 8 over 8 GPUs, so 8, 16 and 1 per
GPU). They are divided by ``n_gpus_per_node x nnodes`` here and nowhere else; a size that does not divide, or a
per-GPU micro-batch that does not divide the per-GPU mini-batch, is refused. ``ppo_mini_batch_size`` and
``train_batch_size`` stay global: verl counts both in prompts and divides them itself.

**reward**: ``reward.custom_reward_function`` = ``agent/rl/verl/reward.py`` (absolute path, `REWARD_FILE`),
``compute_score``, ``reward_kwargs`` = ``{"reward": rl.reward, **rl.reward_options}``.

**agent loop** (`VerlSettings.agent_loop`): ``dialect`` points ``rollout.agent.agent_loop_config_path`` at the run's
``agent_loop.yaml`` (our `DialectAgentLoop`, with ``env.dialect``, ``env.max_turns``, ``env.topk``,
``env.max_new_tokens_per_turn``, ``env.observation_max_tokens``, ``env.max_context_tokens`` and the service URL);
``tool_agent`` sets verl's hermes tool loop as `SearchToolAgentLoop` (in the same file: a failed search fails the
trajectory) with ``multi_turn``: ``env.max_turns`` as its turn limits, ``env.observation_max_tokens`` x 4
characters as its tool-answer cut, ``search_tool.yaml``.

RLConfig fields without a verl counterpart (refused when they differ from what verl does, else ignored):
``whiten_advantages`` (verl always whitens GAE advantages; False is refused), ``value_clip`` None (verl always
clips; refused), ``dynamic_sampling`` / ``dynamic_sampling_max_batches`` (not in ``verl.trainer.main_ppo``; True is
refused), a ``reward`` that is not a response reward or a ``stage2`` reward (verl's custom reward function sees the
decoded response and the golden answers only, one reward for the run: refused; docs/verl.md), ``env.dialect`` other
than ``search_r1`` with the ``tool_agent`` loop (refused), ``env.seed`` and ``env.temperature``/``top_p`` beyond
verl's sampling, ``env.store_token_ids``, ``logprob_chunk_size``, ``generation_batch_size``, ``progress``,
``report_to``, ``limit``, ``qa`` and ``retrieval`` (the loop passes the questions and the service URL), ``out`` (the
run folder is `prepare_verl_run`'s ``out_dir``), ``agent`` (the loop passes ``init_model``; verl picks device and
precision itself).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import agent.rl.verl.reward as verl_rewards
from agent.rl.config import RLConfig

from .cpu import cpu_overrides
from .settings import VerlSettings

CHARS_PER_TOKEN = 4  # verl cuts tool responses by characters; our observation cut is in tokens
REWARD_FILE = Path(verl_rewards.__file__).resolve()
AGENT_LOOP_NAME = "agentic_retriever_agent"  # the name `agent_loop.DialectAgentLoop` is registered under
TOOL_AGENT_LOOP_NAME = "agentic_retriever_tool_agent"  # `agent_loop.SearchToolAgentLoop`: verl's tool loop, ours
AGENT_LOOP_FILE = "agent_loop.yaml"          # verl's agent-loop config file in the run folder
TOOL_FILE = "search_tool.yaml"               # verl's tool config file (agent_loop tool_agent)


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


def check_mappable(settings: VerlSettings, rl: RLConfig) -> None:
    """Refuse RLConfig settings verl's PPO trainer cannot honour (module docstring, "without a verl counterpart")
    and sizes that do not divide over the GPUs (`per_gpu_micro_batches`)."""
    refused = {
        "whiten_advantages=False": rl.uses_critic and not rl.whiten_advantages,
        "value_clip=None": rl.uses_critic and rl.value_clip is None,
        "dynamic_sampling=True": rl.dynamic_sampling,
        f"reward={rl.reward} (not a response reward; docs/verl.md)": rl.reward not in verl_rewards.VERL_REWARDS,
        f"stage2.reward={rl.stage2.reward} (one reward per verl run)": bool(rl.stage2.reward),
        f"env.dialect={rl.env.dialect} with agent_loop tool_agent (hermes tool calls; use agent_loop dialect)":
            settings.agent_loop == "tool_agent" and rl.env.dialect != "search_r1",
        f"env.max_new_tokens_per_turn={rl.env.max_new_tokens_per_turn} > verl.max_response_length="
        f"{settings.max_response_length}": rl.env.max_new_tokens_per_turn > settings.max_response_length,
        f"warmup_steps={rl.warmup_steps} with verl.actor_warmup_ratio or critic_warmup_ratio (give one)":
            rl.warmup_steps > 0 and (settings.actor_warmup_ratio > 0 or settings.critic_warmup_ratio > 0),
    }
    bad = [name for name, is_bad in refused.items() if is_bad]
    if bad:
        raise ValueError(f"RLConfig settings verl's main_ppo cannot run: {', '.join(bad)} "
                         "(agent/rl/verl/overrides.py)")
    sequences = rl.mini_batch_size or rl.prompts_per_step * rl.samples_per_prompt
    if sequences % rl.samples_per_prompt:
        raise ValueError(f"RLConfig.mini_batch_size ({rl.mini_batch_size} sequences) must be a multiple of "
                         f"samples_per_prompt ({rl.samples_per_prompt}): verl counts mini-batches in prompts")
    per_gpu_micro_batches(settings, rl)


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
        f"{actor}.ppo_epochs": rl.ppo_epochs,                            # ppo_epochs (critic follows)
        f"{actor}.optim.lr": rl.actor_lr,                                # actor_lr
        f"{critic}.optim.lr": rl.critic_lr,                              # critic_lr
        f"{actor}.optim.lr_warmup_steps": rl.warmup_steps,               # warmup_steps (0: verl's ratio below)
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
        "reward.custom_reward_function.name": "compute_score",           # reward (by the reward_kwargs below)
        "+reward.custom_reward_function.reward_kwargs.reward": rl.reward,  # reward
        **{f"+reward.custom_reward_function.reward_kwargs.{k}": v for k, v in rl.reward_options.items()},  # reward_options
    }


def _gpu_count(settings: VerlSettings) -> int:
    """The GPUs of the run, over which verl splits every global size: ``n_gpus_per_node x nnodes``."""
    return settings.n_gpus_per_node * settings.nnodes


def _per_gpu(size: int, name: str, gpus: int) -> int:
    if size % gpus:
        raise ValueError(f"{name}={size} counts sequences over all GPUs and must divide over n_gpus_per_node x nnodes "
                         f"= {gpus} GPUs (verl takes it per GPU): give a multiple of {gpus}")
    return size // gpus


def per_gpu_micro_batches(settings: VerlSettings, rl: RLConfig) -> dict[str, int]:
    """The global micro-batch sizes per GPU, as verl 0.9 takes them: ``actor`` (``agent_train.micro_batch_size``),
    ``log_prob`` (``verl.log_prob_micro_batch_size``, the rollout's and the reference's log-prob passes) and
    ``critic`` (``verl.critic_micro_batch_size``); each falls back to ``agent_train.micro_batch_size``.

    Refuses a step, mini-batch or micro-batch that does not divide over the GPUs, and a per-GPU micro-batch of the
    actor or critic that does not divide the per-GPU mini-batch (verl would fail in its workers)."""
    gpus = _gpu_count(settings)
    sequences = rl.prompts_per_step * rl.samples_per_prompt
    _per_gpu(sequences, "agent_train.prompts_per_step x samples_per_prompt", gpus)
    mini = _per_gpu(rl.mini_batch_size or sequences, "agent_train.mini_batch_size", gpus)
    sizes = {"actor": _per_gpu(rl.micro_batch_size, "agent_train.micro_batch_size", gpus)}
    for role, own in (("log_prob", settings.log_prob_micro_batch_size), ("critic", settings.critic_micro_batch_size)):
        name = f"verl.{role}_micro_batch_size" if own is not None else "agent_train.micro_batch_size"
        sizes[role] = _per_gpu(own if own is not None else rl.micro_batch_size, name, gpus)
    for role in ("actor", "critic") if rl.uses_critic else ("actor",):
        if mini % sizes[role]:
            raise ValueError(f"the {role}'s micro-batch of {sizes[role]} sequences per GPU does not divide its "
                             f"mini-batch of {mini} per GPU (agent_train.mini_batch_size over {gpus} GPUs)")
    return sizes


def _size_overrides(settings: VerlSettings, rl: RLConfig) -> dict[str, Any]:
    """Micro-batches per GPU (`per_gpu_micro_batches`), FSDP offload and the learning-rate warm-up ratios."""
    sizes, actor, ref, critic = (per_gpu_micro_batches(settings, rl), "actor_rollout_ref.actor",
                                 "actor_rollout_ref.ref", "critic")
    return {
        f"{actor}.ppo_micro_batch_size_per_gpu": sizes["actor"],                           # micro_batch_size / GPUs
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": sizes["log_prob"],  # log_prob_micro_batch_size
        f"{ref}.log_prob_micro_batch_size_per_gpu": sizes["log_prob"],                     # log_prob_micro_batch_size
        f"{critic}.ppo_micro_batch_size_per_gpu": sizes["critic"],                         # critic_micro_batch_size
        f"{actor}.fsdp_config.param_offload": settings.param_offload,                      # param_offload
        f"{ref}.fsdp_config.param_offload": settings.param_offload,                        # param_offload
        f"{critic}.fsdp.param_offload": settings.param_offload,                             # param_offload
        f"{actor}.fsdp_config.optimizer_offload": settings.optimizer_offload,              # optimizer_offload
        f"{critic}.fsdp.optimizer_offload": settings.optimizer_offload,                     # optimizer_offload
        f"{actor}.optim.lr_warmup_steps_ratio": settings.actor_warmup_ratio,               # actor_warmup_ratio
        f"{critic}.optim.lr_warmup_steps_ratio": settings.critic_warmup_ratio,             # critic_warmup_ratio
    }


def epochs_for_steps(train_rows: int, prompts_per_step: int, steps: int) -> int:
    """verl's ``trainer.total_epochs`` for `steps` steps of `prompts_per_step` questions over `train_rows` rows.

    verl's V1 loop runs ``while epoch < total_epochs and step <= total_training_steps`` with ``len(train) //
    train_batch_size`` steps an epoch (the last partial batch dropped); its default of 30 epochs would end a run on
    a small question set before its last step, and so before the checkpoint the loop waits for."""
    per_epoch = train_rows // prompts_per_step
    if per_epoch < 1:
        raise ValueError(f"{train_rows} training questions do not fill one step of {prompts_per_step} "
                         "(agent_train.prompts_per_step; verl drops the last partial batch)")
    return -(-steps // per_epoch)


def _run_overrides(settings: VerlSettings, rl: RLConfig, out_dir: Path, init_model: str,
                   train_rows: int) -> dict[str, Any]:
    """The launch, data, model, tool, reward-file and checkpoint settings of one run."""
    rollout, turn = "actor_rollout_ref.rollout", "actor_rollout_ref.rollout.multi_turn"
    return {
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": "sync",
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
        f"{turn}.enable": True,
        f"{rollout}.agent.default_agent_loop": TOOL_AGENT_LOOP_NAME if settings.agent_loop == "tool_agent"
        else AGENT_LOOP_NAME,
        f"{rollout}.agent.agent_loop_config_path": str(out_dir / AGENT_LOOP_FILE),
        **(_tool_agent_overrides(rl, out_dir) if settings.agent_loop == "tool_agent" else {}),
        "reward.custom_reward_function.path": str(REWARD_FILE),
        "actor_rollout_ref.actor.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
        "trainer.default_local_dir": str(out_dir / "checkpoints"),
        "trainer.n_gpus_per_node": settings.n_gpus_per_node,
        "trainer.nnodes": settings.nnodes,
        "trainer.total_training_steps": final_step(settings, rl),
        "trainer.total_epochs": epochs_for_steps(train_rows, rl.prompts_per_step, final_step(settings, rl)),
        "trainer.save_freq": settings.save_freq or rl.save_steps,
        "trainer.max_actor_ckpt_to_keep": settings.keep_checkpoints,
        "trainer.max_critic_ckpt_to_keep": settings.keep_checkpoints,
        "trainer.test_freq": settings.test_freq,
        "trainer.resume_mode": "auto",
        "trainer.project_name": "agentic_retriever",
        "trainer.experiment_name": out_dir.name,
        "trainer.logger": ["console"],
    }


def _tool_agent_overrides(rl: RLConfig, out_dir: Path) -> dict[str, Any]:
    """verl's hermes tool loop with our search tool (``agent_loop: tool_agent``)."""
    turn = "actor_rollout_ref.rollout.multi_turn"
    return {
        f"{turn}.format": "hermes",
        f"{turn}.tool_config_path": str(out_dir / TOOL_FILE),
        f"{turn}.tool_response_truncate_side": "right",
        f"{turn}.max_assistant_turns": rl.env.max_turns + 1,                             # env.max_turns + the last
        f"{turn}.max_user_turns": rl.env.max_turns,                                      # env.max_turns (searches)
        f"{turn}.max_tool_response_length": rl.env.observation_max_tokens * CHARS_PER_TOKEN,  # observation_max_tokens
    }


def final_step(settings: VerlSettings, rl: RLConfig) -> int:
    """The step verl trains to (and saves last): ``settings.total_training_steps``, else ``rl.steps``."""
    return settings.total_training_steps or rl.steps


_PLAIN = re.compile(r"[A-Za-z0-9_./:~@%+-]+")


def _hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: lists as [a,b], dicts as {k:v}, booleans as true/false, odd strings
    single-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{_hydra_value(v)}" for key, v in value.items()) + "}"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def verl_overrides(settings: VerlSettings, rl: RLConfig, out_dir: str | os.PathLike, init_model: str,
                   train_rows: int) -> list[str]:
    """verl's Hydra overrides for the run in `out_dir` on `train_rows` training questions: ours, those of a CPU
    run (`cpu.cpu_overrides`, ``settings.device`` cpu), then ``settings.overrides`` (last wins)."""
    check_mappable(settings, rl)
    merged = {**_rl_overrides(rl), **_size_overrides(settings, rl),
              **_run_overrides(settings, rl, Path(out_dir).resolve(), init_model, train_rows),
              **(cpu_overrides(settings, rl.uses_critic) if settings.device == "cpu" else {})}
    return [f"{key}={_hydra_value(value)}" for key, value in merged.items()] + list(settings.overrides)
