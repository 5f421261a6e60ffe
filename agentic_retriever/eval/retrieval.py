"""Retrieval evaluation: evidence metrics (Recall@k, MRR@k, nDCG@k) and answer recall@k, per question.

Evidence metrics use binary relevance by corpus id or by title. Relevance by title is what a QA set with
Wikipedia evidence gives (FanOutQA's ``supporting_titles``). Several passages may share a title (wiki-18 has
~100-word chunks), so a relevant title counts once: at the rank of its first passage. Ranks are passage ranks.

* Recall@k        = |relevant keys among the top-k| / |relevant keys|
* MRR@k           = 1 / rank of the first relevant passage within k (0 if none)
* nDCG@k          = sum over first hits of 1/log2(rank+1), divided by the ideal sum for min(|relevant|, k) hits
  (these three by trec_eval's own code through ir-measures: `agentic_retriever.eval.ranking`)
* answer_recall@k = 1 if a top-k passage's ``contents`` (``"Title"\\ntext``) contains a golden answer, normalised
                    and on word boundaries (`base.qa_metrics.contains_match`), else 0: the top-k retrieval accuracy of
                    DPR (Karpukhin et al. 2020, "Dense Passage Retrieval for Open-Domain Question Answering",
                    arXiv:2004.04906) and FlashRAG. It needs no evidence labels, so it is what an agent gets
                    even where the labelled page is not the only one that answers. An answer of several parts
                    (a row's ``answer_parts``: a list's items, a dict's entries, each as its alternatives) scores
                    the share of its parts that some top-k passage contains. Counted only over the evaluated rows
                    that have ``golden_answers`` and whose answer is not yes/no/true/false (`base.qa_metrics.is_yes_no`:
                    "no" would match any passage with the word).

Relevance ``answers`` judges rows by answer recall alone, with no evidence labels (FlashRAG's and Search-R1's QA
rows carry none): evidence metrics are then left out of the means, and a row without golden answers is skipped.

Query composition: an encoder trained on ``Q [SEP] q`` (``encoder.compose_query``) is evaluated as trained by
passing the Q of every question to ``Index.search(questions=...)`` (`composition_questions`): FanOutQA leaf rows
name their multi-hop question by ``parent_id``; ``parent_or_self`` takes it where a row names one and the row's
own question otherwise (a top-level question is its own Q, as the agent searches with it). An index whose encoder
does not compose (composition ``query``, and BM25) ignores the questions, so the same call evaluates every index.

Every metric is also kept per question (``per_question``), so that two systems can be compared question by
question with `eval.bootstrap.compare_reports`.

    questions = load_judged_questions("leaf_dev.jsonl")
    parents = composition_questions(questions, "parent", "multihop_dev.jsonl")
    report = evaluate_retrieval(open_index("index/trained"), questions, ks=[1, 5, 20], search_questions=parents)
    report["metrics"]["answer_recall@5"], report["questions_with_answers"]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tqdm.auto import tqdm

from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.corpus import Corpus
from agentic_retriever.base.encoder import COMPOSE_WITH
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.base.qa_metrics import contains_match, golden_strings, is_yes_no
from agentic_retriever.base.qa_sources import read_qa_source_rows

from .ranking import query_measures

ID_FIELDS = ("supporting_ids", "positive_ids")
TITLE_FIELD = "supporting_titles"
ANSWER_FIELD = "golden_answers"
PARTS_FIELD = "answer_parts"
PARENT_FIELD = "parent_id"


def first_relevant_rank(retrieved: Sequence[str], relevant: set[str]) -> int | None:
    """1-based rank of the first relevant key in `retrieved`, None when none is."""
    return next((rank for rank, key in enumerate(retrieved, start=1) if key in relevant), None)


def first_answer_rank(passages: Sequence[str], golden: Any, k: int) -> int | None:
    """1-based rank of the first of the top-k passage texts that contains a golden answer (`contains_match`)."""
    for rank, text in enumerate(passages[:k], start=1):
        if contains_match(text, golden):
            return rank
    return None


def parts_recall(part_ranks: Sequence[int | None], k: int) -> float:
    """The share of an answer's parts that some top-k passage contains (`part_ranks`: each part's first rank)."""
    return sum(rank is not None and rank <= k for rank in part_ranks) / len(part_ranks)


def answer_recall_at_k(passages: Sequence[str], golden: Any, k: int) -> float:
    """1.0 if any of the top-k passage texts contains a golden answer on word boundaries, else 0.0."""
    return float(first_answer_rank(passages, golden, k) is not None)


@dataclass
class RetrievalEvalConfig:
    """Settings of `agentic-retriever eval retrieval` (section ``eval_retrieval``)."""

    RENAMED: ClassVar[dict[str, str]] = {"index": "retrieval.index"}

    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig, metadata={
        "help": "the index to evaluate (opened in this process: a service URL is not enough)"})
    qa: str = field(default="", metadata={
        "help": "QA JSONL with supporting_ids or supporting_titles (golden_answers optional); this or beir is needed"})
    beir: str = field(default="", metadata={
        "help": "a BEIR dataset folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) to evaluate on instead of qa, "
                "with BEIR's graded nDCG, Recall and MRR; the index must be built over its corpus.jsonl"})
    beir_split: str = field(default="test", metadata={"help": "the BEIR qrels split (qrels/SPLIT.tsv)"})
    ignore_identical_ids: bool = field(default=True, metadata={
        "help": "BEIR: drop a retrieved document whose id is the query's (BEIR's default; ArguAna, Quora)"})
    ks: list[int] = field(default_factory=lambda: [1, 5, 20], metadata={"help": "cut-offs for Recall@k and answer_recall@k"})
    mrr_k: int = field(default=10, metadata={"help": "cut-off for MRR"})
    ndcg_k: int = field(default=10, metadata={"help": "cut-off for nDCG"})
    relevance: Literal["auto", "id", "title", "answers"] = field(default="auto", metadata={
        "help": "judge hits by corpus id or title (auto: ids where a row has them), or by answers alone (answer "
                "recall; rows need no evidence labels)"})
    compose_with: Literal["none", "parent", "self", "parent_or_self"] = field(default="none", metadata={
        "help": "the Q of a composing encoder's 'Q [SEP] q': none (bare question), parent (the row's parent_id "
                "question from parent_qa), self (the row's own question), parent_or_self (parent where the row "
                "names one, else self)"})
    parent_qa: str = field(default="", metadata={"help": "QA JSONL of the parent questions ({id, question}) for compose_with parent"})
    batch_size: int = field(default=64, metadata={"help": "queries per search call"})
    out: str | None = field(default=None, metadata={"help": "write the report (with per-question metrics) here"})
    compare_to: str | None = field(default=None, metadata={
        "help": "an earlier report (--out) on the same QA file: print each metric's difference with its 95 percent "
                "confidence interval (paired bootstrap)"})


@dataclass
class _Judged:
    id: str
    question: str
    relevant: set[str]
    by: str
    golden_answers: Any = None
    parent_id: str | None = None
    path: str = ""
    line: int = 0
    answer_parts: list[list[str]] | None = None


def has_evidence_labels(path: str) -> bool:
    """Whether the first row of a QA file carries evidence labels (``supporting_ids``, ``positive_ids`` or
    ``supporting_titles``): how a caller picks relevance ``auto`` (every row must then carry them) or ``answers``."""
    for r in read_qa_source_rows(path):
        return any(name in r.row for name in (*ID_FIELDS, TITLE_FIELD))
    raise ValueError(f"{path} holds no QA rows")


def load_judged_questions(path: str, relevance: str = "auto") -> list[_Judged]:
    """QA rows with their relevant keys; `auto` uses ids when a row has them, titles otherwise; `answers` reads no
    labels (the rows are judged by answer recall alone).

    Also kept: ``golden_answers`` (for answer recall; None when the row has none or they say yes or no),
    ``answer_parts`` (an answer of several parts, each a list of alternatives) and ``parent_id``.
    """
    rows = []
    for source_row in read_qa_source_rows(path):
        row, where, line = source_row.row, source_row.where, source_row.line
        for needed in ("id", "question"):
            if needed not in row:
                raise DataFormatError(where, line, "missing", field=needed)
        id_field = next((f for f in ID_FIELDS if f in row), None)
        by = "answers" if relevance == "answers" else (
            "id" if relevance == "id" or (relevance == "auto" and id_field) else "title")
        fld = (id_field or ID_FIELDS[0]) if by == "id" else TITLE_FIELD
        keys = row.get(fld) if by != "answers" else []
        if not isinstance(keys, list) or not all(isinstance(k, (str, int)) for k in keys):
            raise DataFormatError(where, line, "missing or not a list of strings (needed to judge relevance; "
                                              "relevance answers judges by golden answers alone)", field=fld)
        golden = row.get(ANSWER_FIELD)
        try:
            has_answers = golden is not None and bool(golden_strings(golden)) and not is_yes_no(golden)
        except TypeError as error:
            raise DataFormatError(where, line, str(error), field=ANSWER_FIELD) from None
        parts = row.get(PARTS_FIELD)
        if parts is not None and (not isinstance(parts, list) or not parts or not all(
                isinstance(part, list) and part and all(isinstance(a, str) and a for a in part) for part in parts)):
            raise DataFormatError(where, line, "must be a non-empty list of non-empty lists of answer strings",
                                  field=PARTS_FIELD)
        parent = row.get(PARENT_FIELD)
        rows.append(_Judged(str(row["id"]), str(row["question"]), {str(k) for k in keys}, by,
                            golden if has_answers else None, None if parent is None else str(parent), where, line,
                            parts if has_answers else None))
    return rows


def load_parent_questions(path: str) -> dict[str, str]:
    """Parent id -> question text, from a QA JSONL of ``{"id", "question", ...}`` rows (FanOutQA multi-hop)."""
    parents: dict[str, str] = {}
    for source_row in read_qa_source_rows(path):
        row, where, line = source_row.row, source_row.where, source_row.line
        for needed in ("id", "question"):
            if needed not in row:
                raise DataFormatError(where, line, "missing", field=needed)
        if not isinstance(row["question"], str):
            raise DataFormatError(where, line, f"expected a string, got {type(row['question']).__name__}", field="question")
        parents[str(row["id"])] = row["question"]
    return parents


def composition_questions(questions: Sequence[_Judged], compose_with: str,
                          parent_qa: str | None = None) -> list[str] | None:
    """The Q to compose each question's search with, parallel to `questions` (None for ``none``).

    ``parent``: the question of the row's ``parent_id`` in `parent_qa`; ``self``: the row's own question;
    ``parent_or_self``: the parent's where the row names one, else its own. A row without ``parent_id`` (under
    ``parent``), or whose parent is not in `parent_qa`, is an error naming file, line and field.
    """
    if compose_with not in COMPOSE_WITH:
        raise ValueError(f"unknown compose_with {compose_with!r}; choose one of {', '.join(COMPOSE_WITH)}")
    if compose_with == "none":
        return None
    if compose_with == "self":
        return [q.question for q in questions]
    own = compose_with == "parent_or_self"
    if own and all(q.parent_id is None for q in questions):
        return [q.question for q in questions]
    if not parent_qa:
        raise ValueError(f"compose_with {compose_with!r} needs parent_qa (the QA file of the parent questions)")
    parents = load_parent_questions(parent_qa)
    out = []
    for q in questions:
        if q.parent_id is None and own:
            out.append(q.question)
            continue
        if q.parent_id is None:
            raise DataFormatError(q.path, q.line, "missing (needed for compose_with 'parent')", field=PARENT_FIELD)
        if q.parent_id not in parents:
            raise DataFormatError(q.path, q.line, f"parent id {q.parent_id!r} is not in {parent_qa}", field=PARENT_FIELD)
        out.append(parents[q.parent_id])
    return out


def keys_in_corpus(corpus: Corpus, keys: set[str], by: str) -> set[str]:
    """The subset of `keys` (ids or titles) present in the corpus, found without a Python set of the corpus."""
    if not keys:
        return set()
    wanted = pa.array(sorted(keys), type=pa.string())
    column = corpus.titles if by == "title" else corpus.id_column
    present = pc.is_in(wanted, value_set=column.combine_chunks())
    return {k for k, p in zip(wanted.to_pylist(), present.to_pylist()) if p}


def evaluate_retrieval(index, questions: list[_Judged], ks: Sequence[int] = (1, 5, 20), mrr_k: int = 10,
                       ndcg_k: int = 10, batch_size: int = 64,
                       search_questions: Sequence[str | None] | None = None) -> dict:
    """Mean and per-question metrics over the questions whose relevant passages exist in the index's corpus.

    `search_questions` (parallel to `questions`, e.g. from `composition_questions`) is passed to
    ``index.search(questions=...)``: the Q of a composing encoder's ``Q [SEP] q``; non-composing indexes ignore it.
    ``answer_recall@k`` is averaged over the evaluated questions with golden answers (``questions_with_answers``)
    and is None in the per-question records of the others.
    """
    if search_questions is not None and len(search_questions) != len(questions):
        raise ValueError(f"search_questions has {len(search_questions)} entries for {len(questions)} questions")
    all_keys = {by: set().union(*(q.relevant for q in questions if q.by == by)) for by in ("id", "title")}
    present = {by: keys_in_corpus(index.corpus, keys, by) for by, keys in all_keys.items()}
    keep = [i for i, q in enumerate(questions) if (q.relevant & present[q.by] if q.by != "answers" else
                                                   q.golden_answers is not None)]
    judged = [questions[i] for i in keep]
    composed = [search_questions[i] for i in keep] if search_questions is not None else None
    depth = max([*ks, mrr_k, ndcg_k])
    evidence_names = [*(f"recall@{k}" for k in ks), f"mrr@{mrr_k}", f"ndcg@{ndcg_k}"]
    answer_names = [f"answer_recall@{k}" for k in ks]
    per_question = []
    for start in tqdm(range(0, len(judged), batch_size), desc="evaluating retrieval", unit=" batches"):
        batch = judged[start:start + batch_size]
        result = index.search([q.question for q in batch], depth,
                              questions=composed[start:start + batch_size] if composed is not None else None)
        needs_text = any(q.golden_answers is not None for q in batch)
        titles, contents = _passage_fields(index.corpus, result.rows, any(q.by == "title" for q in batch), needs_text)
        for i, q in enumerate(batch):
            if q.by == "answers":
                ranks, metrics = [], dict.fromkeys(evidence_names)
            else:
                retrieved = titles[i] if q.by == "title" else result.ids[i]
                relevant = q.relevant & present[q.by]
                first = first_relevant_rank(retrieved, relevant)
                ranks = [first] if first is not None else []
                metrics = query_measures(retrieved, relevant, evidence_names)
            answer_rank = None
            if q.answer_parts is not None:
                part_ranks = [first_answer_rank(contents[i], part, depth) for part in q.answer_parts]
                answer_rank = min((r for r in part_ranks if r is not None), default=None)
                metrics |= {name: parts_recall(part_ranks, k) for name, k in zip(answer_names, ks)}
            elif q.golden_answers is not None:
                answer_rank = first_answer_rank(contents[i], q.golden_answers, depth)
                metrics |= {name: float(answer_rank is not None and answer_rank <= k) for name, k in zip(answer_names, ks)}
            else:
                metrics |= dict.fromkeys(answer_names)
            per_question.append({"id": q.id, "first_relevant_rank": ranks[0] if ranks else None,
                                 "first_answer_rank": answer_rank, **metrics})
    labelled = [p for p in per_question if p[evidence_names[0]] is not None]
    means = ({n: (sum(p[n] for p in labelled) / len(labelled) if labelled else 0.0) for n in evidence_names}
             if labelled or not per_question else {})  # answers alone: no evidence metric to average
    answered = [p for p in per_question if p[answer_names[0]] is not None] if answer_names else []
    if answered:
        means |= {n: sum(p[n] for p in answered) / len(answered) for n in answer_names}
    return {
        "metrics": means, "questions_evaluated": len(judged),
        "questions_skipped_no_relevant_in_corpus": sum(q.by != "answers" for q in questions) - len(labelled),
        "questions_judged_by_answers": len(judged) - len(labelled),
        "questions_with_answers": len(answered), "per_question": per_question,
    }


def _split(flat: list, rows: list) -> list[list]:
    out, start = [], 0
    for r in rows:
        out.append(flat[start:start + len(r)])
        start += len(r)
    return out


def _passage_fields(corpus: Corpus, rows: list, titles: bool, contents: bool) -> tuple[list | None, list | None]:
    """Per query, the titles and/or Search-R1 ``contents`` of its ragged row array, fetched in one Arrow take."""
    if not rows or not (titles or contents):
        return None, None
    flat = np.concatenate(rows)
    if not contents:
        return _split(corpus.titles_at(flat), rows), None
    passages = corpus.passages_at(flat)
    return (_split([p.title for p in passages], rows) if titles else None), _split([p.contents for p in passages], rows)

