"""RL steps end to end with the multi-stage reward of "Learning When to Search" (section 3.3, Eqs. 6-12): a tiny
random policy in the reflect dialect, the real `WhenToSearchReward` with a tiny query encoder, stage 1 then stage 2,
and the per-step metrics the trainer writes (the reward's terms, the shape, the search decision)."""

from __future__ import annotations

import json

import pytest

from agent.env import EnvConfig
from agent.rl import RLConfig, RLTrainer
from agent.rl.config import SecondStage
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.qa_sources import QARow
from tests.fakes import FakeClient

ROWS = [QARow("a", "capital of france?", ("Paris",)), QARow("b", "capital of norway?", ("Oslo",))]


@pytest.mark.slow
def test_a_two_stage_run_scores_each_step_by_its_stage_and_logs_the_terms_the_shape_and_the_search_decision(
        tmp_path, tiny_causal_lm_dir, tiny_model_dir):
    config = RLConfig(agent=LLMConfig(model=tiny_causal_lm_dir), out=str(tmp_path / "run"), algorithm="grpo",
                      steps=2, prompts_per_step=1, samples_per_prompt=2, micro_batch_size=2, actor_lr=1e-3,
                      clip_high=0.28, loss_aggregation="token-mean", kl_coef=1e-4, kl_placement="loss",
                      env=EnvConfig(dialect="reflect", max_turns=1, topk=1, max_new_tokens_per_turn=8,
                                    temperature=1.0, max_context_tokens=1500),
                      reward="when_to_search_stage1", stage2=SecondStage("when_to_search_stage2", {}, after_step=1),
                      search_encoder=EncoderConfig(model=tiny_model_dir, device="cpu"), progress=False,
                      report_to=["none"])
    trainer = RLTrainer(config, FakeClient(), ROWS)
    policy = trainer.train()

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [(m["step"], m["reward_stage"]) for m in metrics] == [(1, 1), (2, 2)]
    for m in metrics:
        assert m["reward"] == pytest.approx(m["r_answer"] + m["r_search"] + m["r_format"])
        assert m["r_format"] == pytest.approx(2 * m["valid_format"] - 1)  # +1 / -1 by the shape (Eq. 6)
        assert m["correct_by_judge"] == 0.0  # no judge configured: exact match decides
        assert 0.0 <= m["answered_without_search"] <= 1.0 and m["searches"] >= 0.0
    assert (policy / "rl_manifest.json").is_file()
    assert json.loads((policy / "rl_manifest.json").read_text())["steps"] == 2
