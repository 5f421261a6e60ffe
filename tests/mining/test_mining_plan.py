"""The cost of mining before it runs (`mine run --plan.only`) and beside what it spent (mining_stats.json)."""

from __future__ import annotations

import json

import pytest

from agentic_retriever.app.cli import main
from agentic_retriever.mining import merge_shards
from agentic_retriever.mining.plan import PlanConfig, merge_plans, plan_mining, token_counter
from tests.mining.test_mining_pipeline import config, run, trajectories


@pytest.fixture
def trajectory_file(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories()))
    return path


def test_a_run_records_its_plan_beside_what_it_spent(trajectory_file, tmp_path):
    result, _, _ = run(trajectory_file, tmp_path / "out")
    stats = json.loads(result.stats_path.read_text())
    plan, cost = stats["plan"], stats["cost"]
    # t1 and t2 two rounds each, t3 four (its fifth search is past round_index_limit), t4 none: 8 rounds
    assert (plan["trajectories"], plan["rounds"], plan["measured_on_trajectories"]) == (4, 8, 4)
    assert plan["stages"]["candidates"]["requests"] == cost["candidates"]["sequences"] == 8
    subs, lr, gac = plan["stages"]["sub_answers"], plan["stages"]["local_relevance"], plan["stages"]["gac"]
    assert subs["requests"] == cost["sub_answers"]["sequences"] == 3  # one per trajectory with a round
    assert subs["prompt_tokens"] == cost["sub_answers"]["prompt_tokens"]  # the same prompts, the same tokenizer
    assert lr["requests"] == 8 * 2  # two windows of 10 per round; the run also retried one and skipped one round
    assert cost["local_relevance"]["sequences"] == 18
    assert gac["continuations"] == 8 * 20 and gac["requests"] >= cost["gac"]["sequences"] and plan["gac_is_upper_bound"]
    assert gac["prompt_tokens"] >= cost["gac"]["prompt_tokens"]


def test_merged_shards_sum_their_plans(trajectory_file, tmp_path):
    for i in range(2):
        run(trajectory_file, tmp_path / "out", shard=(i, 2))
    merged = json.loads(merge_shards(tmp_path / "out", 2).stats_path.read_text())["plan"]
    whole = json.loads(run(trajectory_file, tmp_path / "whole")[0].stats_path.read_text())["plan"]
    assert (merged["trajectories"], merged["rounds"]) == (whole["trajectories"], whole["rounds"]) == (4, 8)
    assert merged["stages"]["local_relevance"]["requests"] == whole["stages"]["local_relevance"]["requests"]
    assert merge_plans([{}, {}]) == {}


def test_before_the_rollouts_the_plan_reads_the_questions_and_its_assumptions():
    count, name = token_counter("")
    assert name == "characters / 4" and count("x" * 9) == 3
    plan = plan_mining(config(), [], 1000, PlanConfig(searches_per_question=1.5), count, count, {"scorer": name})
    stages = plan["stages"]
    assert plan["rounds"] == 1500 and plan["assumed"]["searches_per_question"] == 1.5
    assert stages["sub_answers"]["requests"] == 1000 and stages["local_relevance"]["requests"] == 3000
    assert stages["gac"]["continuations"] == 30_000 and stages["gac"]["requests"] == 45_000  # 1.5 turns each
    assert stages["local_relevance"]["prompt_tokens"] > 3000 * 10 * 140  # ten 140-token passages per window


def test_mine_run_plan_only_prints_the_plan_and_loads_no_model(trajectory_file, tmp_path, tiny_causal_lm_dir,
                                                               capsys, monkeypatch):
    import agentic_retriever.base.llm as llm_package

    monkeypatch.setattr(llm_package, "load_llm", lambda *a, **k: pytest.fail("the plan loads no model"))
    main(["mine", "run", "--trajectories", str(trajectory_file), "--index", str(tmp_path / "none"),
          "--agent.model", tiny_causal_lm_dir, "--scorer.model", tiny_causal_lm_dir, "--out", str(tmp_path / "m"),
          "--plan.only"])
    printed = capsys.readouterr().out
    assert "4 trajectories, 8 rounds (2.0 per trajectory, measured on 4)" in printed
    assert f"tokens counted with {{'scorer': '{tiny_causal_lm_dir}', 'agent': '{tiny_causal_lm_dir}'}}" in printed
    assert "| gac (160 continuations) |" in printed and not (tmp_path / "m").exists()
    main(["mine", "run", "--trajectories", str(tmp_path / "later.jsonl"), "--index", str(tmp_path / "none"),
          "--agent.model", "", "--scorer.model", "", "--plan.only", "--plan.questions", "100", "--plan.samples", "2"])
    assert "200 trajectories, 400 rounds" in capsys.readouterr().out
    assert main(["mine", "run", "--trajectories", str(tmp_path / "later.jsonl"), "--index", "x", "--plan.only"]) == 2
    assert "--plan.qa QA or --plan.questions N" in capsys.readouterr().err
