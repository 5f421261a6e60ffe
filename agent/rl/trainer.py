"""The embedded RL trainer of the search agent: PPO (GAE + critic) and GRPO/DAPO (group advantages).

One step ("Agentic-R: Learning to Retrieve for Agentic Search", section 4.2, trains the agent this way against a
fixed retriever; the recipe is Search-R1's, "Search-R1: Training LLMs to Reason and Leverage Search Engines with
Reinforcement Learning", arXiv 2503.09516, at the values of the authors' release; docs/rl.md):

1. rollouts (`agent.rl.rollout`): ``prompts_per_step`` questions x ``samples_per_prompt`` samples through
   `agent.env.rollout`, with the current policy as the LLM and the fixed retriever; the step's responses are
   scored together by the configured reward (`agent.rl.batch_reward`: a response reward of `agent.rewards`, or
   s3's Gain Beyond RAG, "s3: You Don't Need That Much Data to Train a Search Agent via RL", arXiv 2505.14146,
   whose frozen generator answers from every rollout's selected documents in one call); with ``stage2`` set, the
   reward of the step's stage (`agent.rl.reward_schedule`; QAgent, "QAgent: A modular Search Agent with
   Interactive Query Understanding", arXiv 2510.08383: Eq. 7 up to step 1120, Eq. 10 after), logged as
   ``reward_stage``. With dynamic sampling (DAPO, arXiv 2503.14476), groups whose answers are all correct or all
   wrong (or, with ``dynamic_sampling_filter: score``, whose rewards are all equal) are dropped and more questions
   are rolled out, up to ``dynamic_sampling_max_batches`` batches;
2. log-prob passes without gradients: the rollout policy's log-probabilities (PPO's "old" policy), the
   reference model's (for the KL) and, for PPO, the critic's values. The rollout policy's pass is skipped when
   the update is on-policy (`RLConfig.on_policy`: one epoch over one mini-batch, no KL in the reward): its
   log-probabilities are then exactly the update's own, detached (metric ``on_policy``);
3. advantages: GAE over token rewards (the score on the last generated token, minus ``kl_coef`` x k1 on every
   generated token when the KL sits in the reward), or GRPO's group-normalised score on every token (GRPO:
   "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models", arXiv 2402.03300);
   with the KL in the reward, GRPO normalises the score minus ``kl_coef`` x the sequence's summed k1, as verl does;
4. ``ppo_epochs`` passes of mini-batch updates: the clipped policy loss, minus the entropy bonus, plus the KL
   loss when the KL sits in the loss; the critic's clipped value loss; gradient clipping.

Every loss, KL and advantage covers the generated tokens only (`agent.rl.core`): retrieved passages and
invalid-action messages are state, not actions. Metrics go to ``OUT/metrics.jsonl`` and
``OUT/training_curves.png`` after every step, and to TensorBoard and/or W&B (``report_to``, files in
``OUT/logs``); checkpoints every ``save_steps`` (`agent.rl.checkpoint`), removed once the trained policy is saved
as an HF model folder ``OUT/policy`` (LoRA merged) that the rollout CLI and vLLM load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.curves import ScalarLogger, resolve_report_to, write_training_curves
from agentic_retriever.base.jsonl import replace_folder
from agentic_retriever.base.llm import LLM
from agentic_retriever.base.llm.device import resolve_device
from agentic_retriever.base.llm.transformers import TransformersLLM
from agentic_retriever.base.precision import resolve
from agentic_retriever.base.qa_sources import QARow

from ..env import Rollout
from .batch import Collated, Sample, collate, token_logprobs, token_values
from .batch_reward import prepare_reward
from .checkpoint import TrainerState, latest_checkpoint, load_checkpoint, remove_checkpoints, save_checkpoint
from .config import RLConfig
from .reward_schedule import RewardSchedule
from .core import RewardKL, aggregate, estimate_advantages, kl_estimate, masked_mean, policy_loss, value_loss
from .models import ValueModel, frozen_copy, load_policy, reference_context
from .rollout import RewardFn, RolloutCollector, questions_at, rollout_metrics

__all__ = ["RLTrainer", "questions_at"]

log = logging.getLogger(__name__)


class RLTrainer:
    """PPO or GRPO on one machine. ``RLTrainer(config, client, rows).train()`` runs (or resumes) the whole run.

    `reward_fn` (a response reward ``reward(response, golden)``) replaces the configured reward. A gain over naive
    RAG loads its frozen generator (or uses `generator`, a loaded `LLM`) and filters `rows` before the policy loads
    (`batch_reward.prepare_reward`);
    the filters' counts (`question_filters`) go to ``OUT/question_filters.json`` and the exported manifest."""

    def __init__(self, config: RLConfig, client: RetrievalClient, rows: Sequence[QARow],
                 reward_fn: RewardFn | None = None, generator: LLM | None = None):
        from transformers import AutoTokenizer

        from agentic_retriever.base.defaults import resolve_llm_name

        config.validate()
        if not rows:
            raise ValueError("RL needs at least one training question")
        if not config.out:
            raise ValueError("RLConfig.out: give the run folder")
        self.config, self.client = config, client
        self.scalars = ScalarLogger(resolve_report_to(config.report_to), Path(config.out) / "logs",
                                    run_name=f"agent rl {Path(config.out).name}", config=dataclasses.asdict(config))
        self.out = Path(config.out)
        prepared = prepare_reward(config, client, rows, reward_fn, generator)
        self.rows, self.question_filters = prepared.rows, prepared.question_filters
        self.rewards = RewardSchedule(prepared.reward, prepared.stage2,
                                      config.stage2.after_step if prepared.stage2 is not None else None)
        if prepared.stage2 is not None and config.stage2.after_step >= config.steps:
            log.warning("stage2.after_step %d >= steps %d: no step is scored by %s", config.stage2.after_step,
                        config.steps, config.stage2.reward)
        self.device = resolve_device(config.agent.device)
        torch.manual_seed(config.seed)
        path = resolve_llm_name(config.agent.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.policy = load_policy(path, self.device, config.lora, config.lora_r, config.lora_alpha,
                                  config.gradient_checkpointing)
        self.reference = frozen_copy(self.policy) if config.uses_reference and not config.lora else None
        self.critic = None
        if config.uses_critic:
            critic_path = resolve_llm_name(config.critic_model) if config.critic_model else path
            self.critic = ValueModel.from_pretrained(critic_path, self.device, config.lora, config.lora_r,
                                                     config.lora_alpha, config.gradient_checkpointing)
        self.llm = TransformersLLM(self.policy, self.tokenizer, name=config.agent.model,
                                   max_batch_size=config.generation_batch_size,
                                   prefix_cache_tokens=config.agent.prefix_cache_tokens
                                   if config.agent.enable_prefix_caching else 0)
        self.rollouts = RolloutCollector(config, self.rows, self.llm, client, self.rewards, self.policy)
        self.actor_opt, self.actor_sched = self._optimizer(self.policy, config.actor_lr)
        self.critic_opt, self.critic_sched = (self._optimizer(self.critic, config.critic_lr) if self.critic
                                              else (None, None))
        self.state = TrainerState(history=[])
        self._on_policy: bool | None = None  # the last step's on-policy decision, logged when it changes
        self.bf16 = resolve(config.agent.precision, str(self.device), "rl") == "bf16"

    # ------------------------------------------------------------------------------------------ run
    def _autocast(self):
        """The context of every log-prob and value pass: bfloat16 autocast, or nothing (float32)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    def _optimizer(self, model: torch.nn.Module, lr: float):
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=self.config.weight_decay)
        warmup = self.config.warmup_steps
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: min(1.0, (n + 1) / warmup) if warmup else 1.0)
        return optimizer, schedule

    def _modules(self) -> dict:
        return {"policy": self.policy, "critic": self.critic, "actor_opt": self.actor_opt,
                "actor_sched": self.actor_sched, "critic_opt": self.critic_opt, "critic_sched": self.critic_sched}

    def resume(self) -> bool:
        """Load the newest checkpoint of ``OUT/checkpoints`` if there is one."""
        last = latest_checkpoint(self.out / "checkpoints")
        if last is None:
            return False
        self.state = load_checkpoint(last, self._modules())
        log.info("resumed from %s (step %d)", last, self.state.step)
        return True

    def train(self) -> Path:
        """Run (or resume) ``config.steps`` steps and save the policy; returns the policy folder."""
        if (self.out / "policy" / "rl_manifest.json").is_file():
            log.info("%s already holds the trained policy", self.out / "policy")
            return self.out / "policy"
        self.out.mkdir(parents=True, exist_ok=True)
        if self.question_filters:
            (self.out / "question_filters.json").write_text(json.dumps(self.question_filters, indent=2) + "\n")
        self.resume()
        with tqdm(total=self.config.steps, initial=self.state.step, desc=f"{self.config.algorithm} steps",
                  unit=" step", disable=not self.config.progress) as bar:
            while self.state.step < self.config.steps:
                metrics = self.step()
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward']:.3f}")
                if self.state.step % self.config.save_steps == 0 and self.state.step < self.config.steps:
                    save_checkpoint(self.out / "checkpoints", self.state, self._modules())
        self.scalars.close()
        policy = self.export()
        remove_checkpoints(self.out / "checkpoints")
        return policy

    def step(self) -> dict[str, float]:
        """One RL step; appends its metrics to the history and the metrics file and returns them."""
        timer = time.perf_counter()
        stage = self.rewards.stage(self.state.step)
        if self.rewards.after_step is not None and self.state.step == self.rewards.after_step:
            log.info("step %d: stage 2 begins, scored by %s", self.state.step + 1, self.config.stage2.reward)
        samples, kept_groups = self.collect()
        seconds_generate = time.perf_counter() - timer
        on_policy = self.config.on_policy(len(samples))
        if on_policy != self._on_policy:
            log.info("on-policy update: %s", "the rollout policy's log-probabilities are the update's own, their "
                     "pass is skipped" if on_policy else "the rollout policy's log-probabilities get their own pass")
            self._on_policy = on_policy
        timer = time.perf_counter()
        self.score(samples, rollout_policy=not on_policy)
        self.advantages(samples)
        seconds_logprobs = time.perf_counter() - timer
        timer = time.perf_counter()
        update = self.update(samples, on_policy)
        seconds_update = time.perf_counter() - timer
        self.state.step += 1
        metrics = {"step": self.state.step, **self.rollout_metrics(samples), **update, "groups_kept": kept_groups,
                   "reward_stage": stage, "on_policy": float(on_policy), "seconds_generate": seconds_generate,
                   "seconds_logprobs": seconds_logprobs, "seconds_update": seconds_update}
        self.state.history.append(metrics)
        write_training_curves(self.state.history, self.out, f"agent RL ({self.config.algorithm}, reward "
                              f"{self.config.reward})", xlabel="RL step")
        self.scalars.log(metrics, self.state.step)
        return metrics

    # ------------------------------------------------------------------------------------------ 1. rollouts
    def collect(self) -> tuple[list[Sample], int]:
        """Roll out the step's questions (`RolloutCollector.collect`) and advance the question stream; returns
        the samples and the number of groups kept."""
        samples, kept_groups, self.state.cursor = self.rollouts.collect(self.state.step, self.state.cursor)
        if self.llm.prefix_cache is not None:
            # the rollouts' KV caches serve the next turn of the same weights only; the update is about to change
            # them, and held through the passes they would add up to the cache's budget to the step's peak memory
            self.llm.prefix_cache.clear()
        return samples, kept_groups

    def rollout_samples(self, rows: Sequence[QARow], samples_per_prompt: int, seed: int | None,
                        first_group: int = 0) -> list[Sample]:
        """Scored rollouts of `rows` with the current policy (`RolloutCollector.rollout_samples`), by the reward
        of the next step's stage."""
        return self.rollouts.rollout_samples(rows, samples_per_prompt, seed, first_group, step=self.state.step)

    def evaluate(self, rows: Sequence[QARow], samples_per_prompt: int = 1, seed: int = 0) -> dict[str, float]:
        """Mean reward and diagnostics of the current policy on `rows` (the configured sampling, seeded:
        the same `seed` draws the same samples from the same policy), without training."""
        return self.rollout_metrics(self.rollout_samples(rows, samples_per_prompt, seed))

    def components(self, result: Rollout, row: QARow) -> dict[str, float]:
        """Diagnostics logged next to the reward (`RolloutCollector.components`)."""
        return self.rollouts.components(result, row)

    # ------------------------------------------------------------------------------------------ 2. passes
    def _micro_batches(self, samples: Sequence[Sample]) -> list[list[Sample]]:
        size = self.config.micro_batch_size
        return [list(samples[i:i + size]) for i in range(0, len(samples), size)]

    def _collate(self, samples: Sequence[Sample]) -> Collated:
        return collate(samples, self.device, self.llm.pad_id)

    @torch.no_grad()
    def score(self, samples: Sequence[Sample], rollout_policy: bool = True) -> None:
        """Attach the rollout policy's log-probabilities (unless not `rollout_policy`: an on-policy update takes
        them from its own pass), the reference's and the critic's values."""
        for micro in self._micro_batches(samples):
            batch = self._collate(micro)
            with self._autocast():
                old = self._logprobs(self.policy, batch)[0] if rollout_policy else None
                ref = None
                if self.config.uses_reference:
                    with reference_context(self.policy, self.reference) as reference:
                        ref, _ = self._logprobs(reference, batch)
                values = token_values(self.critic, batch) if self.critic is not None else None
            for row, sample in enumerate(micro):
                n = len(sample.response_ids)
                sample.old_logprobs = old[row, -n:].cpu() if old is not None else None
                sample.ref_logprobs = ref[row, -n:].cpu() if ref is not None else None
                sample.values = values[row, -n:].float().cpu() if values is not None else None

    def _logprobs(self, model, batch: Collated, with_entropy: bool = False, entropy_grad: bool = True):
        """`token_logprobs` at the sampling temperature (1 for greedy rollouts) and the configured chunk size."""
        temperature = self.config.env.temperature if self.config.env.temperature > 0 else 1.0
        return token_logprobs(model, batch, temperature, with_entropy, entropy_grad, self.config.logprob_chunk_size)

    # ------------------------------------------------------------------------------------------ 3. advantages
    def advantages(self, samples: Sequence[Sample]) -> None:
        """Each sample's advantages (and returns, with a critic) by the algorithm's estimator, chosen by name from
        `agent.rl.core.ADVANTAGE_ESTIMATORS` (`RLConfig.advantage_estimator`)."""
        config = self.config
        if not samples:
            return
        batch = collate(samples, "cpu")  # token tensors and masks, right-aligned
        kl = (RewardKL(batch.tokens["old_logprobs"], batch.tokens["ref_logprobs"], config.kl_coef, config.kl_kind)
              if config.kl_in_reward and config.uses_reference else None)
        last = torch.tensor([batch.response_width - len(s.response_ids) + s.last_generated for s in samples])
        scores, groups = torch.tensor([s.score for s in samples]), torch.tensor([s.group for s in samples])
        advantages, returns = estimate_advantages(config.advantage_estimator, scores, groups, batch.mask, last,
                                                  batch.tokens.get("values"), kl, **config.advantage_options)
        for row, sample in enumerate(samples):
            n = len(sample.response_ids)
            sample.advantages = advantages[row, -n:]
            if returns is not None:
                sample.returns = returns[row, -n:]

    # ------------------------------------------------------------------------------------------ 4. update
    def update(self, samples: Sequence[Sample], on_policy: bool = False) -> dict[str, float]:
        """`ppo_epochs` passes of mini-batch updates of the policy (and the critic); averaged statistics.
        `on_policy`: the policy loss's old log-probabilities are its own, detached (only where
        `RLConfig.on_policy` says that is exact); otherwise the samples carry them from `score`."""
        config = self.config
        if on_policy and not config.on_policy(len(samples)):
            raise ValueError("an on-policy update needs one epoch over one mini-batch of the whole batch and no KL "
                             "in the reward (RLConfig.on_policy)")
        totals: dict[str, float] = {}
        weights: dict[str, float] = {}

        def record(name: str, value: float, weight: float = 1.0) -> None:
            totals[name] = totals.get(name, 0.0) + value * weight
            weights[name] = weights.get(name, 0.0) + weight

        if samples:
            size = config.mini_batch_size or len(samples)
            generator = torch.Generator().manual_seed(config.seed * 7_919 + self.state.step)
            for _ in range(config.ppo_epochs):
                order = torch.randperm(len(samples), generator=generator).tolist()
                for start in range(0, len(order), size):
                    mini = [samples[i] for i in order[start:start + size]]
                    self._update_policy(mini, record, on_policy)
                    if self.critic is not None:
                        self._update_critic(mini, record)
        stats = {name: totals[name] / weights[name] for name in totals if weights[name]}
        stats["actor_lr"] = self.actor_sched.get_last_lr()[0]
        return stats

    def _normalisers(self, mini: Sequence[Sample]) -> tuple[float, float]:
        return float(max(1, sum(s.generated_tokens for s in mini))), float(len(mini))

    def _update_policy(self, mini: Sequence[Sample], record, on_policy: bool = False) -> None:
        config = self.config
        tokens, sequences = self._normalisers(mini)
        self.actor_opt.zero_grad(set_to_none=True)
        pg_total = 0.0  # the micro-batches' losses add up to the mini-batch's
        for micro in self._micro_batches(mini):
            batch = self._collate(micro)
            with self._autocast():
                logprobs, entropy = self._logprobs(self.policy, batch, with_entropy=True,
                                                   entropy_grad=config.entropy_coef != 0)
            mask = batch.mask
            old = logprobs.detach() if on_policy else batch.tokens["old_logprobs"]
            loss, stats = policy_loss(logprobs, old, batch.tokens["advantages"], mask, config.clip_low,
                                      config.clip_high, config.loss_aggregation, tokens, sequences)
            share = float(mask.sum()) / tokens
            pg_total += loss.item()
            if config.entropy_coef:
                loss = loss - config.entropy_coef * aggregate(entropy, mask, config.loss_aggregation, tokens, sequences)
            if config.uses_reference:
                kl = kl_estimate(logprobs, batch.tokens["ref_logprobs"], config.kl_kind)
                if not config.kl_in_reward:
                    loss = loss + config.kl_coef * aggregate(kl, mask, config.loss_aggregation, tokens, sequences)
                record("kl", masked_mean(kl.detach(), mask).item(), share)
            loss.backward()
            record("entropy", masked_mean(entropy.detach(), mask).item(), share)
            for name, value in stats.items():
                record(name, value, share)
        record("pg_loss", pg_total)
        record("grad_norm", self._step(self.policy, self.actor_opt, self.actor_sched))

    def _update_critic(self, mini: Sequence[Sample], record) -> None:
        config = self.config
        tokens, sequences = self._normalisers(mini)
        self.critic_opt.zero_grad(set_to_none=True)
        value_total = 0.0
        for micro in self._micro_batches(mini):
            batch = self._collate(micro)
            with self._autocast():
                values = token_values(self.critic, batch).float()
            loss, stats = value_loss(values, batch.tokens["values"], batch.tokens["returns"], batch.mask,
                                     config.value_clip, config.loss_aggregation, tokens, sequences)
            loss.backward()
            value_total += loss.item()
            record("vf_clip_frac", stats["vf_clip_frac"], float(batch.mask.sum()) / tokens)
        record("value_loss", value_total)
        record("critic_grad_norm", self._step(self.critic, self.critic_opt, self.critic_sched))

    def _step(self, model: torch.nn.Module, optimizer, schedule) -> float:
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip if self.config.grad_clip > 0 else float("inf"))
        optimizer.step()
        schedule.step()
        return float(norm)

    # ------------------------------------------------------------------------------------------ metrics, export
    def rollout_metrics(self, samples: Sequence[Sample]) -> dict[str, float]:
        """The step's rollout metrics (`agent.rl.rollout.rollout_metrics`)."""
        return rollout_metrics(samples)

    def export(self) -> Path:
        """Save the policy as an HF model folder (LoRA merged into the weights), atomically."""
        final = self.out / "policy"
        tmp = self.out / ".policy.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model = self.policy.merge_and_unload() if self.config.lora else self.policy
        model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        last = self.state.history[-1] if self.state.history else {}
        manifest = {"settings": dataclasses.asdict(self.config), "steps": self.state.step,
                    "questions_seen": self.state.cursor, "question_filters": self.question_filters, "last_step": last}
        (tmp / "rl_manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        replace_folder(tmp, final)
        log.info("wrote the trained policy to %s (%d steps)", final, self.state.step)
        return final
