"""BEIR-format retrieval evaluation: nDCG@k, Recall@k and MRR@k with BEIR's definitions.

A BEIR dataset folder (Thakur et al. 2021, "BEIR: A Heterogeneous Benchmark for Zero-shot Evaluation of
Information Retrieval Models", arXiv:2104.08663) holds

* ``corpus.jsonl``: the documents, ``{"_id", "title", "text"}`` (the index must be built over them, so that
  the index's corpus ids are BEIR's corpus ids);
* ``queries.jsonl``: ``{"_id", "text"}``;
* ``qrels/{split}.tsv``: ``query-id <TAB> corpus-id <TAB> score`` after one header line; the score is an
  integer relevance grade.

The evaluated queries are those of the split's qrels (BEIR's ``GenericDataLoader.load``). Per query, over the
index's ranking (best first), with ``rel(d)`` the qrels score of document d (0 when d is not judged):

* nDCG@k    = DCG@k / IDCG@k, DCG@k = sum over ranks r <= k of rel(d_r) / log2(r + 1), counting only
              rel > 0; IDCG@k the same sum over the query's qrels grades sorted best first (graded gains,
              trec_eval's ``ndcg_cut``, which BEIR computes with pytrec_eval); 0 when IDCG is 0;
* Recall@k  = |relevant documents in the top k| / |relevant documents|, relevant meaning rel > 0
              (trec_eval's ``recall_k``); 0 when the query has no relevant document;
* MRR@k     = 1 / rank of the first relevant document within k, 0 if none (BEIR's ``custom_metrics.mrr``).

All three are computed by trec_eval's own code through ir-measures (`agentic_retriever.eval.ranking`).

Each metric is averaged over all evaluated queries; a query whose qrels hold no document with rel > 0 counts
with 0 everywhere, as in BEIR (``queries_without_relevant`` reports how many). As BEIR's
``EvaluateRetrieval.evaluate`` does by default, a retrieved document whose id equals the query's id is dropped
(``ignore_identical_ids``; it matters for ArguAna and Quora, where queries are also documents); the search
then asks for one document more so that k remain. Ties keep the index's order (trec_eval re-sorts tied scores
by document id, so figures of an index with many exact ties can differ from BEIR's in the last digits).

Every metric is also kept per query (``per_question``), so two systems can be compared query by query with
`eval.bootstrap.compare_reports`.

    dataset = load_beir("datasets/scifact", split="test")
    report = evaluate_beir(open_index("index/scifact-bm25"), dataset, ks=[1, 10, 100])
    report["metrics"]["ndcg@10"], report["metrics"]["recall@100"]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from agentic_retriever.base.jsonl import DataFormatError, iter_jsonl

from .ranking import query_measures
from .retrieval import keys_in_corpus

__all__ = ["BeirDataset", "corpus_size_warning", "evaluate_beir", "load_beir"]

CORPUS_FILE = "corpus.jsonl"
QUERIES_FILE = "queries.jsonl"
QRELS_FOLDER = "qrels"


@dataclass
class BeirDataset:
    """The queries of one qrels split (in qrels order) and their graded judgements."""

    folder: Path
    split: str
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]

    @property
    def corpus_path(self) -> Path:
        return self.folder / CORPUS_FILE


# ------------------------------------------------------------------------------------------------ metrics


# ------------------------------------------------------------------------------------------------ data


def load_beir(folder: str | os.PathLike, split: str = "test") -> BeirDataset:
    """Read ``queries.jsonl`` and ``qrels/{split}.tsv`` of a BEIR folder; errors name the file, line and field.

    Only the queries the split judges are kept (in the order the qrels first name them); a query id of the qrels
    that ``queries.jsonl`` lacks is an error. A repeated (query, document) pair keeps its last score, as BEIR.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"BEIR folder not found: {folder}")
    qrels_path = folder / QRELS_FOLDER / f"{split}.tsv"
    if not qrels_path.is_file():
        available = sorted(p.stem for p in (folder / QRELS_FOLDER).glob("*.tsv"))
        raise FileNotFoundError(f"no qrels for split {split!r}: {qrels_path} does not exist"
                                + (f" (splits there: {', '.join(available)})" if available else ""))
    qrels, first_line = _read_qrels(qrels_path)
    if not qrels:
        raise DataFormatError(qrels_path, None, "no judgements after the header line")
    texts = _read_queries(folder / QUERIES_FILE)
    missing = [qid for qid in qrels if qid not in texts]
    if missing:
        raise DataFormatError(qrels_path, first_line[missing[0]],
                              f"query id {missing[0]!r} is not in {folder / QUERIES_FILE} "
                              f"({len(missing)} of the split's {len(qrels)} queries are missing)", field="query-id")
    return BeirDataset(folder, split, {qid: texts[qid] for qid in qrels}, qrels)


def _read_queries(path: Path) -> dict[str, str]:
    if not path.is_file():
        raise FileNotFoundError(f"BEIR queries not found: {path}")
    texts: dict[str, str] = {}
    for line, row in iter_jsonl(path):
        qid = row.get("_id")
        if isinstance(qid, bool) or not isinstance(qid, (str, int)):
            raise DataFormatError(path, line, "missing or not a string" if qid is None else
                                  f"expected a string id, got {type(qid).__name__}", field="_id")
        if not isinstance(row.get("text"), str):
            raise DataFormatError(path, line, "missing or not a string", field="text")
        texts[str(qid)] = row["text"]
    return texts


