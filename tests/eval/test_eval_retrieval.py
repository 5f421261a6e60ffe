import math

import pytest

from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.eval.ranking import measure_rankings, query_measures
from agentic_retriever.eval.retrieval import evaluate_retrieval, load_judged_questions
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from tests.fakes import write_jsonl


def _measure(name: str):
    """One ranking measure as a function of (ranked keys, relevant keys, k), as trec_eval computes it."""
    return lambda ranked, relevant, k: query_measures(ranked, relevant, [f"{name}@{k}"])[f"{name}@{k}"]


recall_at_k, mrr_at_k, ndcg_at_k = _measure("recall"), _measure("mrr"), _measure("ndcg")


def test_metrics_on_hand_computed_cases():
    ranked = ["a", "x", "b", "y", "c"]
    relevant = {"a", "b", "z"}
    assert recall_at_k(ranked, relevant, 1) == pytest.approx(1 / 3)
    assert recall_at_k(ranked, relevant, 5) == pytest.approx(2 / 3)
    assert mrr_at_k(["x", "y", "b"], relevant, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["x", "y", "b"], relevant, 2) == 0.0
    dcg = 1 + 1 / math.log2(4)
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(ranked, relevant, 5) == pytest.approx(dcg / ideal)
    assert ndcg_at_k(["a"], {"a"}, 10) == 1.0


def test_a_relevant_title_counts_once_at_its_first_passage():
    ranked_titles = ["T", "T", "U", "T"]
    assert recall_at_k(ranked_titles, {"T"}, 4) == 1.0
    assert ndcg_at_k(ranked_titles, {"T", "U"}, 4) == pytest.approx((1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3)))
    # a repeated title keeps its place: U is third, not second
    assert mrr_at_k(["T", "T", "U"], {"U"}, 10) == pytest.approx(1 / 3) and recall_at_k(["T", "T", "U"], {"U"}, 2) == 0


def test_queries_without_a_relevant_key_or_a_ranking_score_zero_and_the_others_are_trec_evals():
    qrels = {"a": {"x": 0}, "b": {"x": 1}, "c": {"x": 1}}
    values = measure_rankings({"a": ["x", "y"], "b": [], "c": ["y", "x"]}, qrels, ["recall@1", "mrr@10", "success@2"])
    assert values["a"] == values["b"] == {"recall@1": 0.0, "mrr@10": 0.0, "success@2": 0.0}
    assert values["c"] == {"recall@1": 0.0, "mrr@10": 0.5, "success@2": 1.0}
    with pytest.raises(ValueError, match="unknown ranking measure 'map@5'"):
        query_measures(["x"], {"x"}, ["map@5"])


def test_evaluation_by_title_and_by_id_skips_questions_without_relevant_passages(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [
        {"id": "p0", "title": "Violin", "text": "The violin is a string instrument played with a bow."},
        {"id": "p1", "title": "Comet", "text": "A comet is an icy body that releases gas near the Sun."},
        {"id": "p2", "title": "Volcano", "text": "A volcano is a rupture in the crust where lava escapes."},
    ])
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "bm25"), backend="bm25"))
    qa = write_jsonl(tmp_path / "qa.jsonl", [
        {"id": "1", "question": "which instrument is played with a bow", "golden_answers": ["violin"], "supporting_titles": ["Violin"]},
        {"id": "2", "question": "icy body releasing gas", "golden_answers": ["comet"], "supporting_ids": ["p1"]},
        {"id": "3", "question": "where does lava escape", "golden_answers": ["x"], "supporting_titles": ["Comet"]},
        {"id": "4", "question": "not in corpus", "golden_answers": ["x"], "supporting_titles": ["Nowhere"]},
    ])
    report = evaluate_retrieval(open_index(tmp_path / "bm25"), load_judged_questions(str(qa)), ks=[1, 3])
    assert report["questions_evaluated"] == 3 and report["questions_skipped_no_relevant_in_corpus"] == 1
    ranks = {p["id"]: p["first_relevant_rank"] for p in report["per_question"]}
    assert ranks["1"] == 1 and ranks["2"] == 1 and ranks["3"] in (2, 3)
    assert report["metrics"]["recall@1"] == pytest.approx(2 / 3)
    assert report["metrics"]["recall@3"] == 1.0


def test_a_row_without_relevance_labels_is_an_error_naming_line_and_field(tmp_path):
    qa = write_jsonl(tmp_path / "qa.jsonl", [
        {"id": "1", "question": "q", "supporting_titles": ["T"]},
        {"id": "2", "question": "q", "golden_answers": ["a"]},
    ])
    with pytest.raises(DataFormatError, match=r"qa\.jsonl:2: field 'supporting_titles'"):
        load_judged_questions(str(qa))


