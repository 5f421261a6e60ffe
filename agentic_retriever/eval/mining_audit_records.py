"""What the mining audit reads, and the words it reports in.

The audit (`mining_audit`) reads a mining run's ``rounds.jsonl`` (`load_rounds`: one `AuditRound` per line, with an
`AuditCandidate` per candidate; the format is in docs/data-formats.md, "Mining rounds"), its
``retriever_train.jsonl`` when there is one (`load_rows`) and a QA file's ``supporting_titles``, the evidence
labels (`load_evidence_titles`). A malformed line raises `DataFormatError` naming file, line and field.

Its vocabulary: the two classes of candidate (`CLASSES`), the signals it scores them by (`SIGNALS`), where a
class went in a round (`FATES`) and the retriever-rank buckets (`RANK_BUCKETS`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_retriever.base.jsonl import DataFormatError, iter_jsonl, require_field

__all__ = ["CLASSES", "FATES", "RANK_BUCKETS", "ROUNDS_FILE", "ROWS_FILE", "SIGNALS", "AuditCandidate", "AuditRound",
           "load_evidence_titles", "load_rounds", "load_rows"]

ROUNDS_FILE = "rounds.jsonl"
ROWS_FILE = "retriever_train.jsonl"
CLASSES = ("evidence", "answer")
SIGNALS = ("lr", "gac", "retriever")
FATES = ("positive", "negative", "excluded", "unused", "round_dropped", "not_retrieved")
RANK_BUCKETS = ("1", "2", "3", "4-5", "6-10", "11-20", "21+")
_ROLES = ("positive", "negative", "excluded", None)
_STATUSES = ("mined", "dropped")
_NUMBER = (int, float)
_NONE = type(None)


@dataclass(frozen=True)
class AuditCandidate:
    """One candidate of a round as ``rounds.jsonl`` records it."""

    id: str
    title: str
    rank: int  # 1-based retriever rank
    score: float | None  # retriever score
    lr: float | None  # local relevance 0..100
    gac: float | None  # graded global answer correctness, higher = more useful
    gac_pass: bool | None
    contains_answer: bool
    role: str | None  # positive / negative / excluded / None (unused)

    def signal(self, name: str) -> float | None:
        if name == "retriever":
            return self.score if self.score is not None else -self.rank
        return getattr(self, name)


@dataclass(frozen=True)
class AuditRound:
    round_id: str
    question_id: str
    round_index: int
    status: str  # mined / dropped
    drop_reason: str | None
    candidates: tuple[AuditCandidate, ...]
    sample: int = 0  # which of the question's sampled trajectories

    @property
    def key(self) -> tuple[str, int, int]:
        """(question id, sample, round index): what a training row names its round by."""
        return self.question_id, self.sample, self.round_index


def _get(path, line: int, obj: dict, name: str, kind: type | tuple[type, ...], label: str | None = None):
    """obj[name], or DataFormatError naming file, line and `label` (the field's path) when missing or mistyped."""
    label = label or name
    if name not in obj:
        raise DataFormatError(path, line, "missing", field=label)
    value = obj[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = "/".join("null" if k is _NONE else k.__name__ for k in kinds)
        raise DataFormatError(path, line, f"expected {names}, got {type(value).__name__}", field=label)
    return value


def _candidate(path, line: int, obj: Any, i: int) -> AuditCandidate:
    where = f"candidates[{i}]"
    if not isinstance(obj, dict):
        raise DataFormatError(path, line, f"expected an object, got {type(obj).__name__}", field=where)

    def get(name, kind):
        return _get(path, line, obj, name, kind, f"{where}.{name}")

    role = get("role", (str, _NONE))
    if role not in _ROLES:
        raise DataFormatError(path, line, f"expected positive/negative/excluded/null, got {role!r}",
                              field=f"{where}.role")
    score = get("score", (*_NUMBER, _NONE))
    lr, gac = get("lr", (*_NUMBER, _NONE)), get("gac", (*_NUMBER, _NONE))
    return AuditCandidate(str(get("id", (str, int))), get("title", str), get("rank", int),
                          None if score is None else float(score), None if lr is None else float(lr),
                          None if gac is None else float(gac), get("gac_pass", (bool, _NONE)),
                          get("contains_answer", bool), role)


def load_rounds(path: str | os.PathLike) -> list[AuditRound]:
    """The rounds of ``rounds.jsonl``; a malformed line raises DataFormatError naming file, line and field."""
    rounds = []
    for line, row in iter_jsonl(path):
        status = _get(path, line, row, "status", str)
        if status not in _STATUSES:
            raise DataFormatError(path, line, f"expected mined/dropped, got {status!r}", field="status")
        candidates = _get(path, line, row, "candidates", list)
        rounds.append(AuditRound(
            round_id=_get(path, line, row, "round_id", str),
            question_id=str(_get(path, line, row, "question_id", (str, int))),
            round_index=_get(path, line, row, "round_index", int), status=status,
            drop_reason=_get(path, line, row, "drop_reason", (str, _NONE)),
            candidates=tuple(_candidate(path, line, c, i) for i, c in enumerate(candidates)),
            sample=_sample(path, line, row)))
    return rounds


def load_evidence_titles(qa_path: str | os.PathLike) -> dict[str, frozenset[str]]:
    """QA id -> its supporting titles (empty when the row has none): the evidence labels."""
    titles = {}
    for line, row in iter_jsonl(qa_path):
        qid = require_field(qa_path, line, row, "id", (str, int))
        value = row.get("supporting_titles") or []
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise DataFormatError(qa_path, line, "expected a list of strings", field="supporting_titles")
        titles[str(qid)] = frozenset(value)
    return titles


def _sample(path, line: int, row: dict) -> int:
    """The optional ``sample`` of a round or row (0 when absent); a negative or non-integer one is an error."""
    sample = row.get("sample", 0)
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise DataFormatError(path, line, f"expected an integer 0 or more, got {sample!r}", field="sample")
    return sample


def load_rows(path: Path) -> list[tuple[tuple[str, int, int], list[str]]]:
    """((query_id, sample, round_index), passage_ids) of every training row: the key names its round
    (`AuditRound.key`)."""
    rows = []
    for line, row in iter_jsonl(path):
        ids = require_field(path, line, row, "passage_ids", list)
        key = (str(require_field(path, line, row, "query_id", (str, int))), _sample(path, line, row),
               require_field(path, line, row, "round_index", int))
        rows.append((key, [str(p) for p in ids]))
    return rows
