"""Step 1 of an RL step: roll the current policy out on the step's questions and turn the rollouts into
scored training samples.

* `questions_at`: the seeded, endless question stream (a function of its position, so a resumed run draws
  what the uninterrupted one would);
* `RolloutCollector.rollout_samples`: ``samples_per_prompt`` rollouts of each question through
  `agent.env.rollout` with the policy as the LLM and the fixed retriever, scored together by the
  `agent.rl.batch_reward.BatchReward` of the step's stage (`agent.rl.reward_schedule.RewardSchedule`: a response
  reward per rollout, or s3's Gain Beyond RAG or QAgent's stage 2 with one generator call for all of them) and
  logged with its diagnostics (`components`), as `agent.rl.batch.Sample`;
* `RolloutCollector.collect`: the samples of one step; with dynamic sampling (DAPO, "DAPO: An Open-Source LLM
  Reinforcement Learning System at Scale", arXiv 2503.14476, section 3.2, Eq. 11: keep a group when
  ``0 < |{o_i | is_equivalent(a, o_i)}| < G``) groups whose answers are all correct or all wrong are dropped
  (`answer_correct`; ``dynamic_sampling_filter: score`` drops groups whose rewards are all equal instead) and more
  questions are rolled out, up to ``dynamic_sampling_max_batches`` batches;
* `rollout_metrics`: mean reward, its spread and components, and token and search counts of a set of samples.

The collector generates and scores only: the log-prob passes, advantages and updates are the trainer's
(`agent.rl.trainer`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Sequence
from statistics import fmean
from typing import NamedTuple

import torch

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.llm import LLM
from agentic_retriever.base.qa_sources import QARow

from ..dialects import get_dialect
from ..env import Rollout, rollout
from .batch import Sample
from .config import RLConfig
from .reward_schedule import RewardSchedule

__all__ = ["RewardFn", "RolloutCollector", "StepSamples", "questions_at", "rollout_metrics"]

log = logging.getLogger(__name__)

RewardFn = Callable[[Rollout, Sequence[str]], float]


def questions_at(rows: Sequence[QARow], seed: int, start: int, count: int) -> list[QARow]:
    """Questions `start` .. `start + count` of an endless stream: epoch e is `rows` shuffled with seed
    (seed, e). A function of its arguments only, so a resumed run draws what the uninterrupted one would."""
    out = []
    for position in range(start, start + count):
        epoch, index = divmod(position, len(rows))
        order = list(range(len(rows)))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        out.append(rows[order[index]])
    return out


#: The components that say whether a sample's answer is correct, first found first: the judge's or exact match's
#: verdict of the when-to-search rewards, the frozen generator's accuracy (s3's Gain Beyond RAG) or contains-EM
#: (QAgent's stage 2), else the EM of the agent's own answer, which the collector logs for every dialect but s3.
CORRECTNESS_COMPONENTS = ("answer_correct", "gen_acc", "submodule_contains_em", "em")


def answer_correct(sample: Sample) -> bool:
    """Whether the sample's answer is correct, by the first of `CORRECTNESS_COMPONENTS` its components hold."""
    name = next((name for name in CORRECTNESS_COMPONENTS if name in sample.components), None)
    if name is None:
        raise ValueError(f"dynamic sampling by correctness needs one of the components {CORRECTNESS_COMPONENTS}; "
                         f"this sample has {sorted(sample.components)} (set dynamic_sampling_filter: score)")
    return sample.components[name] >= 1.0


class StepSamples(NamedTuple):
    """What `RolloutCollector.collect` gathered for one step."""

    samples: list[Sample]
    groups_kept: int
    cursor: int  # the position in the question stream after the step's questions