def _read_qrels(path: Path) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """(query id -> {corpus id: score}, query id -> the line that first names it); the first line is the header."""
    qrels: dict[str, dict[str, int]] = {}
    first_line: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line_no == 1 or not line.strip():
                continue
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) < 3:
                raise DataFormatError(path, line_no, f"expected 3 tab-separated columns (query-id, corpus-id, score), "
                                                     f"got {len(parts)}")
            qid, doc, score = parts[0], parts[1], parts[2]
            try:
                grade = int(score)
            except ValueError:
                raise DataFormatError(path, line_no, f"expected an integer, got {score!r}", field="score") from None
            qrels.setdefault(qid, {})[doc] = grade
            first_line.setdefault(qid, line_no)
    return qrels, first_line


# ------------------------------------------------------------------------------------------------ evaluation


def evaluate_beir(index, dataset: BeirDataset, ks: Sequence[int] = (1, 5, 20), mrr_k: int = 10, ndcg_k: int = 10,
                  batch_size: int = 64, ignore_identical_ids: bool = True, compose_self: bool = False) -> dict:
    """Mean and per-query nDCG@ndcg_k, Recall@k (each of `ks`) and MRR@mrr_k of `index` on `dataset`.

    The index must be built over the dataset's corpus: a qrels document id that its corpus lacks can never be
    retrieved. If no judged document of the split is in the index's corpus this is an error; if some are
    missing, they are counted in ``qrels_documents_missing_from_index`` (and lower the scores, as they would
    in BEIR). `compose_self` passes each query as its own Q to a composing encoder (``Q [SEP] q`` with Q = q).
    """
    if not ks:
        raise ValueError("give at least one cut-off for Recall@k")
    if min([*ks, mrr_k, ndcg_k]) < 1:
        raise ValueError(f"cut-offs must be at least 1, got ks={list(ks)}, mrr_k={mrr_k}, ndcg_k={ndcg_k}")
    judged = {doc for docs in dataset.qrels.values() for doc in docs}
    present = keys_in_corpus(index.corpus, judged, "id")
    if not present:
        raise ValueError(f"none of the {len(judged)} documents judged in {dataset.folder}/qrels/{dataset.split}.tsv "
                         f"is in the index's corpus ({index.corpus.source}): build the index over "
                         f"{dataset.corpus_path} (index build --corpus {dataset.corpus_path})")
    depth = max([*ks, mrr_k, ndcg_k])
    qids = list(dataset.queries)
    per_question = []
    for start in tqdm(range(0, len(qids), batch_size), desc="evaluating retrieval (BEIR)", unit=" batches"):
        batch = qids[start:start + batch_size]
        texts = [dataset.queries[qid] for qid in batch]
        result = index.search(texts, depth + 1 if ignore_identical_ids else depth,
                              questions=texts if compose_self else None)
        for qid, ranked in zip(batch, result.ids):
            if ignore_identical_ids:
                ranked = [doc for doc in ranked if doc != qid]
            ranked = ranked[:depth]
            qrels = dataset.qrels[qid]
            first = next((rank for rank, doc in enumerate(ranked, start=1) if qrels.get(doc, 0) > 0), None)
            metrics = query_measures(ranked, qrels, [*(f"recall@{k}" for k in ks), f"mrr@{mrr_k}", f"ndcg@{ndcg_k}"])
            per_question.append({"id": qid, "first_relevant_rank": first,
                                 "relevant": sum(score > 0 for score in qrels.values()), **metrics})
    names = [f"ndcg@{ndcg_k}", *(f"recall@{k}" for k in ks), f"mrr@{mrr_k}"]
    means = {n: sum(p[n] for p in per_question) / len(per_question) for n in names}
    return {
        "metrics": means, "questions_evaluated": len(per_question),
        "queries_without_relevant": sum(p["relevant"] == 0 for p in per_question),
        "qrels_documents": len(judged), "qrels_documents_missing_from_index": len(judged) - len(present),
        "ignore_identical_ids": ignore_identical_ids, "per_question": per_question,
    }


def corpus_size_warning(index, dataset: BeirDataset) -> str | None:
    """A warning when the index's corpus is not the dataset's ``corpus.jsonl`` and holds another number of
    passages than it has lines (an index over a subset or another corpus inflates or deflates every metric);
    None when they agree, or when the folder has no ``corpus.jsonl``."""
    path = dataset.corpus_path
    if not path.is_file():
        return None
    source = Path(index.corpus.source)
    if source.exists() and source.resolve() == path.resolve():
        return None
    lines, last = 0, b"\n"
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            lines += block.count(b"\n")
            last = block[-1:]
    lines += last != b"\n"
    if lines == len(index.corpus):
        return None
    return (f"the index's corpus ({source}, {len(index.corpus)} passages) is not {path} ({lines} lines): "
            "build the index over the BEIR corpus, or the scores are not comparable to BEIR's")
