"""The CPU-scale experiment's bookkeeping (benchmarks/experiments/mining/mining_experiment.py): which splits it
refuses, how many mined rows come from questions the agent saw, and the gain split by whether a dev evidence page
was trained on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.sft import WarmStartConfig
from agentic_retriever.base.corpus import Corpus

from tests.fakes import import_benchmark


@pytest.fixture(scope="module")
def experiment():
    return import_benchmark("experiments.mining.mining_experiment")


@pytest.fixture(scope="module")
def multisearch_agent():
    return import_benchmark("experiments.mining.multisearch_agent")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _leaf(qid: str, question: str, parent: str, title: str = "T") -> dict:
    return {"id": qid, "question": question, "golden_answers": ["x"], "supporting_titles": [title],
            "parent_id": parent}


def test_the_warm_start_may_not_read_a_question_mining_reads(experiment, tmp_path):
    data = tmp_path
    _write(data / "heldout.jsonl", [_leaf("h1", "Held out?", "P1")])
    _write(data / "mining.jsonl", [_leaf("m1", "Mined?", "P2"), _leaf("m2", "Also mined?", "P3")])
    _write(data / "dev.jsonl", [_leaf("d1", "Dev?", "P4")])
    config = experiment.ExperimentConfig(heldout_qa="heldout.jsonl", mining_qa="mining.jsonl", dev_qa="dev.jsonl")
    warm = _write(data / "warm.jsonl", [_leaf("w1", "Warm?", "P5"), _leaf("w2", "A sibling of a mined one?", "P3")])
    exclude = _write(data / "exclude.jsonl", [_leaf("w2", "A sibling of a mined one?", "P3")])
    rows = experiment.warm_start_rows(WarmStartConfig(qa=str(warm), exclude_qa=str(exclude)))
    assert [row["id"] for row in rows] == ["w1"]
    experiment.check_splits(config, data, rows)
    # a multi-hop warm-start question is the parent of its leaves: one whose leaves are mined is refused
    multihop = _write(data / "multihop.jsonl", [{"id": "P2", "question": "Top?", "golden_answers": ["x"],
                                                  "leaf_ids": ["m1"]}])
    with pytest.raises(ValueError, match="mining.jsonl and the warm start's questions share"):
        experiment.check_splits(config, data, experiment.warm_start_rows(
            WarmStartConfig(qa=str(warm), exclude_qa=str(exclude), multihop_qa=str(multihop))))
    # a leaf of a mined top-level question in the warm start: refused, naming both sides
    with pytest.raises(ValueError, match="mining.jsonl and the warm start's questions share"):
        experiment.check_splits(config, data, experiment.warm_start_rows(WarmStartConfig(qa=str(warm))))
    # multi-hop mining questions are the parents of their leaves: one whose leaf is held out is refused
    _write(data / "mining_multihop.jsonl", [{"id": "P1", "question": "Top one?", "golden_answers": ["x"],
                                              "leaf_ids": ["h1"]}])
    with pytest.raises(ValueError, match="heldout.jsonl and mining_multihop.jsonl share 1"):
        experiment.check_splits(experiment.ExperimentConfig(heldout_qa="heldout.jsonl", dev_qa="dev.jsonl",
                                                            mining_qa="mining_multihop.jsonl"), data, rows)
    # the same question in other words under the normaliser, in dev and in the selection slice
    _write(data / "dev.jsonl", [_leaf("d1", "held out", "P9")])
    with pytest.raises(ValueError, match="heldout.jsonl and dev.jsonl share"):
        experiment.check_splits(config, data, rows)


def test_mined_rows_from_questions_the_agent_saw_are_counted(experiment, tmp_path):
    mining = _write(tmp_path / "mining.jsonl", [_leaf("m1", "Mined?", "P2"), _leaf("m2", "Other?", "P3"),
                                                _leaf("m3", "Third?", "P4")])
    rows = _write(tmp_path / "rows.jsonl", [{"query_id": qid, "question": q, "passage_ids": ["0"]}
                                            for qid, q in (("m1", "Mined?"), ("m2", "Other?"), ("m3", "Third?"))])
    warm = [_leaf("w1", "mined", "P7"), _leaf("w2", "Unrelated?", "P3"), _leaf("w3", "Unrelated too?", "P8")]
    # m1: the same question after normalisation; m2: a sibling leaf (same top-level question); m3: unseen
    assert experiment.rows_from_seen_questions(rows, mining, warm) == {"rows": 3, "from_questions_the_agent_saw": 2}


def test_the_gain_is_split_by_whether_the_dev_evidence_page_was_a_training_positive(experiment, tmp_path):
    corpus_path = _write(tmp_path / "corpus.jsonl", [{"id": str(i), "contents": f'"Page {i}"\ntext {i}'}
                                                     for i in range(4)])
    rows = _write(tmp_path / "rows.jsonl", [{"query_id": "m1", "passage_ids": ["1", "2", "3"]}])
    positives = experiment.positive_titles(rows, Corpus.open(corpus_path))
    assert positives == {"Page 1"}
    dev = _write(tmp_path / "dev.jsonl", [_leaf(f"d{i}", f"Dev {i}?", "P", f"Page {i % 2}") for i in range(8)])

    def report(values):
        per_question = [{"id": f"d{i}", "recall@1": v, "mrr@10": v} for i, v in enumerate(values)]
        return {"metrics": {}, "per_question": per_question}

    base = {mode: report([0.0] * 8) for mode in ("none", "parent")}
    # the trained model gains on the questions whose page was a positive (odd ids: Page 1) only
    trained = {mode: report([float(i % 2) for i in range(8)]) for mode in ("none", "parent")}
    split = experiment.gain_by_training_positives(base, trained, dev, positives, ["recall@1", "mrr@10"], 200)
    seen, unseen = split["evidence page trained on"], split["evidence page not trained on"]
    assert seen["questions"] == unseen["questions"] == 4
    assert seen["none"]["recall@1"]["diff"] == 1.0 and unseen["parent"]["mrr@10"]["diff"] == 0.0
    table = experiment.render({"leaf_questions": 8, "audits": {}, "systems": {
        "base": {"leaf": {m: {"metrics": {k: 0.0 for k in experiment.LEAF_METRICS}} for m in ("none", "parent")}},
        "full": {"leaf": {m: {"metrics": {k: 0.5 for k in experiment.LEAF_METRICS}} for m in ("none", "parent")},
                 "seen": {"rows": 1, "from_questions_the_agent_saw": 0}, "by_training_positives": split}}})
    assert "| full | - | 1 (0) | 0.500 | 0.500 |" in table
    assert "| full | evidence page trained on: 4 | +1.000 [+1.000, +1.000]" in table


def test_the_multisearch_comparison_pairs_questions_and_skips_missing_values(multisearch_agent):

    def report(values):
        return {"per_question": [{"id": qid, "evidence_recall": v, "answer_recall": 0.0, "em": 0.0, "f1": 0.0}
                                 for qid, v in values.items()]}

    single = report({"a": 0.0, "b": 0.5, "c": None, "d": 0.0})
    multi = report({"a": 1.0, "b": 0.5, "c": 1.0})  # "c" has no evidence in the corpus, "d" was not rolled out
    comparison = multisearch_agent.compare_agents(single, multi, 200)
    assert comparison["evidence_recall"]["diff"] == pytest.approx(0.5)  # over a and b only
    assert comparison["em"]["diff"] == 0.0
    behaviour = {"distinct_queries": 1.0, "answered": 1.0}
    reports = {"single-search": {"metrics": {"evidence_recall": 0.25, "answer_recall": 0, "em": 0, "f1": 0,
                                             "searches": 1.0, **behaviour}},
               "multi-search": {"metrics": {"evidence_recall": 0.75, "answer_recall": 0, "em": 0, "f1": 0,
                                            "searches": 3.5, **behaviour}}}
    table = multisearch_agent.render(reports, comparison, 2)
    assert "| single-search | 0.250 |" in table and "| multi-search | 0.750 (+0.500 [" in table
    assert table.rstrip().endswith("| 3.50 | 1.00 | 1.00 |")


def test_the_gold_decomposition_reference_searches_the_leaves_within_the_budget(multisearch_agent, tmp_path):
    from agentic_retriever.index import IndexBuildConfig, build_index

    pages = {"Busan": "Busan camellia symbol flower city", "Daegu": "Daegu magnolia symbol flower city",
             "Ulsan": "Ulsan pear blossom symbol flower city", "Korea": "Korea metropolitan cities list"}
    pages.update({f"Filler {i}": f"unrelated filler passage number {i} about rivers" for i in range(20)})
    corpus = _write(tmp_path / "corpus.jsonl", [{"id": str(i), "title": title, "text": text}
                                                for i, (title, text) in enumerate(pages.items())])
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "bm25"), backend="bm25"))
    leaves = _write(tmp_path / "leaves.jsonl", [
        _leaf("l1", "Korea metropolitan cities?", "P1"), _leaf("l2", "Busan camellia flower?", "P1"),
        _leaf("l3", "Daegu magnolia flower?", "P1"), _leaf("l4", "Gwangju flower?", "P1")])
    evidence = ["Korea", "Busan", "Daegu", "Gwangju"]  # Gwangju's page is not in the corpus
    parents = _write(tmp_path / "parents.jsonl", [
        {"id": "P1", "question": "Korea's cities and their flowers?", "supporting_titles": evidence,
         "leaf_ids": ["l1", "l2", "l3", "l4"]}])

    ceiling = multisearch_agent.gold_decomposition_recall(str(tmp_path / "bm25"), parents, leaves, 10, topk=1,
                                                          budget=2)
    assert (ceiling["first"], ceiling["all"], ceiling["in_corpus"]) == (0.5, 0.75, 0.75)
    assert "the first 2: evidence recall 0.500; all (4.0 per question): 0.750" in multisearch_agent.render_ceiling(
        ceiling)

    _write(leaves, [_leaf("l1", "Korea metropolitan cities?", "P1")])
    with pytest.raises(ValueError, match=r"leaves.jsonl: no leaf question with id 'l2' \(a leaf of 'P1'"):
        multisearch_agent.gold_decomposition_recall(str(tmp_path / "bm25"), parents, leaves, 10, topk=1, budget=2)


def _audit(evidence_auc, answer_auc=0.5, rounds=3):
    return {"auc": {"evidence": {"gac": {"absent": False, "mean": evidence_auc, "rounds": rounds}},
                    "answer": {"gac": {"absent": False, "mean": answer_auc, "rounds": rounds}}}}


def test_the_gac_target_is_the_one_whose_gac_ranks_evidence_highest(experiment):
    assert experiment.pick_gac_target({"final": _audit(0.55), "sub_question": _audit(0.71)}) == "sub_question"
    assert experiment.pick_gac_target({"final": _audit(0.71, answer_auc=0.1), "sub_question": _audit(0.6)}) == "final"
    assert experiment.pick_gac_target({"final": _audit(0.6), "sub_question": _audit(0.6)}) == "final"  # tie: first
    with pytest.raises(ValueError, match="sub_question"):
        experiment.pick_gac_target({"final": _audit(0.6), "sub_question": _audit(None)})


def test_the_experiment_config_refuses_unknown_ablations_and_an_empty_choice(experiment):
    assert experiment.ExperimentConfig(ablations=["full", "w/o GAC"]).ablations == ["full", "w/o GAC"]
    with pytest.raises(ValueError, match="must include 'full'"):
        experiment.ExperimentConfig(ablations=["w/o GAC"])
    with pytest.raises(ValueError, match="w/o BM25"):
        experiment.ExperimentConfig(ablations=["full", "w/o BM25"])
    with pytest.raises(ValueError, match="gac_target_questions"):
        experiment.ExperimentConfig(gac_targets=["final", "sub_question"], gac_target_questions=0)


def test_gac_criteria_are_chosen_with_the_target_and_named_by_both(experiment):
    settings = experiment.ExperimentConfig(gac_targets=["final", "sub_question"], gac_criteria=["gain", "part_gain"])
    assert experiment.gac_settings(settings, "gain") == {
        "final, gain": ("final", "gain"), "final, part_gain": ("final", "part_gain"),
        "sub_question, gain": ("sub_question", "gain"), "sub_question, part_gain": ("sub_question", "part_gain")}
    alone = experiment.ExperimentConfig(gac_targets=["final"])
    assert experiment.gac_settings(alone, "part_gain") == {"final": ("final", "part_gain")}  # the mining config's
    with pytest.raises(ValueError, match="unknown max"):
        experiment.ExperimentConfig(gac_targets=["final"], gac_criteria=["gain", "max"])
    with pytest.raises(ValueError, match="list experiment.gac_targets too"):
        experiment.ExperimentConfig(gac_criteria=["part_gain"])


def test_the_chosen_gac_target_is_reported_with_both_aucs(experiment):
    choice = {"chosen": "sub_question", "questions": 16,
              "targets": {"final": {"evidence_auc": {"mean": 0.55, "rounds": 40}, "answer_auc": {"mean": None,
                                                                                                  "rounds": 0}},
                          "sub_question": {"evidence_auc": {"mean": 0.71, "rounds": 40},
                                           "answer_auc": {"mean": 0.9, "rounds": 12}}}}
    table = experiment.render({"leaf_questions": 0, "systems": {}, "audits": {}, "gac_target_choice": choice})
    assert "16 held-out multi-hop questions" in table and "**sub_question**" in table
    assert "| final | 0.550 (40) | - |" in table and "| sub_question | 0.710 (40) | 0.900 (12) |" in table


def test_the_agent_table_shows_how_the_agent_searched_beside_what_it_found(experiment):
    leaf = {m: {"metrics": {k: 0.0 for k in experiment.LEAF_METRICS}} for m in ("none", "parent")}
    behaviour = {"searches": 3.5, "distinct_queries": 1.75, "answered": 0.4}

    def agent(recall):
        return {"questions": 2, "metrics": {"evidence_recall": recall, "answer_recall": 0.0, "em": 0.0, "f1": 0.0,
                                            **behaviour}}

    diff = {"diff": 0.1, "ci_low": 0.02, "ci_high": 0.2}
    table = experiment.render({"leaf_questions": 2, "audits": {}, "systems": {
        "base": {"leaf": leaf, "agent": agent(0.2)},
        "full": {"leaf": leaf, "agent": agent(0.3), "agent_vs_base": {"evidence_recall": diff}}}})
    assert "| base | 0.200 | 0.000 | 0.000 | 0.000 | 3.50 | 1.75 | 0.40 |" in table
    assert "| full | 0.300 (+0.100 [+0.020, +0.200]) | 0.000 | 0.000 | 0.000 | 3.50 | 1.75 | 0.40 |" in table


def test_a_variant_that_mined_no_row_is_reported_and_the_next_one_leads(experiment, tmp_path):
    empty = _write(tmp_path / "full.jsonl", [])
    some = _write(tmp_path / "wo_gac.jsonl", [{"query_id": "q1"}, {"query_id": "q2"}])
    assert experiment.rows_mined(empty) == 0 and experiment.rows_mined(some) == 2
    def mined(rows):
        return {name: experiment.rows_mined(path) for name, path in rows.items()}

    assert experiment.primary_variant(mined({"full": empty, "w/o GAC": some})) == "w/o GAC"
    assert experiment.primary_variant(mined({"full": some, "w/o GAC": empty})) == "full"
    with pytest.raises(ValueError, match="no variant mined a training row: full, w/o GAC"):
        experiment.primary_variant(mined({"full": empty, "w/o GAC": empty}))

    leaf = {m: {"metrics": {k: 0.0 for k in experiment.LEAF_METRICS}} for m in ("none", "parent")}
    audit = {"evidence": {"positive_is_member": 0, "mined_rounds_with_member": 0, "member_as_negative": 0},
             "false_negatives": {"by_candidate": {"answer": 0, "negatives": 0}},
             "auc": {"evidence": {s: {"absent": True} for s in ("lr", "gac", "retriever")}}}
    table = experiment.render({"leaf_questions": 2, "audits": {"full": audit, "w/o GAC": audit},
                               "primary": "w/o GAC", "no_rows": ["full"],
                               "systems": {"base": {"leaf": leaf}, "w/o GAC": {"leaf": leaf, "rows": {"examples": 2}}}})
    assert "| full | 0 | 0 / 0 |" in table and "| w/o GAC | 2 | 0 / 0 |" in table
    assert "Mined no training row, so not trained: full" in table and "use **w/o GAC**" in table


def test_the_agent_runs_with_the_base_the_primary_variant_and_the_unselected_diagnostic(experiment):
    diagnostic = experiment.unselected_name("w/o GAC")
    systems = {"base": {}, "full": {}, "w/o GAC": {"kept": "base"}, diagnostic: {"kept": "last epoch"}}
    assert experiment.agent_systems(systems, "w/o GAC") == ["base", "w/o GAC", diagnostic]
    assert experiment.agent_systems({"base": {}, "full": {"kept": "epoch-2"}}, "full") == ["base", "full"]
    other = experiment.unselected_name("w/o GAC")  # unselected_variant: a variant other than the primary one
    assert experiment.agent_systems({"base": {}, "full": {}, "w/o GAC": {}, other: {}}, "full") == ["base", "full", other]
    with pytest.raises(ValueError, match="unselected_variant must be one of"):
        experiment.ExperimentConfig(ablations=["full"], unselected_variant="w/o GAC")


def test_the_gac_threshold_is_chosen_with_the_target_by_the_evidence_f1_of_the_pass_decision(experiment, tmp_path):
    def rnd(question_id, gains):
        return {"question_id": question_id, "candidates": [{"title": title, "gac": gain} for title, gain in gains]}

    evidence = {"P1": {"Busan", "Daegu"}, "P2": {"Ulsan"}}
    final = _write(tmp_path / "final.jsonl", [
        rnd("P1", [("Busan", 0.6), ("Seoul", 0.02), ("Daegu", 0.1)]),
        rnd("P2", [("Ulsan", 0.3), ("Tokyo", None)])])  # None: GAC not scored on this candidate
    wide = _write(tmp_path / "sub.jsonl", [
        rnd("P1", [("Busan", 0.9), ("Seoul", 0.9), ("Daegu", 0.9)]), rnd("P2", [("Ulsan", 0.9), ("Tokyo", 0.9)])])
    table = experiment.gac_decisions(final, evidence, [0.5, 0.2, 0.05])
    assert [(r["passing"], r["evidence_passing"]) for r in table] == [(1, 1), (2, 2), (3, 3)]
    assert table[0]["candidates"] == 4 and table[0]["evidence"] == 3
    assert table[2]["f1"] == pytest.approx(1.0) and table[0]["f1"] == pytest.approx(0.5)
    decisions = {"final": table, "sub_question": experiment.gac_decisions(wide, evidence, [0.5, 0.2, 0.05])}
    assert experiment.pick_gac_setting(decisions) == ("final", 0.05)
    assert decisions["sub_question"][0]["precision"] == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="passed no evidence page"):
        experiment.pick_gac_setting({"final": experiment.gac_decisions(final, evidence, [1.0])})
    with pytest.raises(ValueError, match="list experiment.gac_targets too"):
        experiment.ExperimentConfig(gac_thresholds=[0.2])

    choice = {"chosen": "final", "threshold": 0.05, "questions": 2,
              "targets": {name: {"evidence_auc": {"mean": 0.7, "rounds": 2}, "answer_auc": {"mean": None, "rounds": 0},
                                 "decisions": rows} for name, rows in decisions.items()}}
    text = experiment.render({"leaf_questions": 0, "systems": {}, "audits": {}, "gac_target_choice": choice})
    assert "pass decision: **final, 0.05**" in text
    assert "| final | 0.5 | 1 / 4 | 1 / 3 | 1.00 | 0.33 | 0.50 |" in text


def test_each_gac_setting_is_reselected_from_the_full_runs_stores_and_tabled(experiment, tmp_path, monkeypatch):
    (tmp_path / "mining" / "full" / "stages").mkdir(parents=True)
    (tmp_path / "mining" / "full" / "stages" / "gac.jsonl").write_text("{}\n")
    runs = []

    def fake_mine(job, gac_rounds=None):  # the real one loads two LLMs: here only what selection would report
        selection = job.mining.selection
        runs.append((job.mining.gac_criterion, selection.gac_threshold, selection.lr_threshold, Path(job.out)))
        rescored = 1 if selection.gac_threshold == 0.05 else 0
        stats = {"rows": int(10 * selection.gac_threshold) + int(selection.lr_threshold < 50),
                 "rounds": {"in": 9, "dropped": {"no_gac_pass": 4}},
                 "this_run": {"gac": {"computed": rescored}, "local_relevance": {"computed": 0}}}
        return SimpleNamespace(stats=stats)

    monkeypatch.setattr("agentic_retriever.mining.reselect.run_mine_job", fake_mine)
    stale = tmp_path / "mining" / "gac_settings" / "gain-0.5-lr-50" / "stages"  # copied when fewer rounds were mined
    stale.mkdir(parents=True)
    (stale / "gac.jsonl").write_text("")
    config = experiment.ExperimentConfig(gac_targets=["final", "sub_question"], gac_criteria=["gain", "part_gain"],
                                         gac_thresholds=[0.5, 0.3])
    job = experiment.MineJobConfig()
    job = dataclasses.replace(job, mining=dataclasses.replace(
        job.mining, selection=dataclasses.replace(job.mining.selection, lr_threshold=50)))
    table = experiment.rows_by_gac_setting(job, tmp_path, config)
    assert [(r["criterion"], r["threshold"], r["lr_threshold"], r["rows"]) for r in table] == [
        ("gain", 0.5, 50, 5), ("gain", 0.3, 50, 3), ("part_gain", 0.5, 50, 5), ("part_gain", 0.3, 50, 3)]
    assert all((out / "stages" / "gac.jsonl").read_text() == "{}\n" for *_, out in runs)  # each on a fresh copy
    assert len({out for *_, out in runs}) == 4
    text = "\n".join(experiment.render_rows_by_gac_setting(table))
    assert "| LR threshold | rows | rounds | no_gac_pass |" in text and "| final | part_gain | 0.3 | 50 | 3 | 9 | 4 |" in text
    with pytest.raises(RuntimeError, match="rescored"):
        experiment.rows_by_gac_setting(job, tmp_path, dataclasses.replace(config, gac_thresholds=[0.05]))

    # a lower LR threshold reads GAC of rounds below mine_run's own: only when every round got GAC
    lower = dataclasses.replace(config, gac_criteria=["gain"], gac_thresholds=[0.3], lr_thresholds=[50, 20])
    with pytest.raises(ValueError, match="skip_hopeless_gac false"):
        experiment.rows_by_gac_setting(job, tmp_path, lower)
    every_round = dataclasses.replace(job, mining=dataclasses.replace(job.mining, skip_hopeless_gac=False))
    table = experiment.rows_by_gac_setting(every_round, tmp_path, lower)
    assert [(r["lr_threshold"], r["rows"]) for r in table] == [(50, 3), (20, 4)]
    assert runs[-1][2] == 20 and runs[-1][3].name == "gain-0.3-lr-20"
    with pytest.raises(ValueError, match="list gac_thresholds too"):
        experiment.ExperimentConfig(gac_targets=["final"], lr_thresholds=[20])


def test_mining_samples_sample_only_the_mining_rollouts(experiment):
    rollout = experiment.RolloutConfig(qa="q.jsonl")
    greedy = experiment.mining_rollout_config(rollout, experiment.ExperimentConfig())
    assert (greedy.samples, greedy.env.temperature) == (1, 0.0)
    sampled = experiment.mining_rollout_config(rollout, experiment.ExperimentConfig(mining_samples=3,
                                                                                    mining_temperature=0.8))
    assert (sampled.samples, sampled.env.temperature) == (3, 0.8) and rollout.env.temperature == 0.0
    with pytest.raises(ValueError, match="mining_temperature"):
        experiment.ExperimentConfig(mining_samples=2, mining_temperature=0.0)


def test_experiment_settings_are_overridden_by_flags(experiment, tmp_path):
    config_file = tmp_path / "experiment.yaml"
    config_file.write_text("experiment:\n  workdir: runs/x\n  mining_questions: 72\n  ablations: [full, w/o GAC]\n")
    args, config = experiment.parse_arguments(["--config", str(config_file), "--mining-samples", "2",
                                               "--mining-temperature", "0.5"])
    assert (config.workdir, config.mining_questions, config.ablations) == ("runs/x", 72, ["full", "w/o GAC"])
    assert (config.mining_samples, config.mining_temperature, args.config) == (2, 0.5, str(config_file))
    _, config = experiment.parse_arguments(["--config", str(config_file), "--mining-questions", "36"])
    assert (config.mining_questions, config.mining_samples) == (36, 1)
    with pytest.raises(ValueError, match="mining_temperature"):
        experiment.parse_arguments(["--config", str(config_file), "--mining-samples", "2", "--mining-temperature", "0"])