def test_report_table_marks_metrics_a_system_lacks():
    from agentic_retriever.eval.report import render_table

    table = render_table({"dense": {"recall@5": 0.5, "agent_em": 0.25}, "bm25": {"recall@5": 0.25}})
    lines = table.splitlines()
    assert lines[0] == "| index | Recall@5 | agent_em |"
    assert lines[2] == "| dense | 0.500 | 0.250 |" and lines[3] == "| bm25 | 0.250 | – |"


def _answer_corpus(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [
        {"id": "p0", "contents": '"Abacus"\nThe abacus sold 1234 units in its first year.'},
        {"id": "p1", "contents": '"Dice"\nA die has 6 faces; some games roll 4 dice at once.'},
        {"id": "p2", "contents": '"Volcano"\nA volcano is a rupture in the crust where lava escapes.'},
    ])
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "bm25"), backend="bm25"))
    return open_index(tmp_path / "bm25")


def test_answer_recall_matches_gold_on_word_boundaries_only():
    from agentic_retriever.eval.retrieval import answer_recall_at_k, first_answer_rank

    passages = ['"Abacus"\nThe abacus sold 1234 units.', '"Dice"\nPlayers roll 4 dice.']
    assert answer_recall_at_k(passages, ["4"], 1) == 0.0
    assert answer_recall_at_k(passages, ["4"], 2) == 1.0
    assert first_answer_rank(passages, ["4"], 2) == 2
    assert answer_recall_at_k(passages, ["The ABACUS!"], 1) == 1.0  # normalised: case, punctuation, articles
    assert answer_recall_at_k(passages, [["123", "dice"]], 2) == 1.0  # nested alternatives


def test_answer_recall_counts_only_rows_with_golden_answers(tmp_path):
    index = _answer_corpus(tmp_path)
    qa = write_jsonl(tmp_path / "qa.jsonl", [
        {"id": "a", "question": "abacus units sold first year", "golden_answers": ["4"], "supporting_titles": ["Abacus"]},
        {"id": "b", "question": "how many dice games roll", "golden_answers": ["4"], "supporting_titles": ["Dice"]},
        {"id": "c", "question": "lava crust rupture", "supporting_titles": ["Volcano"]},
        {"id": "d", "question": "lava crust rupture", "golden_answers": [], "supporting_titles": ["Volcano"]},
    ])
    report = evaluate_retrieval(index, load_judged_questions(str(qa)), ks=[1, 3])
    assert report["questions_evaluated"] == 4 and report["questions_with_answers"] == 2
    per = {p["id"]: p for p in report["per_question"]}
    assert per["a"]["answer_recall@1"] == 0.0  # "1234" in the top passage is not the answer "4"
    assert per["a"]["answer_recall@3"] == 1.0 and per["a"]["first_answer_rank"] > 1
    assert per["b"]["answer_recall@1"] == 1.0 and per["b"]["first_answer_rank"] == 1
    assert per["c"]["answer_recall@1"] is None and per["d"]["answer_recall@3"] is None
    assert report["metrics"]["answer_recall@1"] == pytest.approx(0.5)
    assert report["metrics"]["answer_recall@3"] == 1.0
    assert all("recall@1" in p and "mrr@10" in p and "ndcg@10" in p for p in report["per_question"])


def test_an_answer_of_several_parts_scores_its_share_and_yes_no_answers_are_left_out(tmp_path):
    """A list answer's joined golden string ("abacus, dice, violin") occurs in no passage: its parts are scored one by
    one. A yes/no answer would match any passage with the word "no": it is not an answer recall question."""
    index = _answer_corpus(tmp_path)
    qa = write_jsonl(tmp_path / "qa.jsonl", [
        {"id": "list", "question": "abacus units sold first year", "golden_answers": ["abacus, dice, violin"],
         "answer_parts": [["abacus"], ["dice"], ["violin"]], "supporting_titles": ["Abacus"]},
        {"id": "dict", "question": "how many dice games roll", "golden_answers": ["Dice: 6, Kite: 2"],
         "answer_parts": [["Dice", "6"], ["Kite", "2"]], "supporting_titles": ["Dice"]},
        {"id": "yes", "question": "lava crust rupture", "golden_answers": ["no"], "supporting_titles": ["Volcano"]},
    ])
    report = evaluate_retrieval(index, load_judged_questions(str(qa)), ks=[1, 3])
    per = {p["id"]: p for p in report["per_question"]}
    assert per["list"]["answer_recall@3"] == pytest.approx(2 / 3)  # abacus and dice are in the corpus, violin not
    assert per["dict"]["answer_recall@3"] == pytest.approx(1 / 2)  # "Dice" (or "6") found, neither "Kite" nor "2"
    assert per["yes"]["answer_recall@3"] is None and report["questions_with_answers"] == 2
    assert report["metrics"]["answer_recall@3"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "x", "question": "q", "golden_answers": ["a, b"],
                                                "answer_parts": [["a"], []], "supporting_titles": ["Dice"]}])
    with pytest.raises(DataFormatError, match="answer_parts"):
        load_judged_questions(str(bad))


