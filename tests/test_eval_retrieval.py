import math

import pytest

from agentic_retriever.eval.retrieval import (
    evaluate_retrieval, load_judged_questions, mrr_at_k, ndcg_at_k, recall_at_k,
)
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from agentic_retriever.jsonl import DataFormatError
from conftest import write_jsonl


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
