"""Retrieval evaluation: Recall@k, MRR@k and nDCG@k with binary relevance by corpus id or by title.

Relevance by title is what a QA set with Wikipedia evidence gives (FanOutQA's ``supporting_titles``).
Several passages may share a title (wiki-18 has ~100-word chunks), so a relevant title counts once:
at the rank of its first passage. Ranks are passage ranks.

* Recall@k = |relevant keys among the top-k| / |relevant keys|
* MRR@k    = 1 / rank of the first relevant passage within k (0 if none)
* nDCG@k   = sum over first hits of 1/log2(rank+1), divided by the ideal sum for min(|relevant|, k) hits
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from ..corpus import Corpus
from ..jsonl import DataFormatError, iter_jsonl

ID_FIELDS = ("supporting_ids", "positive_ids")
TITLE_FIELD = "supporting_titles"


def _first_hit_ranks(retrieved: Sequence[str], relevant: set[str], k: int) -> list[int]:
    """1-based ranks (within k) at which each relevant key first appears."""
    seen: set[str] = set()
    ranks = []
    for rank, key in enumerate(retrieved[:k], start=1):
        if key in relevant and key not in seen:
            seen.add(key)
            ranks.append(rank)
    return ranks


def recall_at_k(retrieved: Sequence[str], relevant: set[str], k: int) -> float:
    return len(_first_hit_ranks(retrieved, relevant, k)) / len(relevant) if relevant else 0.0


def mrr_at_k(retrieved: Sequence[str], relevant: set[str], k: int) -> float:
    ranks = _first_hit_ranks(retrieved, relevant, k)
    return 1.0 / ranks[0] if ranks else 0.0


def ndcg_at_k(retrieved: Sequence[str], relevant: set[str], k: int) -> float:
    if not relevant:
        return 0.0
    dcg = sum(1.0 / math.log2(rank + 1) for rank in _first_hit_ranks(retrieved, relevant, k))
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(relevant), k) + 1))
    return dcg / ideal


@dataclass
class RetrievalEvalConfig:
    index: str = field(default="", metadata={"help": "index folder"})
    qa: str = field(default="", metadata={"help": "QA JSONL with supporting_ids or supporting_titles"})
    ks: list[int] = field(default_factory=lambda: [1, 5, 20], metadata={"help": "cut-offs for Recall@k"})
    mrr_k: int = field(default=10, metadata={"help": "cut-off for MRR"})
    ndcg_k: int = field(default=10, metadata={"help": "cut-off for nDCG"})
    relevance: Literal["auto", "id", "title"] = field(default="auto", metadata={"help": "judge hits by corpus id or title"})
    batch_size: int = field(default=64, metadata={"help": "queries per search call"})
    out: str | None = field(default=None, metadata={"help": "write the report (with per-question ranks) here"})


@dataclass
class _Judged:
    id: str
    question: str
    relevant: set[str]
    by: str


def load_judged_questions(path: str, relevance: str = "auto") -> list[_Judged]:
    """QA rows with their relevant keys; `auto` uses ids when a row has them, titles otherwise."""
    rows = []
    for line, row in iter_jsonl(path):
        for needed in ("id", "question"):
            if needed not in row:
                raise DataFormatError(path, line, "missing", field=needed)
        id_field = next((f for f in ID_FIELDS if f in row), None)
        by = "id" if relevance == "id" or (relevance == "auto" and id_field) else "title"
        fld = (id_field or ID_FIELDS[0]) if by == "id" else TITLE_FIELD
        keys = row.get(fld)
        if not isinstance(keys, list) or not all(isinstance(k, (str, int)) for k in keys):
            raise DataFormatError(path, line, "missing or not a list of strings (needed to judge relevance)", field=fld)
        rows.append(_Judged(str(row["id"]), str(row["question"]), {str(k) for k in keys}, by))
    return rows


def keys_in_corpus(corpus: Corpus, keys: set[str], by: str) -> set[str]:
    """The subset of `keys` (ids or titles) present in the corpus, found without a Python set of the corpus."""
    if not keys:
        return set()
    wanted = pa.array(sorted(keys), type=pa.string())
    column = corpus.titles if by == "title" else corpus.id_column
    present = pc.is_in(wanted, value_set=column.combine_chunks())
    return {k for k, p in zip(wanted.to_pylist(), present.to_pylist()) if p}


def evaluate_retrieval(index, questions: list[_Judged], ks: Sequence[int] = (1, 5, 20), mrr_k: int = 10,
                       ndcg_k: int = 10, batch_size: int = 64) -> dict:
    """Mean metrics over the questions whose relevant passages exist in the index's corpus."""
    all_keys = {by: set().union(*(q.relevant for q in questions if q.by == by)) for by in ("id", "title")}
    present = {by: keys_in_corpus(index.corpus, keys, by) for by, keys in all_keys.items()}
    judged = [q for q in questions if q.relevant & present[q.by]]
    depth = max([*ks, mrr_k, ndcg_k])
    per_question = []
    for start in tqdm(range(0, len(judged), batch_size), desc="evaluating retrieval", unit=" batches"):
        batch = judged[start:start + batch_size]
        result = index.search([q.question for q in batch], depth)
        titles = _titles_of(index.corpus, result.rows) if any(q.by == "title" for q in batch) else None
        for i, q in enumerate(batch):
            retrieved = titles[i] if q.by == "title" else result.ids[i]
            relevant = q.relevant & present[q.by]
            ranks = _first_hit_ranks(retrieved, relevant, depth)
            metrics = {f"recall@{k}": recall_at_k(retrieved, relevant, k) for k in ks}
            metrics[f"mrr@{mrr_k}"] = mrr_at_k(retrieved, relevant, mrr_k)
            metrics[f"ndcg@{ndcg_k}"] = ndcg_at_k(retrieved, relevant, ndcg_k)
            per_question.append({"id": q.id, "first_relevant_rank": ranks[0] if ranks else None, **metrics})
    names = [*(f"recall@{k}" for k in ks), f"mrr@{mrr_k}", f"ndcg@{ndcg_k}"]
    means = {n: (sum(p[n] for p in per_question) / len(per_question) if per_question else 0.0) for n in names}
    return {
        "metrics": means, "questions_evaluated": len(judged),
        "questions_skipped_no_relevant_in_corpus": len(questions) - len(judged), "per_question": per_question,
    }



def _titles_of(corpus: Corpus, rows: list) -> list[list[str]]:
    """Titles of ragged per-query row arrays, fetched in one Arrow take."""
    titles = corpus.titles_at(np.concatenate(rows)) if rows else []
    out, start = [], 0
    for r in rows:
        out.append(titles[start:start + len(r)])
        start += len(r)
    return out