class _RecordingIndex:
    """Wraps a real index and records the `questions` every search call received."""

    def __init__(self, inner):
        self.inner, self.corpus, self.received = inner, inner.corpus, []

    def search(self, queries, k, questions=None):
        self.received.append(questions)
        return self.inner.search(queries, k, questions)


def _leaf_and_parents(tmp_path, parent_of_second="P2"):
    leaves = write_jsonl(tmp_path / "leaf.jsonl", [
        {"id": "l1", "question": "how many dice games roll", "golden_answers": ["4"], "supporting_titles": ["Dice"],
         "parent_id": "P1"},
        {"id": "l2", "question": "lava crust rupture", "golden_answers": ["lava"], "supporting_titles": ["Volcano"],
         "parent_id": parent_of_second},
        {"id": "l3", "question": "not in corpus", "golden_answers": ["x"], "supporting_titles": ["Nowhere"],
         "parent_id": "P1"},
    ])
    parents = write_jsonl(tmp_path / "multihop.jsonl", [
        {"id": "P1", "question": "parent one?", "golden_answers": ["x"]},
        {"id": "P2", "question": "parent two?", "golden_answers": ["y"]},
    ])
    return leaves, parents


def test_composition_passes_parent_questions_to_the_index_per_judged_question(tmp_path):
    from agentic_retriever.eval.retrieval import composition_questions

    index = _RecordingIndex(_answer_corpus(tmp_path))
    leaves, parents = _leaf_and_parents(tmp_path)
    questions = load_judged_questions(str(leaves))
    composed = composition_questions(questions, "parent", str(parents))
    assert composed == ["parent one?", "parent two?", "parent one?"]
    report = evaluate_retrieval(index, questions, ks=[1], batch_size=1, search_questions=composed)
    assert report["questions_evaluated"] == 2  # l3 is skipped, and so is its parent question
    assert index.received == [["parent one?"], ["parent two?"]]
    assert composition_questions(questions, "self") == [q.question for q in questions]
    assert composition_questions(questions, "none") is None
    evaluate_retrieval(index, questions, ks=[1])
    assert index.received[-1] is None


def test_a_leaf_whose_parent_is_missing_is_an_error_naming_file_line_and_field(tmp_path):
    from agentic_retriever.eval.retrieval import composition_questions

    leaves, parents = _leaf_and_parents(tmp_path, parent_of_second="P9")
    questions = load_judged_questions(str(leaves))
    with pytest.raises(DataFormatError, match=r"leaf\.jsonl:2: field 'parent_id': parent id 'P9' is not in .*multihop\.jsonl"):
        composition_questions(questions, "parent", str(parents))
    no_parent = write_jsonl(tmp_path / "plain.jsonl", [{"id": "1", "question": "q", "supporting_titles": ["Dice"]}])
    with pytest.raises(DataFormatError, match=r"plain\.jsonl:1: field 'parent_id': missing"):
        composition_questions(load_judged_questions(str(no_parent)), "parent", str(parents))


def test_bm25_ignores_the_composition_questions(tmp_path):
    index = _answer_corpus(tmp_path)
    queries = ["dice games", "lava"]
    plain = index.search(queries, 3)
    composed = index.search(queries, 3, questions=["volcano abacus", "abacus dice"])
    assert plain.ids == composed.ids and plain.scores == composed.scores


def test_cli_compares_two_reports_question_by_question(tmp_path, capsys):
    from agentic_retriever.app.cli import main

    _answer_corpus(tmp_path)
    leaves, parents = _leaf_and_parents(tmp_path)
    base_args = ["eval", "retrieval", "--index", str(tmp_path / "bm25"), "--qa", str(leaves), "--ks", "1", "3"]
    assert main([*base_args, "--out", str(tmp_path / "base.json")]) == 0
    assert main([*base_args, "--compose-with", "parent", "--parent-qa", str(parents),
                 "--compare-to", str(tmp_path / "base.json"), "--out", str(tmp_path / "other.json")]) == 0
    out = capsys.readouterr().out
    assert "answer_recall@3" in out and "answer recall over the 2 with golden answers" in out
    assert "recall@1: " in out and "diff +0.000" in out  # BM25 ignores the parent questions
    import json
    other = json.loads((tmp_path / "other.json").read_text())
    assert other["compose_with"] == "parent" and other["comparison"]["results"]["answer_recall@3"]["n"] == 2


