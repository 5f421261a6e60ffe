"""Training examples of the contrastive retriever trainer.

The method is "Agentic-R: Learning to Retrieve for Agentic Search", section 4.1.2.

Two row formats are read, told apart by their fields:

* Agentic-R's released format (what `mine run` writes; docs/data-formats.md, "Retriever training rows"):
  ``{"query_text", "question", "history_queries", "passage_ids": [pos, neg1, ..], "scores": [{..}, ..]}``.
  Passage ids refer to the corpus; the query is composed with the encoder's mode (``Q [SEP] q`` for the
  Agentic-R retriever, Eq. 4) and prefix. ``scores`` is parallel to ``passage_ids`` and only read for the
  soft-label loss (`passage_utility`).
* FlagEmbedding's format for users bringing their own data: ``{"query", "pos": [text, ..], "neg": [text, ..]}``
  with passage texts inline; one example per positive; the query is used as given (plus the prefix). It has
  no per-passage scores, so it cannot feed the soft-label loss.

Every example has 1 positive and the negatives of its row; every row of a file has as many as its first (N = 1 +
that count; the paper's N = 16). The count is mining's (``mine_run.mining.selection.num_negatives``, which samples
them) or the file's author's: training takes it from the rows and sets none of its own. A row with another count is
an error, as is a passage id missing from the corpus; both name the file, line and field.
With ``skip_bad_rows`` such rows are skipped and counted instead. Exact duplicates (the same query input,
positive and negatives; e.g. a round mined twice) are kept once and counted as ``duplicates_removed``: a
duplicate would be its twin's false in-batch negative and would count twice in the loss.

    examples, counts = read_training_examples("retriever_train.jsonl", corpus, query_input, passage_input)
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentic_retriever.base.corpus import Corpus
from agentic_retriever.base.jsonl import DataFormatError, iter_jsonl, require_field
from .config import SOFT_LABEL_KEYS

__all__ = ["TrainingExample", "passage_utility", "read_training_examples"]

#: (query, question or None, earlier queries) -> the retriever input, composed and prefixed.
QueryInput = Callable[[str, str | None, Sequence[str]], str]


@dataclass(frozen=True)
class TrainingExample:
    """One contrastive example: the retriever input of the query, its positive and its negatives (texts as
    the encoder sees them, prefixes included), and, for the soft-label loss, one utility per passage
    (positive first, then the negatives in order)."""

    query: str
    positive: str
    negatives: tuple[str, ...]
    utilities: tuple[float, ...] | None = None


def passage_utility(score: dict, key: str) -> float:
    """The utility u_i of one passage from its ``scores`` entry: ``gac`` (the graded global answer
    correctness, falling back to the binary ``em`` where the row has no ``gac`` or it is null),
    ``local_utility`` (the LLM's local relevance in 0..1), or ``gac+lr``, their sum.
    Raises KeyError naming the missing key, ValueError for a non-number."""
    if key not in SOFT_LABEL_KEYS:
        raise ValueError(f"unknown soft-label key {key!r}; choose one of {', '.join(SOFT_LABEL_KEYS)}")
    parts = []
    if key in ("gac", "gac+lr"):
        name = "gac" if score.get("gac") is not None else "em"
        parts.append((name, score.get(name)))
    if key in ("local_utility", "gac+lr"):
        parts.append(("local_utility", score.get("local_utility")))
    total = 0.0
    for name, value in parts:
        if value is None:
            raise KeyError("'gac' or 'em'" if name == "em" else f"'{name}'")
        if not isinstance(value, int | float):
            raise ValueError(f"'{name}' is {type(value).__name__}, not a number")
        total += float(value)
    return total


def read_training_examples(path: str | os.PathLike, corpus: Corpus | None, query_input: QueryInput,
                           passage_input: Callable[[str], str], skip_bad_rows: bool = False,
                           soft_label_key: str | None = None) -> tuple[list[TrainingExample], dict[str, int]]:
    """Read the examples of `path`; return them with counts (rows, examples, duplicates_removed, skipped per
    reason).

    Every row has as many negatives as the first. `corpus` is needed for rows with passage ids. With
    `soft_label_key` (one of ``gac``, ``local_utility``, ``gac+lr``) every example carries the utilities of
    its N passages (`passage_utility`); a row without per-passage ``scores`` is then an error.
    """
    examples: list[TrainingExample] = []
    seen: set[tuple] = set()
    counts: Counter[str] = Counter(duplicates_removed=0)
    num_negatives: int | None = None
    for line, row in iter_jsonl(path):
        counts["rows"] += 1
        try:
            utilities = None
            if "passage_ids" in row:
                counts["format_agentic_r"] += 1
                query, positives, negatives = _agentic_r_row(path, line, row, corpus, query_input)
                if soft_label_key:
                    utilities = _row_utilities(path, line, row, soft_label_key)
            elif "query" in row and "pos" in row:
                counts["format_flag_embedding"] += 1
                if soft_label_key:
                    raise DataFormatError(path, line, "the soft-label loss needs per-passage utilities, and "
                                                      "FlagEmbedding rows (query, pos, neg) have none; use "
                                                      "Agentic-R rows with scores or loss infonce", field="scores")
                query, positives, negatives = _flag_embedding_row(path, line, row, query_input)
            else:
                raise DataFormatError(path, line, "neither an Agentic-R row (passage_ids) nor a FlagEmbedding row "
                                                  "(query, pos, neg)", field="passage_ids")
            if num_negatives is None:
                num_negatives = len(negatives)
                if num_negatives < 1:
                    raise DataFormatError(path, line, "the first row has no negative passage", field="neg")
            if len(negatives) != num_negatives:
                raise DataFormatError(path, line, f"{len(negatives)} negatives where the first row has "
                                                  f"{num_negatives}: every row has as many (mining's "
                                                  "mine_run.mining.selection.num_negatives sets it)",
                                      field="passage_ids" if "passage_ids" in row else "neg")
        except DataFormatError as error:
            if not skip_bad_rows:
                raise
            counts[f"skipped_{_reason(error)}"] += 1
            continue
        negative_inputs = tuple(passage_input(text) for text in negatives)
        kept_utilities = tuple(utilities) if utilities is not None else None
        for positive in positives:
            example = TrainingExample(query, passage_input(positive), negative_inputs, kept_utilities)
            key = (example.query, example.positive, example.negatives)
            if key in seen:
                counts["duplicates_removed"] += 1
                continue
            seen.add(key)
            examples.append(example)
    counts["examples"] = len(examples)
    return examples, dict(counts)


def _agentic_r_row(path, line: int, row: dict, corpus: Corpus | None, query_input: QueryInput):
    if corpus is None:
        raise DataFormatError(path, line, "rows with passage ids need the corpus (--corpus)", field="passage_ids")
    ids = require_field(path, line, row, "passage_ids", list)
    if not ids or not all(isinstance(i, str | int) and not isinstance(i, bool) for i in ids):
        raise DataFormatError(path, line, "expected a non-empty list of passage ids", field="passage_ids")
    ids = [str(i) for i in ids]
    try:
        rows = corpus.rows_of(ids)
    except KeyError:
        missing = next(i for i in ids if not _in_corpus(corpus, i))
        raise DataFormatError(path, line, f"passage id {missing!r} is not in the corpus {corpus.source}",
                              field="passage_ids") from None
    texts = [p.contents for p in corpus.passages_at(rows)]
    question = row.get("question")
    if question is not None and not isinstance(question, str):
        raise DataFormatError(path, line, f"expected str, got {type(question).__name__}", field="question")
    history = row.get("history_queries") or []
    if not isinstance(history, list) or not all(isinstance(q, str) for q in history):
        raise DataFormatError(path, line, "expected a list of strings", field="history_queries")
    query = query_input(require_field(path, line, row, "query_text", str), question, history)
    return query, texts[:1], texts[1:]


def _row_utilities(path, line: int, row: dict, key: str) -> list[float]:
    scores = row.get("scores")
    if not isinstance(scores, list) or len(scores) != len(row["passage_ids"]):
        raise DataFormatError(path, line, "the soft-label loss needs one score per passage id "
                                          f"(got {len(scores) if isinstance(scores, list) else 'none'} for "
                                          f"{len(row['passage_ids'])} passages)", field="scores")
    utilities = []
    for i, score in enumerate(scores):
        if not isinstance(score, dict):
            raise DataFormatError(path, line, f"scores[{i}] is not an object", field="scores")
        try:
            utilities.append(passage_utility(score, key))
        except KeyError as missing:
            raise DataFormatError(path, line, f"scores[{i}] has no {missing.args[0]} (soft_label_key {key})",
                                  field="scores") from None
        except ValueError as error:
            raise DataFormatError(path, line, f"scores[{i}]: {error}", field="scores") from None
    return utilities


def _flag_embedding_row(path, line: int, row: dict, query_input: QueryInput):
    query = require_field(path, line, row, "query", str)
    lists = {}
    for name in ("pos", "neg"):
        value = require_field(path, line, row, name, list)
        if not all(isinstance(t, str) for t in value):
            raise DataFormatError(path, line, "expected a list of passage texts", field=name)
        lists[name] = value
    if not lists["pos"]:
        raise DataFormatError(path, line, "no positive passage", field="pos")
    return query_input(query, None, ()), lists["pos"], lists["neg"]


def _in_corpus(corpus: Corpus, passage_id: str) -> bool:
    try:
        corpus.rows_of([passage_id])
    except KeyError:
        return False
    return True


def _reason(error: DataFormatError) -> str:
    if "not in the corpus" in error.problem:
        return "missing_passage"
    if "negatives where the first row has" in error.problem:
        return "other_negatives_count"
    return "malformed"
