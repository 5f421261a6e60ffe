"""Held-out scoring around a training run (agent/rl/heldout.py), the harness of the seed methods' training
experiments: the same seeded rollouts each time, the policy left in training mode, scores before and after the
trainer's own run, and the control run without reward signal."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.env import rollout
from agent.rl import RLConfig, RLTrainer
from agent.rl.batch_reward import prepare_reward
from agent.rl.config import SecondStage
from agent.rl.heldout import constant_reward_control, score_on_heldout, train_between_scores
from agentic_retriever.app.config_loader import build_config
from agentic_retriever.base.qa_sources import QARow
from tests.agent.rl.test_rl_trainer import ROWS, config
from tests.fakes import FakeClient

ROOT = Path(__file__).resolve().parents[3]
HELDOUT = [QARow("h1", "which river is number 1?", ("river 1",)), QARow("h2", "which hill is number 2?", ("hill 2",))]


@pytest.fixture
def trainer(tmp_path, tiny_causal_lm_dir) -> RLTrainer:
    return RLTrainer(config(tmp_path, tiny_causal_lm_dir, steps=1, save_steps=1), FakeClient(), ROWS)


def test_held_out_scores_are_the_same_seeded_rollouts_each_time(trainer):
    rewards = {"format": prepare_reward(trainer.config, trainer.client, HELDOUT).reward}
    first = score_on_heldout(trainer, rewards, HELDOUT, samples=2, seed=7)
    assert trainer.policy.training  # back in training mode for the next update
    again = score_on_heldout(trainer, rewards, HELDOUT, samples=2, seed=7)
    assert first == again
    assert {"format", "searches"} <= set(first) and 0.0 <= first["format"] <= 1.0
    (one,) = rollout([HELDOUT[0].question], trainer.llm, trainer.client, trainer.config.env)
    assert set(trainer.components(one, HELDOUT[0])) <= set(first)  # the trainer's diagnostics, averaged


def test_scoring_without_questions_or_samples_is_refused(trainer):
    with pytest.raises(ValueError, match="needs questions and at least one sample each; got 0 questions"):
        score_on_heldout(trainer, {}, [], samples=1, seed=0)
    with pytest.raises(ValueError, match="got 2 questions, 0 samples"):
        score_on_heldout(trainer, {}, HELDOUT, samples=0, seed=0)


def test_train_between_scores_scores_before_the_run_and_after_its_last_step(trainer):
    seen_steps = []

    def evaluate() -> dict:
        seen_steps.append(trainer.state.step)
        return {"step": trainer.state.step}

    result = train_between_scores(trainer, evaluate)
    assert seen_steps == [0, 1] and result["before"] == {"step": 0} and result["after"] == {"step": 1}
    assert [row["step"] for row in result["history"]] == [1]


def test_without_training_only_the_policy_as_given_is_scored(trainer):
    result = train_between_scores(trainer, lambda: {"step": trainer.state.step}, train=False)
    assert result == {"before": {"step": 0}} and trainer.state.step == 0


@pytest.mark.parametrize("recipe", ["when_to_search_quickstart", "qagent_quickstart"])
def test_the_control_run_is_the_same_run_with_a_constant_reward_in_both_stages(recipe):
    """The control of the seed methods' experiments, from the recipes they run: no reward signal in either stage,
    no dynamic sampling (a constant reward would have it drop every group); everything else as configured."""
    configured = build_config(RLConfig, "agent_train", None, str(ROOT / "configs" / f"{recipe}.yaml"))
    assert configured.stage2.reward  # both recipes switch reward after a stage
    control = constant_reward_control(configured)
    control.validate()
    assert (control.reward, control.reward_options, control.stage2, control.dynamic_sampling) == (
        "constant", {}, SecondStage(), False)
    assert configured.reward != "constant" and configured.stage2.reward  # the configured run is left as it was
    unchanged = {f.name for f in dataclasses.fields(RLConfig)} - {"reward", "reward_options", "stage2",
                                                                   "dynamic_sampling"}
    assert all(getattr(control, name) == getattr(configured, name) for name in unchanged)
