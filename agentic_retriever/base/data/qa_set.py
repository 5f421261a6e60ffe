"""`agentic-retriever data qa`: one QA set from the field's files, written as FlashRAG JSONL.

Every command that reads questions takes a QA set spec directly (`agentic_retriever.base.qa_sources`: FlashRAG JSONL,
Search-R1 parquet, ``hf:NAME:CONFIG:SPLIT``, several joined by ``,``). This command writes such a set out once,
with its namespaced ids and ``dataset`` per row, for users who want a file to read, share or split by hand:

    agentic-retriever data qa --qa "data/qa/triviaqa/train.jsonl,data/qa/hotpotqa/train.jsonl" \\
        --out data/qa/triviaqa_hotpotqa_train.jsonl
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..jsonl import write_jsonl
from ..qa_sources import read_qa_source_rows

__all__ = ["QASetConfig", "write_qa_set"]


@dataclass
class QASetConfig:
    """Settings of `agentic-retriever data qa` (section ``data_qa``)."""

    qa: str = field(default="", metadata={
        "help": "QA set: FlashRAG JSONL, Search-R1 parquet or hf:NAME:CONFIG:SPLIT, several joined by ',', each "
                "optionally DATASET=SOURCE", "required": True})
    out: str = field(default="", metadata={"help": "FlashRAG JSONL to write", "required": True})


def write_qa_set(config: QASetConfig) -> dict[str, int]:
    """Write the rows of `config.qa` to `config.out` (whole or not at all); returns the rows per dataset."""
    if not config.qa or not config.out:
        raise ValueError("data qa needs --qa (the sources) and --out (the JSONL to write)")
    rows = [r.row for r in read_qa_source_rows(config.qa)]
    write_jsonl(config.out, rows)
    return dict(Counter(str(row.get("dataset", "")) for row in rows))
