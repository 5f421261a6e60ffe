"""A policy scored on held-out questions before and after training: the harness of the seed methods' training
experiments (benchmarks/experiments/: s3, QAgent, "Learning When to Search"), which compare runs that differ in
one setting (the method's reward against a control without signal) by what each run's training changed.

The same seeded rollouts are scored each time (`score_on_heldout`: one sampling seed, the trainer's current
policy, no update), so a difference between "before" and "after" is the training's, not the sampling's. The
control run of such a comparison (`constant_reward_control`) is the same run with a reward that carries no signal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from statistics import fmean

from agentic_retriever.base.qa_sources import QARow

from ..env import rollout
from .batch_reward import BatchReward
from .config import RLConfig, SecondStage
from .trainer import RLTrainer

__all__ = ["constant_reward_control", "score_on_heldout", "train_between_scores"]


def score_on_heldout(trainer: RLTrainer, rewards: Mapping[str, BatchReward], rows: Sequence[QARow], samples: int,
                     seed: int) -> dict[str, float]:
    """Rollouts of `rows` (`samples` each, sampled with `seed`, the trainer's current policy in eval mode) scored by
    each of `rewards` (name -> reward, whichever the trainer trains on): per reward its mean score (key: the name)
    and mean components (``{name}_{component}``); then the trainer's diagnostics (`RLTrainer.components`) and
    the mean searches per rollout."""
    if not rows or samples < 1:
        raise ValueError(f"held-out scoring needs questions and at least one sample each; got {len(rows)} "
                         f"questions, {samples} samples")
    env = dataclasses.replace(trainer.config.env, seed=seed)
    repeated = [row for row in rows for _ in range(samples)]
    trainer.policy.eval()
    try:
        results = rollout([row.question for row in repeated], trainer.llm, trainer.client, env)
    finally:
        trainer.policy.train()
    out: dict[str, float] = {}
    for name, reward in rewards.items():
        scored = reward.score(results, repeated)
        out[name] = fmean(scored.scores)
        for key in scored.components[0]:
            out[f"{name}_{key}"] = fmean(parts[key] for parts in scored.components)
    parts = [trainer.components(result, row) for result, row in zip(results, repeated)]
    for key in parts[0]:
        out[key] = fmean(p[key] for p in parts)
    out["searches"] = fmean(result.num_searches for result in results)
    return out


def train_between_scores(trainer: RLTrainer, evaluate: Callable[[], dict], train: bool = True) -> dict:
    """``{"before": evaluate()}``, then, when `train`, the trainer's whole run and ``"after": evaluate()`` with the
    run's metric history (``"history"``). `evaluate` scores the trainer's current policy (`score_on_heldout`
    with fixed arguments, or a method's own diagnostics)."""
    result = {"before": evaluate()}
    if train:
        trainer.train()
        result |= {"after": evaluate(), "history": trainer.state.history}
    return result


def constant_reward_control(config: RLConfig) -> RLConfig:
    """`config` as the control of a reward experiment: the same run with the constant reward in both stages, so
    whatever it changes is the update's own drift (KL, entropy, sampling), not the reward's signal; without dynamic
    sampling, which would drop every group of a constant reward."""
    return dataclasses.replace(config, reward="constant", reward_options={}, stage2=SecondStage(),
                               dynamic_sampling=False)
