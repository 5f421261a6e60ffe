"""QA rows as the agent reads them: FlashRAG ``{"id", "question", "golden_answers"}`` plus optional
``"supporting_titles"`` and ``"dataset"`` (docs/data-formats.md, "QA rows"), from any QA set spec
(`agentic_retriever.qa_sources`: FlashRAG JSONL, Search-R1 parquet, hub datasets, several merged)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentic_retriever.qa_sources import read_qa_source_rows
from agentic_retriever.eval.qa import golden_strings
from agentic_retriever.jsonl import DataFormatError

__all__ = ["QARow", "as_qa_rows", "read_qa_rows"]


@dataclass(frozen=True)
class QARow:
    """One question with its golden answers (flattened to strings) and, when known, its evidence titles and the
    dataset it comes from (a merged evaluation set reports per dataset, as the paper's tables)."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    supporting_titles: tuple[str, ...] | None = None
    dataset: str | None = None

    @classmethod
    def from_json(cls, row: dict[str, Any], path: str | os.PathLike = "<qa rows>", line: int | None = None) -> QARow:
        """Parse one row; a missing or mistyped field raises DataFormatError naming file, line and field."""
        for name in ("id", "question", "golden_answers"):
            if name not in row:
                raise DataFormatError(path, line, "missing", field=name)
        if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
            raise DataFormatError(path, line, f"expected str/int, got {type(row['id']).__name__}", field="id")
        if not isinstance(row["question"], str) or not row["question"].strip():
            raise DataFormatError(path, line, "expected a non-empty string", field="question")
        try:
            golden = tuple(golden_strings(row["golden_answers"]))
        except TypeError as error:
            raise DataFormatError(path, line, str(error), field="golden_answers") from None
        titles = row.get("supporting_titles")
        if titles is not None and (not isinstance(titles, list) or not all(isinstance(t, str) for t in titles)):
            raise DataFormatError(path, line, "expected a list of strings", field="supporting_titles")
        dataset = row.get("dataset")
        if dataset is not None and (not isinstance(dataset, str) or not dataset.strip()):
            raise DataFormatError(path, line, "expected a non-empty string", field="dataset")
        return cls(str(row["id"]), row["question"], golden, tuple(titles) if titles is not None else None, dataset)


def read_qa_rows(path: str | os.PathLike) -> list[QARow]:
    """All rows of a QA set (a JSONL file, or any spec of `agentic_retriever.qa_sources`); bad rows raise
    DataFormatError naming file, line and field."""
    return [QARow.from_json(r.row, r.where, r.line) for r in read_qa_source_rows(path)]


def as_qa_rows(rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike) -> list[QARow]:
    """QA rows from a QA set spec (a JSONL path, ...), `QARow`s, or dicts (a bad dict is named by its 1-based position)."""
    if isinstance(rows, (str, os.PathLike)):
        return read_qa_rows(rows)
    return [r if isinstance(r, QARow) else QARow.from_json(r, "<qa rows>", i) for i, r in enumerate(rows, start=1)]
