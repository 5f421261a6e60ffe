"""Utility mining end to end with fake agent/scorer LLMs and a fake retriever: rows, statistics, resume after a
kill, selective recomputation, shards, ablations and the deviation scorers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_retriever.mining import MiningConfig, SelectionConfig, merge_shards, mine, parse_shard
from agentic_retriever.mining.shards import shard_dir
from tests.fakes import FakeAgent, FakeScorer, Killed, answer_turn, make_trajectory, make_world, search_turn

GILLEY = "Mickey Gilley"
WORLD = make_world({
    # GAC=1: j0 (LR 90) and j2 (LR 70); j3 is the most relevant but leads to a wrong answer
    "urban cowboy club": [(90, GILLEY), (85, None), (70, GILLEY), (95, "Gilley's Club")] + [(20, None)] * 16,
    # two candidates tie on (GAC 1, LR 80): two positives, two rows
    "gilleys club founder": [(80, GILLEY), (80, GILLEY), (40, None)] + [(15, None)] * 19,
    "freedonia capital": [(50, "Fredville")] + [(30, None)] * 19,  # nothing relevant enough: no rollouts
    "garbled query": [(10, None), (75, "Fredville")] + [(20, None)] * 18,  # parses on the retry
    "hopeless query": [(90, "x")] * 20,  # never parses
    "tiny topic": [(90, "x")] * 10,  # too few candidates
    "no answer topic": [(90, None)] * 20,  # relevant, but no candidate leads to the answer
})


def trajectories() -> list:
    def hits(topic):
        return [WORLD.corpus[i] for i in WORLD.topics[topic][:3]]

    def searches(*topics):
        return [search_turn(t, hits(t)) for t in topics]

    return [
        make_trajectory("t1", "Who founded the honky tonk of Urban Cowboy?", [GILLEY],
                        searches("urban cowboy club", "gilleys club founder") + [answer_turn(GILLEY)], GILLEY),
        make_trajectory("t2", "What is the capital of Freedonia?", ["Fredville"],
                        searches("freedonia capital", "garbled query") + [answer_turn("Sylvania")], "Sylvania"),
        make_trajectory("t3", "What is x?", ["x"],
                        searches("hopeless query", "tiny topic", "no answer topic", "urban cowboy club",
                                 "gilleys club founder") + [answer_turn("y")], "y"),
        make_trajectory("t4", "Who wrote Hamlet?", ["Shakespeare"], [answer_turn("Shakespeare")], "Shakespeare"),
    ]


@pytest.fixture
def trajectory_file(tmp_path) -> Path:
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories()))
    return path


def config(**overrides) -> MiningConfig:
    settings = {"progress": False, "plot": False, "scorer_batch_prompts": 4, "gac_batch_pairs": 40,
                "selection": SelectionConfig(), **overrides}
    return MiningConfig(**settings)


def run(trajectory_file, out, agent=None, scorer=None, cfg=None, **kwargs):
    agent = agent if agent is not None else FakeAgent()
    scorer = scorer if scorer is not None else FakeScorer()
    result = mine(trajectory_file, WORLD, agent, scorer, cfg or config(), out, **kwargs)
    return result, agent, scorer


def rows_of(result) -> list[dict]:
    return [json.loads(line) for line in result.rows_path.read_text().splitlines()]


def lr_prompts(scorer) -> list[str]:
    return scorer.prompts("utility score")


def test_end_to_end_rows_are_in_the_released_format_with_existing_passages(trajectory_file, tmp_path):
    result, _, _ = run(trajectory_file, tmp_path / "out", cfg=config(plot=True))
    rows = rows_of(result)
    assert [(r["query_id"], r["round_index"], r["passage_ids"][0]) for r in rows] == [
        ("t1", 1, "urban_cowboy_club-0"), ("t1", 2, "gilleys_club_founder-0"), ("t1", 2, "gilleys_club_founder-1"),
        ("t2", 2, "garbled_query-1")]
    for row in rows:
        assert list(row) == ["dataset", "query_id", "question", "round_index", "history_queries", "query_text",
                             "passage_ids", "scores"]
        assert len(row["passage_ids"]) == 16 == len(set(row["passage_ids"])) == len(row["scores"])
        assert all(pid in WORLD.corpus for pid in row["passage_ids"])
        assert row["scores"][0]["em"] == 1 and row["scores"][0]["local_utility"] >= 0.6
        assert all(set(s) == {"em", "local_utility", "gac"} and s["em"] in (0, 1) and 0 <= s["local_utility"] <= 1
                   for s in row["scores"])
        assert row["dataset"] == "trajectories"
    first = rows[0]
    assert first["question"] == "Who founded the honky tonk of Urban Cowboy?" and first["history_queries"] == []
    assert first["query_text"] == "urban cowboy club" and first["scores"][0] == {"em": 1, "local_utility": 0.9, "gac": 1.0}
    assert rows[1]["history_queries"] == ["urban cowboy club"]
    assert "gilleys_club_founder-0" not in rows[2]["passage_ids"][1:]  # a positive is never its own negative
    assert result.plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_statistics_say_what_went_in_was_dropped_and_cost(trajectory_file, tmp_path):
    result, agent, scorer = run(trajectory_file, tmp_path / "out")
    stats = json.loads(result.stats_path.read_text())
    assert stats == json.loads(json.dumps(result.stats))
    assert stats["trajectories"] == 4 and stats["rows"] == 4
    assert stats["rounds"] == {"in": 9, "mined": 3, "dropped_total": 6, "dropped": {
        "no_gac_pass": 2, "lr_below_threshold": 1, "lr_parse_failed": 1, "round_index_limit": 1,
        "too_few_candidates": 1}}
    assert stats["positives_per_round"] == {"1": 2, "2": 1}
    assert stats["sub_answers"]["trajectories"] == 3 and stats["sub_answers"]["given"] == 7
    lr = stats["local_relevance"]
    assert (lr["windows"], lr["windows_first_try"], lr["windows_after_retry"], lr["windows_failed"]) == (14, 10, 2, 2)
    assert lr["parse_rate"] == round(12 / 14, 4) and (lr["with_sub_answer"], lr["without_sub_answer"]) == (5, 2)
    assert sum(lr["histogram"].values()) == 120 and lr["histogram"]["90-100"] == 2 * 2 + 20  # urban club twice, no-answer topic
    assert stats["lr_scorer"] == "listwise (window 10)" and stats["scorer_model"] == "fake-scorer"
    gac = stats["gac"]
    assert (gac["rounds"], gac["candidates"], gac["correct"], gac["rounds_with_correct"]) == (5, 100, 5, 3)
    cost = stats["cost"]
    assert cost["local_relevance"]["calls"] == pytest.approx(len([c for c in scorer.calls if "utility score" in c[0]]))
    assert cost["gac"]["calls"] == pytest.approx(len(agent.calls)) and cost["gac"]["completion_tokens"] > 0
    assert cost["sub_answers"]["sequences"] == pytest.approx(3) and cost["local_relevance"]["prompt_tokens"] > 0
    assert stats["this_run"]["candidates"]["computed"] == 8  # rounds that reach retrieval (per query + question)
    assert stats["prompt_version"] and stats["config"]["lr_window"] == 10


@pytest.mark.parametrize("who, fail_after, stage, stored, lost", [
    # sub-answers and the first LR batch (2 rounds) done, killed when the 2nd batch starts
    ("scorer", 2, "local_relevance", 2, 0),
    # killed after a batch whose windows needed a retry
    ("scorer", 4, "local_relevance", 4, 0),
    # the first rollout batch (2 rounds x 20 candidates, 2 agent steps) done, killed in the 2nd step of the next:
    # the in-flight batch's first step is lost work
    ("agent", 3, "gac", 2, 1),
])
def test_a_run_killed_mid_stage_resumes_to_the_same_rows_without_duplicates(trajectory_file, tmp_path, who,
                                                                              fail_after, stage, stored, lost):
    whole, agent, scorer = run(trajectory_file, tmp_path / "whole")
    killed = {"agent": FakeAgent(fail_after=fail_after)} if who == "agent" else \
        {"scorer": FakeScorer(fail_after=fail_after)}
    with pytest.raises(Killed):
        run(trajectory_file, tmp_path / "resumed", **killed)
    assert not (tmp_path / "resumed" / "retriever_train.jsonl").exists()
    assert len((tmp_path / "resumed" / "stages" / f"{stage}.jsonl").read_text().splitlines()) == stored
    resumed, agent2, scorer2 = run(trajectory_file, tmp_path / "resumed")
    assert resumed.rows_path.read_bytes() == whole.rows_path.read_bytes()
    for store in (tmp_path / "resumed" / "stages").glob("*.jsonl"):
        keys = [json.loads(line)["key"] for line in store.read_text().splitlines()]
        assert len(keys) == len(set(keys)), f"duplicated records in {store.name}"
    # finished batches were not recomputed: the killed run's finished calls + the resumed run's = one whole run
    dead = killed.get("agent") or killed["scorer"]
    live, whole_llm = (agent2, agent) if who == "agent" else (scorer2, scorer)
    assert len(dead.calls) - lost + len(live.calls) == len(whole_llm.calls)
    # the cost of the stored results does not depend on how many runs computed them
    for name, cost in whole.stats["cost"].items():
        for field in ("sequences", "prompt_tokens", "completion_tokens"):
            assert resumed.stats["cost"][name][field] == pytest.approx(cost[field], abs=1e-3), (name, field)
    # and a third run recomputes nothing
    again, agent3, scorer3 = run(trajectory_file, tmp_path / "resumed")
    assert agent3.calls == [] and scorer3.calls == [] and again.rows_path.read_bytes() == whole.rows_path.read_bytes()


def test_changing_one_setting_recomputes_only_the_stages_it_affects(trajectory_file, tmp_path):
    out = tmp_path / "out"
    base, agent, scorer = run(trajectory_file, out)
    # the LR window: local relevance only (same scores here, so GAC is reused too)
    window, agent, scorer = run(trajectory_file, out, cfg=config(lr_window=20))
    assert agent.calls == [] and scorer.prompts("Expert Trajectory Analyst") == []
    assert len(lr_prompts(scorer)) == 7 + 2 and all("Search Query and 20 passages" in p for p in lr_prompts(scorer))
    assert rows_of(window) == rows_of(base)
    # a selection setting: nothing
    stricter, agent, scorer = run(trajectory_file, out, cfg=config(selection=SelectionConfig(lr_threshold=85, seed=7)))
    assert agent.calls == [] and scorer.calls == []
    assert [r["passage_ids"][0] for r in rows_of(stricter)] == ["urban_cowboy_club-0"]
    # the GAC metric: GAC only
    _, agent, scorer = run(trajectory_file, out, cfg=config(gac_metric="contains"))
    assert scorer.calls == [] and len(agent.calls) > 0
    # sub-answers off: local relevance again (Figure 7 everywhere), no sub-answer call
    _, agent, scorer = run(trajectory_file, out, cfg=config(use_sub_answers=False))
    assert agent.calls == [] and scorer.prompts("Expert Trajectory Analyst") == []
    assert lr_prompts(scorer) and not any("Reference Answer" in p for p in lr_prompts(scorer))
    # back to the first settings: everything is still stored
    back, agent, scorer = run(trajectory_file, out)
    assert agent.calls == [] and scorer.calls == [] and back.rows_path.read_bytes() == base.rows_path.read_bytes()


def test_shards_merge_to_the_unsharded_rows(trajectory_file, tmp_path):
    whole, _, _ = run(trajectory_file, tmp_path / "whole")
    with pytest.raises(FileNotFoundError, match="1-of-2"):
        run(trajectory_file, tmp_path / "sharded", shard=(0, 2))
        merge_shards(tmp_path / "sharded", 2)
    part, _, _ = run(trajectory_file, tmp_path / "sharded", shard=parse_shard("1/2"))
    assert part.out_dir == shard_dir(tmp_path / "sharded", (1, 2)) and part.stats["trajectories"] == 2
    merged = merge_shards(tmp_path / "sharded", 2, plot=False)
    assert merged.rows_path.read_bytes() == whole.rows_path.read_bytes()
    assert merged.stats["rounds"] == whole.stats["rounds"] and merged.stats["gac"] == whole.stats["gac"]
    assert merged.stats["local_relevance"]["histogram"] == whole.stats["local_relevance"]["histogram"]
    with pytest.raises(ValueError):
        parse_shard("2/2")
    run(trajectory_file, tmp_path / "sharded", shard=(0, 2), cfg=config(lr_window=20))
    with pytest.raises(ValueError, match="another config"):
        merge_shards(tmp_path / "sharded", 2)


def test_without_gac_ablation_needs_no_agent_and_ranks_by_lr(trajectory_file, tmp_path):
    scorer = FakeScorer()
    result = mine(trajectory_file, WORLD, None, scorer, config(selection=SelectionConfig(use_gac=False)), tmp_path)
    rows = rows_of(result)
    assert rows[0]["passage_ids"][0] == "urban_cowboy_club-3"  # LR 95, although it leads to a wrong answer
    assert all(s["em"] is None for r in rows for s in r["scores"])
    assert result.stats["gac"]["rounds"] == 0 and result.stats["agent_model"] is None


def test_without_lr_ablation_needs_no_scorer_and_ranks_by_gac(trajectory_file, tmp_path):
    agent = FakeAgent()
    result = mine(trajectory_file, WORLD, agent, None, config(selection=SelectionConfig(use_lr=False)), tmp_path)
    rows = rows_of(result)
    assert rows[0]["passage_ids"][0] == "urban_cowboy_club-0" and rows[1]["passage_ids"][0] == "urban_cowboy_club-2"
    assert all(s["local_utility"] is None for r in rows for s in r["scores"])
    assert result.stats["lr_scorer"] is None and result.stats["sub_answers"]["trajectories"] == 0


def test_pointwise_scorer_and_answer_likelihood_gac(trajectory_file, tmp_path):
    result, agent, scorer = run(trajectory_file, tmp_path, cfg=config(lr_scorer="pointwise", gac_mode="answer_likelihood",
                                                                      gac_criterion="sequence"))
    rows = rows_of(result)
    assert [r["passage_ids"][0] for r in rows][:3] == ["urban_cowboy_club-0", "gilleys_club_founder-0",
                                                       "gilleys_club_founder-1"]
    assert all(all(pid in WORLD.corpus for pid in r["passage_ids"]) for r in rows)
    # answer likelihood: one score() pass per (round, candidate, gold), ending at the answer tag; no rollout
    assert agent.calls and all(p.endswith("</information>\n\n<answer>") for call in agent.calls for p in call)
    assert scorer.prompts("Does the passage answer the Search Query? Answer Yes or No.")
    assert not lr_prompts(scorer)  # no listwise prompt
    stats = result.stats
    assert stats["lr_scorer"] == "pointwise judgement" and stats["local_relevance"]["parse_rate"] is None
    assert stats["gac_mode"] == "answer_likelihood (sequence)" and stats["selection"]["gac_threshold"] == 0.5


def test_bad_inputs_are_refused_with_the_reason(trajectory_file, tmp_path):
    with pytest.raises(ValueError, match="agent LLM"):
        mine(trajectory_file, WORLD, None, FakeScorer(), config(), tmp_path)
    with pytest.raises(ValueError, match="scorer LLM"):
        mine(trajectory_file, WORLD, FakeAgent(), None, config(), tmp_path)
    with pytest.raises(ValueError, match="lr_window"):
        mine(trajectory_file, WORLD, FakeAgent(), FakeScorer(), config(lr_window=0), tmp_path)

    class NoScore(FakeScorer):
        score = None

    with pytest.raises(ValueError, match="score"):
        mine(trajectory_file, WORLD, FakeAgent(), NoScore(), config(lr_scorer="pointwise"), tmp_path)
    duplicated = tmp_path / "dup.jsonl"
    duplicated.write_text(trajectory_file.read_text() + trajectory_file.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="appears twice"):
        mine(duplicated, WORLD, FakeAgent(), FakeScorer(), config(), tmp_path / "d")


def test_real_transformers_backend_runs_the_likelihood_scorers_and_rollouts(tmp_path, tiny_causal_lm_dir):
    """Mechanics on a tiny random model: pointwise LR and answer likelihood through `score`, rollout GAC."""
    from agent.env import EnvConfig
    from agentic_retriever.base.llm.transformers import TransformersLLM

    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(trajectories()[0].to_json()) + "\n")  # 2 rounds
    llm = TransformersLLM.load(tiny_causal_lm_dir, device="cpu")
    small = {"num_candidates": 4, "sub_answer_max_new_tokens": 4,
             "env": EnvConfig(max_turns=2, max_new_tokens_per_turn=4, observation_max_tokens=48)}
    for gac_mode in ("answer_likelihood", "rollout"):
        def mine_with(threshold: float, use_lr: bool = True):
            selection = SelectionConfig(num_negatives=1, lr_threshold=0, gac_threshold=threshold, use_lr=use_lr)
            return mine(path, WORLD, llm, llm, config(lr_scorer="pointwise", gac_mode=gac_mode,
                                                      gac_criterion="per_token", selection=selection, **small),
                        tmp_path / gac_mode)

        result = mine_with(0.0)
        records = [json.loads(line) for line in (result.out_dir / "rounds.jsonl").read_text().splitlines()]
        assert len(records) == 2 and all(len(r["candidates"]) == 4 for r in records)
        assert all(c["gac"] is not None and 0 <= c["lr"] <= 100 for r in records for c in r["candidates"])
        # every candidate passes a threshold of 0, and a passing candidate is never a negative: no rows
        assert result.rows == 0 and {r["drop_reason"] for r in records} == {"too_few_negatives"}
        assert result.stats["gac"]["candidates"] == 8
        assert result.stats["cost"]["local_relevance"]["prompt_tokens"] > 0
        if gac_mode == "rollout":  # the random model answers nothing right: every GAC is 0
            continue
        # GAC alone at the lower of the rounds' best values: at least one round gets a row (selection alone
        # reruns from the stores)
        result = mine_with(min(max(c["gac"] for c in r["candidates"]) for r in records), use_lr=False)
        assert result.stats["this_run"]["gac"]["computed"] == 0
        rows = rows_of(result)
        assert rows and all(len(r["passage_ids"]) == 2 for r in rows)
        assert all(p in WORLD.corpus for r in rows for p in r["passage_ids"])
        assert all(s["local_utility"] is None and s["gac"] is not None for r in rows for s in r["scores"])


def test_mining_reads_no_evidence_labels(trajectory_file, tmp_path):
    """Evidence fields (here pointing at wrong pages) change nothing: mining reads questions and gold answers."""
    labelled = tmp_path / "labelled.jsonl"
    rows = [json.loads(line) for line in trajectory_file.read_text().splitlines()]
    labelled.write_text("".join(json.dumps({**row, "supporting_titles": ["misc facts 0"], "supporting_ids": ["misc_facts-0"],
                                            "evidence": {"title": "misc facts 1"}}) + "\n" for row in rows))
    plain, _, _ = run(trajectory_file, tmp_path / "plain", cfg=config(dataset="d"))
    with_labels, _, _ = run(labelled, tmp_path / "labelled", cfg=config(dataset="d"))
    assert "supporting_titles" not in trajectory_file.read_text()
    assert plain.rows_path.read_text() == with_labels.rows_path.read_text() != ""
    assert (plain.out_dir / "rounds.jsonl").read_text() == (with_labels.out_dir / "rounds.jsonl").read_text()


def test_rounds_file_records_every_candidate_role(trajectory_file, tmp_path):
    result, _, _ = run(trajectory_file, tmp_path)
    records = {r["round_id"]: r for r in map(json.loads, (tmp_path / "rounds.jsonl").read_text().splitlines())}
    first = records["t1#1"]
    assert first["status"] == "mined" and [c["rank"] for c in first["candidates"]] == list(range(1, 21))
    roles = [c["role"] for c in first["candidates"]]
    assert roles.count("positive") == 1 and roles.count("negative") == 15
    positive = next(c for c in first["candidates"] if c["role"] == "positive")
    assert positive["id"] == "urban_cowboy_club-0" and positive["gac_pass"] and positive["lr"] >= 60
    # passing GAC but not chosen: excluded, never a negative
    assert all(c["role"] == "excluded" for c in first["candidates"] if c["gac_pass"] and c["role"] != "positive")
    assert records["t2#1"]["status"] == "dropped" and records["t2#1"]["drop_reason"] == "lr_below_threshold"


def test_lr_from_the_retriever_or_none_needs_no_scorer(trajectory_file, tmp_path):
    result = mine(trajectory_file, WORLD, FakeAgent(), None,
                  config(lr_scorer="retriever", selection=SelectionConfig(lr_threshold=97)), tmp_path / "r")
    records = [json.loads(line) for line in (tmp_path / "r" / "rounds.jsonl").read_text().splitlines()]
    assert all(c["lr"] == pytest.approx(100 * (1 - (c["rank"] - 1) / 100)) for r in records for c in r["candidates"])
    assert result.stats["lr_scorer"] == "retriever score" and result.rows > 0
    none = mine(trajectory_file, WORLD, FakeAgent(), None, config(lr_scorer="none"), tmp_path / "n")
    assert none.stats["selection"]["use_lr"] is False and none.stats["lr_scorer"] is None and none.rows > 0


def test_rounds_without_an_answer_candidate_skip_lr_and_gac_when_positives_need_the_answer(trajectory_file, tmp_path):
    # the fake passages say "ANSWER=x": no gold on word boundaries, so no round can give a positive
    result, agent, scorer = run(trajectory_file, tmp_path, cfg=config(
        selection=SelectionConfig(require_answer_in_positive=True)))
    assert result.rows == 0 and not agent.calls and not lr_prompts(scorer)
    assert result.stats["rounds"]["dropped"]["no_answer_candidate"] == 7


def test_round_posterior_lr_is_p_passage_given_query_over_the_round(trajectory_file, tmp_path):
    from agentic_retriever.mining.outputs import ROUNDS_FILE

    cfg = config(lr_scorer="pointwise", pointwise_mode="query_likelihood", lr_scale="round_posterior",
                 gac_mode="answer_likelihood", gac_criterion="sequence",
                 selection=SelectionConfig(lr_threshold=50))
    result, _, _ = run(trajectory_file, tmp_path, cfg=cfg)
    records = [json.loads(line) for line in (tmp_path / ROUNDS_FILE).read_text().splitlines()]
    for record in records:
        lr = [c["lr"] for c in record["candidates"]]
        if None not in lr:
            assert sum(lr) == pytest.approx(100, abs=0.01)  # a distribution over the round's candidates
    with pytest.raises(ValueError, match="query_likelihood"):
        run(trajectory_file, tmp_path / "judge", cfg=config(lr_scorer="pointwise", lr_scale="round_posterior",
                                                             gac_mode="answer_likelihood", gac_criterion="sequence"))


def test_sampled_trajectories_give_rounds_of_their_own_and_a_repeated_search_is_mined_once(tmp_path):
    from dataclasses import replace

    from agentic_retriever.eval.mining_audit import audit_mining

    def hits(topic):
        return [WORLD.corpus[i] for i in WORLD.topics[topic][:3]]

    question = "Who founded the honky tonk of Urban Cowboy?"
    first = make_trajectory("t1", question, [GILLEY], [search_turn("urban cowboy club", hits("urban cowboy club")),
                                                       answer_turn(GILLEY)], GILLEY)
    other = make_trajectory("t1", question, [GILLEY], [search_turn("gilleys club founder",
                                                                   hits("gilleys club founder")),
                                                       search_turn("urban cowboy club", hits("urban cowboy club")),
                                                       answer_turn(GILLEY)], GILLEY)
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in
                            (first, replace(first, sample=1), replace(other, sample=2))))
    result, _, _ = run(path, tmp_path / "out")
    assert result.stats["rounds"]["dropped"]["repeated_search"] == 1  # sample 1 searched as sample 0 did
    rows = rows_of(result)
    assert [(r["query_id"], r.get("sample", 0), r["round_index"], r["history_queries"]) for r in rows] == [
        ("t1", 0, 1, []), ("t1", 2, 1, []), ("t1", 2, 1, []), ("t1", 2, 2, ["gilleys club founder"])]
    rounds = [json.loads(line) for line in (tmp_path / "out" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round_id"] for r in rounds] == ["t1#1", "t1@2#1", "t1@2#2"]
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "t1", "question": question, "golden_answers": [GILLEY],
                              "supporting_titles": ["Gilley's"]}) + "\n")
    by_row = audit_mining(tmp_path / "out", qa)["false_negatives"]["by_row"]
    assert (by_row["rows"], by_row["rows_without_round"]) == (4, 0)  # every row found its own sample's round


def test_gac_rounds_scores_gac_only_on_the_rounds_it_picks(trajectory_file, tmp_path):
    # the caller (model selection) wants GAC where a given page is among the candidates, whatever the LR
    wanted = WORLD.corpus[WORLD.topics["freedonia capital"][0]].title
    seen = []

    def judged(rnd, candidates):
        seen.append((rnd.query, {"id", "title", "text"} <= set(candidates[0])))
        return any(c["title"] == wanted for c in candidates)

    result, agent, _ = run(trajectory_file, tmp_path, cfg=config(skip_hopeless_gac=False), gac_rounds=judged)
    records = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    with_gac = {r["query"] for r in records if any(c["gac"] is not None for c in r["candidates"])}
    assert with_gac == {"freedonia capital"}  # its best LR (50) is below the threshold: scored all the same
    assert all(has_fields for _, has_fields in seen) and "urban cowboy club" in {q for q, _ in seen}
    assert result.stats["gac"]["rounds"] == 1 and result.stats["rounds"]["dropped"]["gac_not_requested"] >= 3
    assert agent.calls and all("Freedonia" in prompt for prompt, *_ in agent.calls)


def test_skipping_hopeless_rounds_reads_the_round_posterior(trajectory_file, tmp_path):
    # the skip must read LR on the scale the threshold reads: with lr_scale round_posterior, not the stored scores
    def cfg(skip):
        return config(lr_scorer="pointwise", pointwise_mode="query_likelihood", lr_scale="round_posterior",
                      gac_mode="answer_likelihood", gac_criterion="sequence", skip_hopeless_gac=skip,
                      selection=SelectionConfig(lr_threshold=5.5))  # the fake posteriors are near uniform: 5-6

    def rounds(folder):
        return [json.loads(line) for line in (tmp_path / folder / "rounds.jsonl").read_text().splitlines()]

    skipped, _, _ = run(trajectory_file, tmp_path / "skip", cfg=cfg(True))
    scored, _, _ = run(trajectory_file, tmp_path / "all", cfg=cfg(False))
    below = {r["round_id"] for r in rounds("all")
             if r["candidates"][0]["lr"] is not None and max(c["lr"] for c in r["candidates"]) < 5.5}
    assert below and {r["round_id"] for r in rounds("skip") if r["drop_reason"] == "lr_below_threshold"} == below
    assert skipped.stats["gac"]["rounds"] == scored.stats["gac"]["rounds"] - len(below)
    assert rows_of(skipped) == rows_of(scored)