class RolloutCollector:
    """Rolls the policy out against the retriever and scores the rollouts as training samples.

    `llm` generates with `policy` (the module switched to eval mode while generating and back to train mode
    after); `config` gives the environment, the question stream's seed, the group sizes and dynamic sampling.
    """

    def __init__(self, config: RLConfig, rows: Sequence[QARow], llm: LLM, client: RetrievalClient,
                 rewards: RewardSchedule, policy: torch.nn.Module | None = None):
        self.config, self.rows, self.llm, self.client = config, list(rows), llm, client
        self.rewards, self.policy = rewards, policy
        self.dialect = get_dialect(config.env.dialect)

    def collect(self, step: int, cursor: int) -> StepSamples:
        """The samples of step ``step + 1``, drawing questions from position `cursor` of the stream; with
        dynamic sampling only groups with both correct and wrong answers (or, by ``score``, different rewards)
        are kept."""
        config = self.config
        kept: list[Sample] = []
        kept_groups = 0
        for attempt in range(config.dynamic_sampling_max_batches if config.dynamic_sampling else 1):
            rows = questions_at(self.rows, config.seed, cursor, config.prompts_per_step)
            cursor += len(rows)
            seed = None if config.env.seed is None else config.env.seed + 1_000_003 * step + 7_919 * attempt
            samples = self.rollout_samples(rows, config.samples_per_prompt, seed, attempt * config.prompts_per_step,
                                           step=step)
            if not config.dynamic_sampling:
                return StepSamples(samples, len(rows), cursor)
            signal = answer_correct if config.dynamic_sampling_filter == "correctness" else (lambda s: s.score)
            for group in sorted({s.group for s in samples}):
                members = [s for s in samples if s.group == group]
                if len({signal(s) for s in members}) > 1 and kept_groups < config.prompts_per_step:
                    kept.extend(members)
                    kept_groups += 1
            if kept_groups >= config.prompts_per_step:
                break
        if not kept:
            log.warning("step %d: no group had %s; the step updates nothing", step + 1,
                        "both correct and wrong answers" if config.dynamic_sampling_filter == "correctness"
                        else "different rewards")
        return StepSamples(kept, kept_groups, cursor)

    def rollout_samples(self, rows: Sequence[QARow], samples_per_prompt: int, seed: int | None,
                        first_group: int = 0, *, step: int) -> list[Sample]:
        """`samples_per_prompt` rollouts of each question with the current policy (sampling seeded by `seed`),
        scored in one `BatchReward.score` call by the reward of the step after `step` finished steps (rollouts
        that generated nothing are left out); the samples of ``rows[i]`` form group ``first_group + i``."""
        n = samples_per_prompt
        env = dataclasses.replace(self.config.env, seed=seed)
        questions = [row.question for row in rows for _ in range(n)]
        if self.policy is not None:
            self.policy.eval()
        try:
            results = rollout(questions, self.llm, self.client, env)
        finally:
            if self.policy is not None:
                self.policy.train()
        kept = [index for index, result in enumerate(results) if any(result.response_mask)]
        scored = self.rewards.reward(step).score([results[i] for i in kept], [rows[i // n] for i in kept])
        samples = []
        for index, score, parts in zip(kept, scored.scores, scored.components, strict=True):
            result, row = results[index], rows[index // n]
            samples.append(Sample(result.prompt_ids, result.response_ids, result.response_mask,
                                  group=first_group + index // n, score=score,
                                  components={**self.components(result, row), **parts},
                                  num_searches=result.num_searches))
        return samples

    def components(self, result: Rollout, row: QARow) -> dict[str, float]:
        """Diagnostics logged next to the reward's own: the dialect's (`Dialect.training_diagnostics`: EM of the
        answer and the checks of its format; for s3's searcher, which answers nothing, the documents it selected)."""
        return self.dialect.training_diagnostics(result, row.golden_answers)


def rollout_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """Mean reward (and its std), mean components, response and generated tokens, masked share and searches."""
    if not samples:
        return {"reward": float("nan")}
    scores = torch.tensor([s.score for s in samples])
    metrics = {"reward": scores.mean().item(), "reward_std": scores.std().item() if len(samples) > 1 else 0.0}
    for name in samples[0].components:
        metrics[name] = fmean(s.components[name] for s in samples)
    metrics["response_tokens"] = fmean(len(s.response_ids) for s in samples)
    metrics["generated_tokens"] = fmean(s.generated_tokens for s in samples)
    metrics["masked_share"] = 1 - sum(s.generated_tokens for s in samples) / sum(len(s.response_ids) for s in samples)
    metrics["searches"] = fmean(s.num_searches for s in samples)
    return metrics