def test_flashrag_rows_without_evidence_labels_are_judged_by_answer_recall_alone(tmp_path):
    """FlashRAG's QA rows ({id, question, golden_answers, metadata}) carry no evidence labels: relevance
    ``answers`` reads none, leaves the evidence metrics out of the means, and skips a row without answers."""
    from agentic_retriever.eval.retrieval import has_evidence_labels

    index = _answer_corpus(tmp_path)
    qa = write_jsonl(tmp_path / "nq_dev.jsonl", [
        {"id": "dev_0", "question": "abacus units sold first year", "golden_answers": ["1234"], "metadata": {}},
        {"id": "dev_1", "question": "how many dice games roll", "golden_answers": ["4", "four"], "metadata": {}},
        {"id": "dev_2", "question": "lava crust rupture", "golden_answers": [], "metadata": {}},
    ])
    assert not has_evidence_labels(str(qa))
    with pytest.raises(DataFormatError, match=r"nq_dev\.jsonl:1: field 'supporting_titles'"):
        load_judged_questions(str(qa))  # auto needs labels, and says how to do without
    report = evaluate_retrieval(index, load_judged_questions(str(qa), "answers"), ks=[1, 3])
    assert report["questions_evaluated"] == report["questions_judged_by_answers"] == 2
    assert set(report["metrics"]) == {"answer_recall@1", "answer_recall@3"}
    assert report["metrics"]["answer_recall@1"] == 1.0
    per = report["per_question"]
    assert [p["id"] for p in per] == ["dev_0", "dev_1"] and per[0]["recall@1"] is None


def test_parent_or_self_composes_a_row_without_a_parent_with_its_own_question(tmp_path):
    from agentic_retriever.eval.retrieval import composition_questions

    leaves, parents = _leaf_and_parents(tmp_path)
    mixed = load_judged_questions(str(leaves)) + load_judged_questions(str(write_jsonl(tmp_path / "top.jsonl", [
        {"id": "t1", "question": "a top-level question?", "golden_answers": ["x"], "supporting_titles": ["Dice"]}])))
    assert composition_questions(mixed, "parent_or_self", str(parents)) == [
        "parent one?", "parent two?", "parent one?", "a top-level question?"]
    assert composition_questions(mixed[3:], "parent_or_self") == ["a top-level question?"]  # no parent file needed
    with pytest.raises(ValueError, match="needs parent_qa"):
        composition_questions(mixed, "parent_or_self")


def test_trec_evals_figures_are_the_stated_definitions_on_random_title_rankings_with_repeats():
    """The module's definitions, written out here as the oracle: a relevant key counts once at its first rank,
    repeats keep their places; the figures our tables printed before ir-measures computed them."""
    import random

    def first_hits(ranked, relevant, k):
        seen, ranks = set(), []
        for rank, key in enumerate(ranked[:k], start=1):
            if key in relevant and key not in seen:
                seen.add(key)
                ranks.append(rank)
        return ranks

    def oracle(ranked, relevant, k):
        hits = first_hits(ranked, relevant, k)
        ideal = sum(1 / math.log2(r + 1) for r in range(1, min(len(relevant), k) + 1))
        return {f"recall@{k}": len(hits) / len(relevant), f"mrr@{k}": 1 / hits[0] if hits else 0.0,
                f"ndcg@{k}": sum(1 / math.log2(r + 1) for r in hits) / ideal}

    rng = random.Random(7)
    titles = [f"title {i}" for i in range(25)]
    rankings, qrels, expected = {}, {}, {}
    for q in range(300):
        ranked = [rng.choice(titles) for _ in range(20)]
        relevant = set(rng.sample(titles, rng.randint(1, 4)))
        rankings[str(q)], qrels[str(q)] = ranked, dict.fromkeys(relevant, 1)
        expected[str(q)] = oracle(ranked, relevant, 1) | oracle(ranked, relevant, 5) | oracle(ranked, relevant, 10)
    got = measure_rankings(rankings, qrels, list(expected["0"]))
    assert all(got[q][name] == pytest.approx(value, abs=1e-12) for q in expected for name, value in expected[q].items())
