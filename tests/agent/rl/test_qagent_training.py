"""QAgent's two-stage training in the embedded trainer ("QAgent: A modular Search Agent with Interactive Query
Understanding", arXiv 2510.08383, sections 3.3-3.4, Appendix C): the stage settings refused before any model
loads, the rewards `prepare_reward` builds per stage, and RL steps end to end that switch stage at the configured
step, log it, and resume from a stage-1 checkpoint into stage 2."""

from __future__ import annotations

import json

import pytest

from agent.env import EnvConfig
from agent.rl import RLConfig, RLTrainer
from agent.rl.batch_reward import ResponseReward, SubmoduleReward, prepare_reward
from agent.rl.config import SecondStage
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.qa_sources import QARow
from tests.agent.rewards.test_qagent_rewards import ScriptedGenerator
from tests.fakes import FakeClient

ROWS = [QARow("a", "capital of france?", ("Paris",)), QARow("b", "capital of norway?", ("Oslo",))]


def qagent_config(tmp_path, policy: str = "policy", **overrides) -> RLConfig:
    settings = dict(agent=LLMConfig(model=policy), out=str(tmp_path / "run"), algorithm="grpo", steps=2,
                    prompts_per_step=1, samples_per_prompt=2, micro_batch_size=2, actor_lr=1e-3,
                    env=EnvConfig(dialect="qagent", max_turns=1, topk=1, max_new_tokens_per_turn=8, temperature=1.0,
                                  max_context_tokens=1500),
                    reward="qagent_stage1", stage2=SecondStage("qagent_stage2", {}, after_step=1),
                    generator=LLMConfig(model="frozen-generator"), progress=False, report_to=["none"])
    settings.update(overrides)
    return RLConfig(**settings)


@pytest.mark.parametrize("overrides, message", [
    ({"stage2": SecondStage("qagent_stage2")}, r"stage2.reward qagent_stage2 needs stage2.after_step >= 1"),
    ({"stage2": SecondStage("qagent_stage2", after_step=0)}, r"needs stage2.after_step >= 1, .* \(got 0;"),
    ({"stage2": SecondStage("", after_step=5)}, r"stage2.after_step and stage2.reward_options need stage2.reward"),
    ({"stage2": SecondStage("", {"hit_weight": 1.0})}, r"need stage2.reward"),
    ({"stage2": SecondStage("stage_two", after_step=1)}, r"unknown stage2.reward 'stage_two'.*qagent_stage2"),
    ({"generator": LLMConfig(model="")}, r"reward qagent_stage2 .* set generator\.model"),
    ({"env": EnvConfig()}, r"reward qagent_stage2 \(a reward of a frozen generator's answer\) scores rollouts of "
                           r"the qagent dialect: set env.dialect qagent \(got 'search_r1'\)"),
    ({"reward": "s3_gbr", "naive_rag_cache": "cache"}, r"filters the training questions for the whole run"),
])
def test_bad_stage_settings_are_refused_before_any_model_loads(tmp_path, monkeypatch, overrides, message):
    monkeypatch.setattr("agent.rl.trainer.load_policy", lambda *a, **k: pytest.fail("loaded the policy"))
    monkeypatch.setattr("agent.rl.batch_reward.load_llm", lambda *a, **k: pytest.fail("loaded the generator"))
    with pytest.raises(ValueError, match=message):
        RLTrainer(qagent_config(tmp_path, **overrides), FakeClient(), ROWS)


