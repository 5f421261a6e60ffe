"""The launch settings of a verl run (`VerlSettings`) and what `prepare_verl_run` wrote for one (`VerlRun`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass
class VerlSettings:
    """The ``verl`` section of the loop's config: the launch details of a verl run that `RLConfig` does not hold."""

    agent_loop: Literal["dialect", "tool_agent"] = field(default="dialect", metadata={
        "help": "dialect: our agent loop (agentic_retriever_agent), the agent_train.env dialect's prompt and actions, "
                "as our rollouts and mining read them; tool_agent: verl's hermes tool-calling loop with our search "
                "tool, for tool-calling models (its <tool_call> actions are not what the loop's rollouts read)"})
    val_questions: int = field(default=64, metadata={
        "help": "questions held out of the training questions for verl's validation (val.parquet); the dev "
                "questions never go to verl"})
    device: Literal["cuda", "cpu"] = field(default="cuda", metadata={
        "help": "cuda: verl's own platforms (GPUs); cpu: verl and vLLM's CPU build on the host's cores, through the "
                "cpu platform plugin and settings of agent/rl/verl/cpu.py (checks and dry runs; "
                "n_gpus_per_node then counts Ray's GPU labels, one per FSDP rank)"})
    cpu_kv_cache_gib: int = field(default=1, metadata={
        "help": "device cpu: GiB of host memory for vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)"})
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
    keep_checkpoints: int | None = field(default=None, metadata={
        "help": "checkpoints verl keeps of the actor and of the critic (trainer.max_actor_ckpt_to_keep and "
                "max_critic_ckpt_to_keep; the last one is the one the loop picks up; None: all, verl's default)"})
    test_freq: int = field(default=-1, metadata={"help": "validate every N steps (trainer.test_freq; -1: never)"})
    log_prob_micro_batch_size: int | None = field(default=None, metadata={
        "help": "sequences per log-prob forward pass (the rollout's old log-probs and the reference's), all GPUs "
                "together, as Search-R1's log_prob_micro_batch_size (128); verl gets it per GPU, divided by "
                "n_gpus_per_node x nnodes (None: agent_train.micro_batch_size)"})
    critic_micro_batch_size: int | None = field(default=None, metadata={
        "help": "sequences per critic forward/backward pass, all GPUs together, as Search-R1's "
                "critic.ppo_micro_batch_size (8); verl gets it per GPU (None: agent_train.micro_batch_size)"})
    param_offload: bool = field(default=False, metadata={
        "help": "FSDP: keep the parameters (and gradients) of actor, reference and critic on the CPU between "
                "uses (Search-R1: param_offload and grad_offload true)"})
    optimizer_offload: bool = field(default=False, metadata={
        "help": "FSDP: keep the optimizer states of actor and critic on the CPU (Search-R1: true)"})
    actor_warmup_ratio: float = field(default=0.0, metadata={
        "help": "share of the run's steps over which the actor's learning rate warms up linearly "
                "(actor.optim.lr_warmup_steps_ratio; Search-R1: 0.285); agent_train.warmup_steps > 0 instead counts "
                "steps, and the two cannot both be set"})
    critic_warmup_ratio: float = field(default=0.0, metadata={
        "help": "the same for the critic (critic.optim.lr_warmup_steps_ratio; Search-R1: 0.015)"})
    max_prompt_length: int = field(default=1024, metadata={
        "help": "prompt token budget (data.max_prompt_length; s3's prompt holds its first documents)"})
    max_response_length: int = field(default=3072, metadata={
        "help": "token budget of the whole response, every turn and observation included (data.max_response_length; "
                "per turn: agent_train.env.max_new_tokens_per_turn and observation_max_tokens)"})
    launcher: str = field(default="{python}", metadata={
        "help": "the python executable or launcher prefix that runs `-m verl.trainer.main_ppo` (split like a shell; "
                "{python}: the loop's own interpreter)"})
    overrides: list[str] = field(default_factory=list, metadata={
        "help": "extra Hydra overrides, appended last (they win over the generated ones)"})
    launch: bool = field(default=False, metadata={
        "help": "start launch.sh from the loop (log in verl.log); false: write it and wait for the user to run it"})
    replace_running: bool = field(default=False, metadata={
        "help": "a verl still running this run's launch.sh from before (a loop that was killed): false refuses to "
                "start another, true stops it first"})
    stand_in: bool = field(default=False, metadata={
        "help": "a dry run of a cluster config on one machine: write the run and have verl compose and validate it "
                "(validate_config at n_gpus_per_node x nnodes), then train this step with the embedded trainer on "
                "agent_train's settings instead of launching verl (needs verl and hydra-core installed)"})
    poll_seconds: float = field(default=30.0, metadata={"help": "seconds between checks for the final checkpoint"})
    timeout_seconds: float = field(default=7 * 24 * 3600.0, metadata={
        "help": "wall-clock limit of the run: launch.sh stops verl after this many seconds (a hung weight sync "
                "never ends on its own), and the loop gives up waiting for the final checkpoint"})

    def __post_init__(self):
        if self.agent_loop not in ("dialect", "tool_agent"):
            raise ValueError(f"VerlSettings.agent_loop must be dialect or tool_agent, got {self.agent_loop!r}")
        for name in ("val_questions", "n_gpus_per_node", "nnodes", "tensor_parallel_size", "max_prompt_length",
                     "max_response_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"VerlSettings.{name} must be at least 1, got {getattr(self, name)}")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"VerlSettings.device must be cuda or cpu, got {self.device!r}")
        if self.cpu_kv_cache_gib < 1:
            raise ValueError(f"VerlSettings.cpu_kv_cache_gib must be at least 1, got {self.cpu_kv_cache_gib}")
        if self.device == "cpu" and (self.rollout_engine != "vllm" or self.tensor_parallel_size != 1):
            raise ValueError("VerlSettings.device cpu runs vLLM's CPU build with tensor_parallel_size 1 (got "
                             f"rollout_engine {self.rollout_engine!r}, tensor_parallel_size {self.tensor_parallel_size})")
        if self.rollout_engine not in ("vllm", "sglang"):
            raise ValueError(f"VerlSettings.rollout_engine must be vllm or sglang, got {self.rollout_engine!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"VerlSettings.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("log_prob_micro_batch_size", "critic_micro_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"VerlSettings.{name} must be None or at least 1, got {getattr(self, name)}")
        for name in ("actor_warmup_ratio", "critic_warmup_ratio"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"VerlSettings.{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("total_training_steps", "save_freq", "keep_checkpoints"):
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
    total_epochs: int
