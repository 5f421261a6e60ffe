"""Settings of the embedded RL trainer (`agentic-retriever agent train`, the ``agent_train`` config section).

Defaults are the values of Search-R1's release (arXiv 2503.09516; docs/rl.md): clip 0.2, entropy 0.001, gradient clip
1.0, one epoch over each batch, KL 0.001; PPO with GAE gamma = lambda = 1, the k1 KL in the reward and a
value clip of 0.5; GRPO with the low-variance (k3) KL in the loss and (r - mean) / (std + 1e-6) advantages.
The s3 settings (`generator`, `judge`, `naive_rag_cache`, `keep_naive_rag_failures`, `drop_yes_no`) serve the Gain
Beyond RAG rewards ("s3: You Don't Need That Much Data to Train a Search Agent via RL", arXiv 2505.14146, sections
3.2 and 4.1; `agent.rl.batch_reward`) and are read only when `reward` names one.
`stage2` switches the reward after a number of steps (QAgent's two-stage training, "QAgent: A modular Search Agent
with Interactive Query Understanding", sections 3.3-3.4 and Appendix C: stage 2 after step 1120 of 1400;
`agent.rl.reward_schedule`); QAgent's stage-2 reward reads the `generator`'s answers too.
The multi-stage reward of "Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with
Reasoning Language Models" (``when_to_search_stage1`` then ``when_to_search_stage2``; `agent.rewards.when_to_search`)
reads the `judge`'s YES/NO verdicts (none: exact match) and embeds the search queries with `search_encoder`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.base.llm import LLMConfig

from ..env import EnvConfig
from ..rewards import KINDS, reward_entry
from .core import KLEstimator, LossAggregation

__all__ = ["RLConfig", "SecondStage"]


@dataclass
class SecondStage:
    """The reward of the steps after `after_step` finished steps (section ``agent_train.stage2``); an empty
    `reward` keeps `RLConfig.reward` for the whole run."""

    reward: str = field(default="", metadata={
        "help": "the reward after after_step steps, any name `reward` takes (empty: one reward for the whole run; "
                "QAgent: qagent_stage2)"})
    reward_options: dict[str, Any] = field(default_factory=dict, metadata={"help": "its options"})
    after_step: int | None = field(default=None, metadata={
        "help": "steps scored by `reward` before the switch: step after_step + 1 is the first of stage 2 "
                "(QAgent: 1120)"})


@dataclass
class RLConfig:
    RENAMED: ClassVar[dict[str, str]] = {"index": "retrieval.index", "url": "retrieval.url", "model": "agent.model",
                                         "device": "agent.device", "precision": "agent.precision"}

    # -------------------------------------------------------------------- data, retriever, output
    qa: str = field(default="", metadata={"help": "training questions (JSONL: id, question, golden_answers)",
                                          "required": True})
    limit: int | None = field(default=None, metadata={"help": "only the first N questions"})
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    out: str = field(default="", metadata={"help": "run folder: checkpoints, metrics, curves, the trained policy",
                                           "derive": "{workdir}/agent/rl"})
    # -------------------------------------------------------------------- models
    agent: LLMConfig = field(default_factory=LLMConfig, metadata={
        "help": "the initial policy: model, device, precision (bf16: forward passes under bfloat16 autocast, "
                "float32 master weights; auto: bf16 on a GPU that has it, else fp32)"})
    critic_model: str = field(default="", metadata={"help": "critic initialisation for PPO (empty: the policy's)"})
    lora: bool = field(default=False, metadata={"help": "train LoRA adapters (peft); the reference is the base"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations to save memory"})
    # -------------------------------------------------------------------- algorithm
    algorithm: Literal["ppo", "grpo"] = field(default="grpo", metadata={
        "help": "ppo: GAE with a critic; grpo: group-normalised outcome over samples_per_prompt samples"})
    steps: int = field(default=20, metadata={"help": "RL steps (rollout + update) to run"})
    prompts_per_step: int = field(default=8, metadata={"help": "questions per step"})
    samples_per_prompt: int = field(default=5, metadata={"help": "rollouts per question (GRPO's group size n)"})
    mini_batch_size: int | None = field(default=None, metadata={
        "help": "sequences per optimiser update, all devices together (None: all of the step's)"})
    micro_batch_size: int = field(default=4, metadata={
        "help": "sequences per forward/backward pass, all devices together (Search-R1's ppo_micro_batch_size; on "
                "verl divided by n_gpus_per_node x nnodes into its *_micro_batch_size_per_gpu)"})
    logprob_chunk_size: int = field(default=1024, metadata={
        "help": "generated positions projected onto the vocabulary at a time in every log-prob pass (bounds the "
                "logits held at once to this many x vocabulary floats; agent.rl.logprobs)"})
    ppo_epochs: int = field(default=1, metadata={"help": "passes over each step's rollouts"})
    actor_lr: float = field(default=1e-6, metadata={"help": "policy learning rate"})
    critic_lr: float = field(default=1e-5, metadata={"help": "critic learning rate (PPO)"})
    warmup_steps: int = field(default=0, metadata={"help": "updates of linear learning-rate warm-up"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient norm clip (0: none)"})
    gamma: float = field(default=1.0, metadata={"help": "GAE discount"})
    lam: float = field(default=1.0, metadata={"help": "GAE lambda"})
    whiten_advantages: bool = field(default=True, metadata={"help": "PPO: whiten GAE advantages over the batch"})
    grpo_normalize_std: bool = field(default=True, metadata={"help": "GRPO: divide by the group's std"})
    clip_low: float = field(default=0.2, metadata={"help": "ratio clip below 1 (eps_low)"})
    clip_high: float = field(default=0.2, metadata={"help": "ratio clip above 1 (eps_high; DAPO: 0.28)"})
    value_clip: float | None = field(default=0.5, metadata={"help": "PPO value clip (none: unclipped)"})
    loss_aggregation: LossAggregation = field(default="token-mean", metadata={
        "help": "token-mean (DAPO), seq-mean-token-mean (GRPO paper) or seq-mean-token-sum"})
    entropy_coef: float = field(default=0.001, metadata={"help": "entropy bonus weight"})
    kl_coef: float = field(default=0.001, metadata={"help": "KL-to-reference weight (0: no reference model)"})
    kl_placement: Literal["auto", "reward", "loss"] = field(default="auto", metadata={
        "help": "reward: -kl_coef * KL per token in the reward (PPO; GRPO: the sequence's summed KL comes off its "
                "score before group normalisation, as in verl); loss: added to the loss (GRPO); auto: by algorithm"})
    kl_estimator: Literal["auto", "k1", "k2", "k3", "low_var_kl"] = field(default="auto", metadata={
        "help": "auto: k1 in the reward, low_var_kl in the loss"})
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "DAPO: drop groups that teach nothing (dynamic_sampling_filter) and sample more prompts to refill "
                "the step"})
    dynamic_sampling_filter: Literal["correctness", "score"] = field(default="correctness", metadata={
        "help": "correctness: drop groups whose answers are all correct or all wrong (DAPO, Eq. 11); score: drop "
                "groups whose rewards are all equal (a continuous reward term keeps nearly every group)"})
    dynamic_sampling_max_batches: int = field(default=3, metadata={"help": "prompt batches tried per step"})
    # -------------------------------------------------------------------- reward and environment
    reward: str = field(default="search_r1_em", metadata={
        "help": "registered reward name: a response reward (agent.rewards), a gain scored by a frozen generator "
                "(s3_gbr, s3_gbr_paper: agent.rewards.gbr; they need generator.model and env.dialect s3) or a "
                "reward of a frozen generator's answer (qagent_stage2: agent.rewards.qagent; generator.model and "
                "env.dialect qagent) or a multi-stage when-to-search reward (when_to_search_stage1, "
                "when_to_search_stage2: agent.rewards.when_to_search; env.dialect reflect, judge and search_encoder); "
                "with stage2.reward set, the reward of the first stage.after_step steps"})
    reward_options: dict[str, Any] = field(default_factory=dict, metadata={"help": "the reward's options"})
    stage2: SecondStage = field(default_factory=SecondStage)
    generator: LLMConfig = field(default_factory=lambda: LLMConfig(model=""), metadata={
        "help": "the frozen generator of the s3 and QAgent stage-2 rewards, loaded once on its own (empty model: "
                "none; the searcher's base model only where named here, and never the trained policy)"})
    judge: LLMConfig = field(default_factory=lambda: LLMConfig(model=""), metadata={
        "help": "the judge of Generation Accuracy, asked on span-check failures (empty model: span check only), and "
                "of answer correctness in the when-to-search rewards, asked YES/NO on exact-match failures (empty "
                "model: exact match)"})
    search_encoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(model=""), metadata={
        "help": "when-to-search rewards: the encoder of the search queries whose mean pairwise cosine r_search "
                "charges (empty model: the retriever's own, an index folder opened in this process; the paper: "
                "Qwen3-Embedding)"})
    naive_rag_cache: str = field(default="", metadata={
        "help": "folder of the cached naive-RAG accuracies (the generator on the question's top-3 passages)",
        "derive": "{workdir}/naive_rag"})
    keep_naive_rag_failures: bool = field(default=True, metadata={
        "help": "s3 rewards: train only on questions whose naive-RAG accuracy is 0 (s3, section 4.1)"})
    drop_yes_no: bool = field(default=True, metadata={
        "help": "s3 rewards: drop yes/no and true/false questions (s3, section 4.1)"})
    env: EnvConfig = field(default_factory=lambda: EnvConfig(temperature=1.0))
    generation_batch_size: int = field(default=16, metadata={"help": "sequences generated together"})
    # -------------------------------------------------------------------- run
    save_steps: int = field(default=10, metadata={"help": "checkpoint every N steps (resume continues from the last)"})
    seed: int = field(default=0, metadata={"help": "seed of question order, sampling and initialisation"})
    progress: bool = field(default=True, metadata={"help": "progress bars"})
    report_to: list[str] = field(default_factory=lambda: ["auto"], metadata={
        "help": "where the step metrics also go (files in OUT/logs): auto (tensorboard when installed), "
                "tensorboard, wandb, none; metrics.jsonl and training_curves.png are always written"})

    def validate(self) -> None:
        """Raise ValueError on settings that cannot work together (the trainer calls it after every override)."""
        for name in ("steps", "prompts_per_step", "samples_per_prompt", "micro_batch_size", "logprob_chunk_size",
                     "ppo_epochs",
                     "save_steps", "generation_batch_size", "dynamic_sampling_max_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"RLConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ValueError(f"RLConfig.mini_batch_size must be at least 1, got {self.mini_batch_size}")
        if self.algorithm == "grpo" and self.samples_per_prompt < 2:
            raise ValueError("GRPO compares the samples of a prompt: samples_per_prompt must be at least 2")
        if self.dynamic_sampling_filter not in ("correctness", "score"):
            raise ValueError(f"dynamic_sampling_filter must be correctness or score, got {self.dynamic_sampling_filter!r}")
        if self.dynamic_sampling and self.samples_per_prompt < 2:
            raise ValueError("dynamic sampling drops groups of equal rewards: samples_per_prompt must be at least 2")
        if self.agent.backend != "transformers":
            raise ValueError(f"agent train trains with transformers; agent.backend {self.agent.backend!r} cannot be trained")
        if self.agent.precision == "fp16":
            raise ValueError("agent train runs in fp32 or under bf16 autocast; agent.precision fp16 is not supported")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError(f"clip_low must be in [0, 1) and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        self._validate_stages()
        for reward in map(reward_entry, self.rewards):  # what each reward needs, from its registry entry
            if "generator" in reward.needs and not self.generator.model:
                raise ValueError(f"reward {reward.name} scores the documents the searcher retrieved or selected with "
                                 "a frozen generator: set generator.model (--generator.model; e.g. the searcher's "
                                 "base model, loaded separately and frozen)")
            if reward.dialect is not None and self.env.dialect != reward.dialect:
                raise ValueError(f"reward {reward.name} ({KINDS[reward.kind]}) scores rollouts of the "
                                 f"{reward.dialect} dialect: set env.dialect {reward.dialect} "
                                 f"(got {self.env.dialect!r})")
            if "naive_rag_cache" in reward.needs and not self.naive_rag_cache:
                raise ValueError(f"reward {reward.name} compares with cached naive-RAG accuracies: set naive_rag_cache")

    def _validate_stages(self) -> None:
        stage2 = self.stage2
        for label, reward in (("reward", self.reward), ("stage2.reward", stage2.reward)):
            if label == "stage2.reward" and not reward:
                continue
            try:
                reward_entry(reward)
            except ValueError as error:  # the same message, naming the setting
                raise ValueError(str(error).replace("unknown reward", f"unknown {label}", 1)) from None
        if not stage2.reward:
            if stage2.after_step is not None or stage2.reward_options:
                raise ValueError("stage2.after_step and stage2.reward_options need stage2.reward (the reward after "
                                 "the switch); leave them unset for one reward over the whole run")
            return
        if stage2.after_step is None or stage2.after_step < 1:
            raise ValueError(f"stage2.reward {stage2.reward} needs stage2.after_step >= 1, the steps scored by "
                             f"{self.reward} before the switch (got {stage2.after_step}; to use {stage2.reward} "
                             "from the first step, set it as reward)")
        gains = [r for r in self.rewards if reward_entry(r).kind == "gain"]
        if gains:
            raise ValueError(f"a gain over naive RAG ({', '.join(gains)}) filters the "
                             "training questions for the whole run; it cannot be one stage of two")

    @property
    def rewards(self) -> list[str]:
        """The configured rewards in stage order: `reward`, then `stage2.reward` when set."""
        return [self.reward] + ([self.stage2.reward] if self.stage2.reward else [])

    def on_policy(self, batch_size: int) -> bool:
        """Whether the update of a step of `batch_size` rollouts may take the rollout policy's ("old")
        log-probabilities from its own forward pass instead of a separate pass before it: exact when the policy
        cannot change between the rollouts and the update's loss (one epoch, one mini-batch holding the whole
        batch: the update's log-probabilities are the rollout policy's, so the ratio is 1 and the clipped
        surrogate's gradient is the plain policy gradient; verl's actor, ``verl/workers/actor/dp_actor.py``, takes
        the same shortcut) and when no advantage reads the old log-probabilities before the update (the KL in the
        reward does)."""
        one_update = self.ppo_epochs == 1 and (self.mini_batch_size is None or self.mini_batch_size >= batch_size)
        return one_update and not (self.kl_in_reward and self.uses_reference)

    @property
    def uses_generator(self) -> bool:
        """Whether a stage's reward needs the frozen generator (its registry entry says so: s3's gains, QAgent's
        stage 2): scored on the documents of a whole step at once (`agent.rl.batch_reward`)."""
        return any("generator" in reward_entry(r).needs for r in self.rewards)

    @property
    def uses_query_encoder(self) -> bool:
        """Whether a stage's reward needs the retriever's query encoder (its registry entry says so: the
        when-to-search stage rewards embed the step's search queries; `agent.rl.batch_reward.WhenToSearchReward`)."""
        return any("query_encoder" in reward_entry(r).needs for r in self.rewards)

    @property
    def uses_critic(self) -> bool:
        return self.algorithm == "ppo"

    @property
    def advantage_estimator(self) -> str:
        """The algorithm's advantage estimator, a name in `agent.rl.core.ADVANTAGE_ESTIMATORS`."""
        return {"ppo": "gae", "grpo": "grpo"}[self.algorithm]

    @property
    def advantage_options(self) -> dict[str, object]:
        """The options of `advantage_estimator` these settings give."""
        if self.advantage_estimator == "gae":
            return {"gamma": self.gamma, "lam": self.lam, "whiten": self.whiten_advantages}
        return {"normalize_std": self.grpo_normalize_std}

    @property
    def kl_in_reward(self) -> bool:
        if self.kl_placement == "auto":
            return self.algorithm == "ppo"
        return self.kl_placement == "reward"

    @property
    def kl_kind(self) -> KLEstimator:
        if self.kl_estimator != "auto":
            return self.kl_estimator
        return "k1" if self.kl_in_reward else "low_var_kl"

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0