def test_a_bad_stage_option_is_refused_before_the_generator_loads(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.rl.batch_reward.load_llm", lambda *a, **k: pytest.fail("loaded the generator"))
    with pytest.raises(ValueError, match="reward 'qagent_stage2' takes no option lambda_f"):
        prepare_reward(qagent_config(tmp_path, stage2=SecondStage("qagent_stage2", {"lambda_f": 0.2}, 1)),
                       FakeClient(), ROWS)


def test_prepare_reward_builds_one_reward_per_stage_and_loads_the_generator_once(tmp_path, monkeypatch):
    loaded = []
    monkeypatch.setattr("agent.rl.batch_reward.load_llm", lambda config: loaded.append(config) or ScriptedGenerator())
    prepared = prepare_reward(qagent_config(tmp_path), FakeClient(), ROWS)
    assert isinstance(prepared.reward, ResponseReward) and isinstance(prepared.stage2, SubmoduleReward)
    assert [config.model for config in loaded] == ["frozen-generator"] and prepared.rows == ROWS
    assert prepared.question_filters == {}
    one_stage = prepare_reward(qagent_config(tmp_path, stage2=SecondStage()), FakeClient(), ROWS)
    assert one_stage.stage2 is None and len(loaded) == 1  # qagent_stage1 alone needs no generator
    with pytest.raises(ValueError, match="replaces the configured reward of a one-stage run"):
        prepare_reward(qagent_config(tmp_path), FakeClient(), ROWS, reward_fn=lambda r, g: 0.0)


def test_the_training_diagnostics_count_the_queries_a_rollout_searched_next_to_its_searches(tmp_path):
    from agent.rl.reward_schedule import RewardSchedule
    from agent.rl.rollout import RolloutCollector
    from tests.agent.test_qagent_rollout import run_qagent

    (hamlet, peru), _ = run_qagent()  # hamlet: 2 queries, then 3 (a 4th dropped), an empty search, the answer
    collect = RolloutCollector(qagent_config(tmp_path), [], llm=None, client=None, rewards=RewardSchedule(None))
    parts = collect.components(hamlet, QARow("1", "who wrote hamlet", ("Shakespeare",)))
    assert hamlet.num_searches == 2 and parts["queries"] == 5.0
    assert parts["retrieved_documents"] == 4.0  # "hamlet author" searched twice: its passage counts once in K
    assert parts["em"] == 1.0 and parts["valid_format"] == 0.0  # the empty search got the rethink message
    assert collect.components(peru, QARow("2", "capital of peru", ("Lima",)))["queries"] == 1.0


def constant_stages(tmp_path, policy: str, **overrides) -> RLConfig:
    """Two constant stages (0.25, then 0.75): which stage scored a step shows in its reward."""
    return qagent_config(tmp_path, policy, env=EnvConfig(max_turns=1, topk=1, max_new_tokens_per_turn=8,
                                                         temperature=1.0, max_context_tokens=1500),
                         reward="constant", reward_options={"value": 0.25},
                         stage2=SecondStage("constant", {"value": 0.75}, after_step=1), generator=LLMConfig(model=""),
                         save_steps=1, **overrides)


@pytest.mark.slow
def test_the_stage_switches_after_the_configured_step_and_a_resumed_run_continues_into_stage_2(
        tmp_path, tiny_causal_lm_dir, monkeypatch):
    stage2 = []  # the rewards that scored the steps of stage 2, in order

    first = RLTrainer(constant_stages(tmp_path, tiny_causal_lm_dir), FakeClient(), ROWS)
    assert first.rewards.stage(0) == 1 and first.rewards.stage(1) == 2

    def interrupted(results, rows):
        stage2.append("interrupted")
        raise KeyboardInterrupt  # the run dies in its first stage-2 step, after the stage-1 checkpoint
    monkeypatch.setattr(first.rewards.stage2, "score", interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    assert stage2 == ["interrupted"]
    assert [p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*")] == ["step-000001"]
    (stage1_metrics,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert stage1_metrics["reward_stage"] == 1 and stage1_metrics["reward"] == 0.25

    resumed = RLTrainer(constant_stages(tmp_path, tiny_causal_lm_dir), FakeClient(), ROWS)
    resumed.train()
    assert resumed.state.step == 2
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [(m["step"], m["reward_stage"], m["reward"]) for m in metrics] == [(1, 1, 0.25), (2, 2, 0.75)]


@pytest.mark.slow
def test_a_run_scores_stage_1_by_eq_7_and_stage_2_by_eq_10_with_the_frozen_generator(tmp_path, tiny_causal_lm_dir):
    generator = ScriptedGenerator()
    trainer = RLTrainer(qagent_config(tmp_path, tiny_causal_lm_dir), FakeClient(), ROWS, generator=generator)
    trainer.train()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [(m["step"], m["reward_stage"]) for m in metrics] == [(1, 1), (2, 2)]
    stage1, stage2 = metrics
    assert stage1["reward"] == pytest.approx(stage1["valid_format"] * stage1["em"]) == 0.0  # Eq. 7: format x EM
    assert "submodule_contains_em" not in stage1 and len(generator.calls) == 1, "the generator reads stage 2 only"
    (prompts,) = generator.calls  # one batched call for the step's two rollouts
    assert len(prompts) == 2 and all("capital of" in prompt for prompt in prompts)
    assert stage2["reward"] == pytest.approx(stage2["submodule_contains_em"] + 0.5 * stage2["hit"])  # Eq. 10


@pytest.mark.parametrize("config_file", ["configs/qagent_grpo.yaml", "configs/qagent_quickstart.yaml"])
def test_the_shipped_qagent_configs_build_and_switch_to_stage_2(config_file):
    from pathlib import Path

    from agentic_retriever.app.config_loader import build_config

    path = Path(__file__).resolve().parents[3] / config_file
    config = build_config(RLConfig, "agent_train", None, str(path))
    config.validate()
    assert config.rewards == ["qagent_stage1", "qagent_stage2"] and config.uses_generator
    assert config.env.dialect == "qagent" and config.env.topk == 1 and config.algorithm == "grpo"
    assert 1 <= config.stage2.after_step < config.steps
