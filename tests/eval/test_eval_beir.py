"""BEIR-format evaluation (agentic_retriever/eval/beir.py): the folder reader, BEIR's graded nDCG, Recall and MRR
checked against values computed by hand, the identical-id rule, and `eval retrieval --beir` end to end."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from agentic_retriever.base.corpus import Corpus
from agentic_retriever.eval.beir import evaluate_beir, load_beir
from agentic_retriever.eval.ranking import query_measures
from agentic_retriever.base.jsonl import DataFormatError
from tests.fakes import write_jsonl

DOCS = {  # BEIR corpus rows; "q3" is also a query id (as in ArguAna, where queries are documents)
    "d1": ("Violin", "The violin is a string instrument played with a bow."),
    "d2": ("Viola", "The viola is a slightly larger bowed string instrument."),
    "d3": ("Guitar", "A guitar is plucked, not bowed."),
    "d4": ("Comet", "A comet is an icy body that releases gas near the Sun."),
    "d5": ("Volcano", "A volcano is a rupture in the crust where lava escapes."),
    "d6": ("Harbor", "A harbor shelters ships from the sea."),
    "q3": ("Lava", "Where does lava escape?"),
}
QUERIES = {"q1": "bowed string instrument", "q2": "icy body releasing gas", "q3": "where does lava escape",
           "q4": "a query the test split does not judge", "q5": "sheltered ships"}
QRELS = [("q1", "d1", 2), ("q1", "d2", 1), ("q1", "d3", 0), ("q2", "d4", 1), ("q3", "d5", 1), ("q5", "d6", 0)]
RANKINGS = {  # what the fake index returns, best first
    "q1": ["d3", "d2", "d6", "d1", "d5"],
    "q2": ["d1", "d2", "d3", "d4", "d5"],
    "q3": ["q3", "d5", "d1", "d2", "d3"],
    "q5": ["d6", "d1", "d2", "d3", "d4"],
}


def write_beir(folder, qrels=QRELS, queries=QUERIES, split="test"):
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "corpus.jsonl",
                [{"_id": i, "title": t, "text": x, "metadata": {}} for i, (t, x) in DOCS.items()])
    write_jsonl(folder / "queries.jsonl", [{"_id": i, "text": t, "metadata": {}} for i, t in queries.items()])
    (folder / "qrels").mkdir(exist_ok=True)
    (folder / "qrels" / f"{split}.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels))
    return folder


def indexable_corpus(beir_folder, out):
    """The BEIR corpus as {id, title, text} rows with the same ids (what `index build` reads today)."""
    rows = [json.loads(line) for line in (beir_folder / "corpus.jsonl").read_text().splitlines()]
    return write_jsonl(out, [{"id": r["_id"], "title": r["title"], "text": r["text"]} for r in rows])


class FixedIndex:
    """An index over a real corpus whose rankings are fixed per query text; records the k it was asked for."""

    def __init__(self, corpus, rankings):
        self.corpus, self.composition, self.asked = corpus, "query", []
        self.by_text = {QUERIES[qid]: ranking for qid, ranking in rankings.items()}

    def search(self, queries, k, questions=None):
        self.asked.append(k)
        return SimpleNamespace(ids=[self.by_text[q][:k] for q in queries])


@pytest.fixture
def beir(tmp_path):
    folder = write_beir(tmp_path / "beir")
    corpus = Corpus.open(indexable_corpus(folder, tmp_path / "corpus.jsonl"))
    return folder, FixedIndex(corpus, RANKINGS)


def test_the_reader_keeps_the_judged_queries_in_qrels_order_with_graded_scores(beir):
    folder, _ = beir
    dataset = load_beir(folder)
    assert list(dataset.queries) == ["q1", "q2", "q3", "q5"]  # q4 is not judged in the split
    assert dataset.queries["q3"] == "where does lava escape"
    assert dataset.qrels["q1"] == {"d1": 2, "d2": 1, "d3": 0} and dataset.qrels["q5"] == {"d6": 0}


def _measure(name: str):
    """A BEIR measure as a function of (ranked ids, qrels, k), as trec_eval computes it."""
    return lambda ranked, qrels, k: query_measures(ranked, qrels, [f"{name}@{k}"])[f"{name}@{k}"]


beir_ndcg_at_k, beir_recall_at_k, beir_mrr_at_k = _measure("ndcg"), _measure("recall"), _measure("mrr")


def test_metrics_by_hand_graded_ndcg_recall_and_mrr():
    ranked, qrels = RANKINGS["q1"], {"d1": 2, "d2": 1, "d3": 0}
    # d3 (score 0) is not relevant; d2 (1) at rank 2, d1 (2) at rank 4; the ideal puts 2 then 1 first
    dcg = 1 / math.log2(3) + 2 / math.log2(5)
    assert beir_ndcg_at_k(ranked, qrels, 5) == pytest.approx(dcg / (2 + 1 / math.log2(3)))
    assert beir_ndcg_at_k(ranked, qrels, 3) == pytest.approx((1 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert beir_recall_at_k(ranked, qrels, 1) == 0.0 and beir_recall_at_k(ranked, qrels, 3) == 0.5
    assert beir_recall_at_k(ranked, qrels, 4) == 1.0
    assert beir_mrr_at_k(ranked, qrels, 1) == 0.0 and beir_mrr_at_k(ranked, qrels, 3) == 0.5
    assert beir_ndcg_at_k(ranked, {"d6": 0}, 5) == 0.0 and beir_recall_at_k(ranked, {"d6": 0}, 5) == 0.0
    assert beir_ndcg_at_k(["a", "b"], {"a": 3, "b": 3}, 10) == pytest.approx(1.0)
    # a lower grade first scores below the ideal order
    assert beir_ndcg_at_k(["b", "a"], {"a": 3, "b": 1}, 10) == pytest.approx(
        (1 + 3 / math.log2(3)) / (3 + 1 / math.log2(3)))


def test_evaluation_averages_over_every_judged_query_as_beir(beir):
    folder, index = beir
    report = evaluate_beir(index, load_beir(folder), ks=[1, 3], mrr_k=3, ndcg_k=5)
    per = {p["id"]: p for p in report["per_question"]}
    q1 = (1 / math.log2(3) + 2 / math.log2(5)) / (2 + 1 / math.log2(3))
    q2 = 1 / math.log2(5)  # d4 at rank 4 of 1 relevant
    assert per["q1"]["ndcg@5"] == pytest.approx(q1) and per["q2"]["ndcg@5"] == pytest.approx(q2)
    assert per["q3"] == {"id": "q3", "first_relevant_rank": 1, "relevant": 1, "recall@1": 1.0, "recall@3": 1.0,
                         "mrr@3": 1.0, "ndcg@5": 1.0}  # the document "q3" is the query itself: dropped
    assert per["q5"]["ndcg@5"] == 0.0 and per["q5"]["first_relevant_rank"] is None
    metrics = report["metrics"]
    assert list(metrics) == ["ndcg@5", "recall@1", "recall@3", "mrr@3"]
    assert metrics["ndcg@5"] == pytest.approx((q1 + q2 + 1 + 0) / 4)
    assert metrics["recall@1"] == pytest.approx(1 / 4)
    assert metrics["recall@3"] == pytest.approx((0.5 + 0 + 1 + 0) / 4)
    assert metrics["mrr@3"] == pytest.approx((0.5 + 0 + 1 + 0) / 4)
    assert report["questions_evaluated"] == 4 and report["queries_without_relevant"] == 1
    assert report["qrels_documents_missing_from_index"] == 0
    assert index.asked == [6]  # one more than the deepest cut-off, for the dropped identical id


def test_identical_ids_count_when_asked(beir):
    folder, index = beir
    report = evaluate_beir(index, load_beir(folder), ks=[1, 3], mrr_k=3, ndcg_k=5, ignore_identical_ids=False)
    q3 = next(p for p in report["per_question"] if p["id"] == "q3")
    assert q3["recall@1"] == 0.0 and q3["mrr@3"] == 0.5 and q3["ndcg@5"] == pytest.approx(1 / math.log2(3))
    assert index.asked == [5]


def test_an_index_over_another_corpus_is_refused_and_missing_documents_are_counted(beir, tmp_path):
    folder, index = beir
    other = Corpus.open(write_jsonl(tmp_path / "other.jsonl", [{"id": "x", "title": "X", "text": "x"}]))
    with pytest.raises(ValueError, match=r"none of the 6 documents judged .* build the index over .*corpus\.jsonl"):
        evaluate_beir(FixedIndex(other, RANKINGS), load_beir(folder))
    extra = write_beir(tmp_path / "extra", qrels=[*QRELS, ("q2", "gone", 1)])
    report = evaluate_beir(index, load_beir(extra), ks=[3], mrr_k=3, ndcg_k=5)
    assert report["qrels_documents_missing_from_index"] == 1
    q2 = next(p for p in report["per_question"] if p["id"] == "q2")
    assert q2["relevant"] == 2 and q2["recall@3"] == 0.0  # the missing document still counts as relevant


def test_reader_errors_name_the_file_line_and_field(tmp_path):
    folder = write_beir(tmp_path / "a", qrels=[*QRELS, ("q9", "d1", 1)])
    with pytest.raises(DataFormatError, match=r"test\.tsv:8: field 'query-id': query id 'q9' is not in .*queries"):
        load_beir(folder)
    folder = write_beir(tmp_path / "b", qrels=[("q1", "d1", "high")])
    with pytest.raises(DataFormatError, match=r"test\.tsv:2: field 'score': expected an integer, got 'high'"):
        load_beir(folder)
    with pytest.raises(FileNotFoundError, match=r"no qrels for split 'dev'.*splits there: test"):
        load_beir(write_beir(tmp_path / "c"), split="dev")
    bad = write_beir(tmp_path / "d")
    write_jsonl(bad / "queries.jsonl", [{"_id": "q1", "text": "x"}, {"id": "q2", "text": "y"}])
    with pytest.raises(DataFormatError, match=r"queries\.jsonl:2: field '_id'"):
        load_beir(bad)


def test_index_build_reads_the_beir_corpus_as_it_is(tmp_path):
    from agentic_retriever.index import IndexBuildConfig, build_index, open_index

    folder = write_beir(tmp_path / "beir")
    build_index(IndexBuildConfig(corpus=str(folder / "corpus.jsonl"), out=str(tmp_path / "bm25"), backend="bm25"))
    index = open_index(tmp_path / "bm25")
    assert index.corpus.get(["q3"])[0].title == "Lava"


def test_cli_evaluates_a_beir_folder_and_keeps_the_qa_path(tmp_path, capsys):
    from agentic_retriever.app.cli import main
    from agentic_retriever.index import IndexBuildConfig, build_index

    folder = write_beir(tmp_path / "beir")
    corpus = indexable_corpus(folder, tmp_path / "corpus.jsonl")
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "bm25"), backend="bm25"))
    out = tmp_path / "report.json"
    args = ["eval", "retrieval", "--index", str(tmp_path / "bm25"), "--beir", str(folder), "--ks", "1", "3"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "nDCG@10" in printed and "4 queries of" in printed and "1 of them without a relevant document" in printed
    assert "warning" not in printed  # same ids, same number of documents
    report = json.loads(out.read_text())
    assert report["beir"] == str(folder) and report["split"] == "test"
    assert set(report["metrics"]) == {"ndcg@10", "recall@1", "recall@3", "mrr@10"}
    assert all(0.0 <= v <= 1.0 for v in report["metrics"].values())
    q3 = next(p for p in report["per_question"] if p["id"] == "q3")
    assert q3["first_relevant_rank"] == 1  # BM25 puts d5 first once the query's own document is dropped
    assert main([*args, "--compare-to", str(out)]) == 0 and "diff +0.000" in capsys.readouterr().out

    assert main(["eval", "retrieval", "--index", str(tmp_path / "bm25")]) == 2
    assert "give exactly one of --qa FILE" in capsys.readouterr().err
    assert main([*args, "--qa", str(tmp_path / "qa.jsonl")]) == 2

    subset = write_jsonl(tmp_path / "subset.jsonl", [json.loads(line) for line in corpus.read_text().splitlines()[:5]])
    build_index(IndexBuildConfig(corpus=str(subset), out=str(tmp_path / "bm25-subset"), backend="bm25"))
    assert main(["eval", "retrieval", "--index", str(tmp_path / "bm25-subset"), "--beir", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "is not " in printed and "(7 lines)" in printed and "documents the qrels judge are not in" in printed
