"""Naive-RAG accuracy, the baseline term of s3's Gain Beyond RAG, cached on disk; and s3's training filters
("s3: You Don't Need That Much Data to Train a Search Agent via RL", arXiv 2505.14146, section 3.2, Eq. 1).

    GBR(Q) = Acc(G(Q, D_s3), A) - Acc(G(Q, D_RAG), A)

D_RAG is the top-`topk` (3) passages the retriever returns for the question itself; Acc is Generation Accuracy
(Eq. 3, `agent.rewards.generation`: span check OR judge; with no judge, the span check alone). The paper computes
the naive-RAG term once per question, before training (section 3.2), and trains only on the questions where it is
0 ("filters out questions already solvable by naive RAG"); it also removes the yes/no and true/false questions,
whose span check a negation fools (section 4.1, "Datasets"; Appendix A.4).

`NaiveRagCache` keeps one append-only JSONL file per (retriever, generator, judge, topk, prompts and sampling):
the file name holds a hash of those key fields (`NaiveRagCache.key_fields`, also written beside it as
``<name>.key.json``), so another retriever or generator gets another file. Records are keyed by a hash of the
question (id, text, golden answers); `accuracies` computes only the questions the file lacks, one ``retrieve``
and one generator ``generate`` call per batch (and one judge call for the span failures), and appends each batch
durably (flush + fsync): a killed run loses at most the batch in flight and a rerun never duplicates a record. A
last line without its newline (a crash mid-write) is cut off on the next run, with a warning; any other bad line
is a `DataFormatError` naming the file and the line. One process uses a cache file at a time (advisory lock).

    cache = NaiveRagCache("runs/x/agent/naive_rag", retriever_identity(client), llm_fingerprint(generator), None)
    acc_rag = cache.accuracies(rows, client, generator, judge=None)      # {"q1": 0.0, "q2": 1.0, ...}
    train = training_rows(rows, acc_rag)                               # yes/no and solved questions dropped
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.fingerprint import stable_hash
from agentic_retriever.base.jsonl import DataFormatError, json_error_text, write_json
from agentic_retriever.base.llm.protocol import LLM
from agentic_retriever.base.qa_metrics import YES_NO, is_yes_no  # re-exported: s3 drops yes/no questions (section 4.1)
from agentic_retriever.base.qa_sources import QARow
from agentic_retriever.base.writer_lock import WriterLock, lock_beside

from .rewards.generation import GENERATOR_PROMPT, GENERATOR_SAMPLING, JUDGE_PROMPT, JUDGE_SAMPLING, generation_accuracy

__all__ = ["YES_NO", "NaiveRagCache", "is_yes_no", "retriever_identity",
           "training_filter_counts", "training_rows"]

log = logging.getLogger(__name__)

#: Bump when what a record holds or how it is computed changes (a new version is a new file).
_VERSION = 1


def retriever_identity(client: RetrievalClient) -> str:
    """What decides a retriever's results, as a cache-key string: an index by its manifest's content
    (`agentic_retriever.base.fingerprint.index_identity`), a service by its ``/health`` document
    (`fingerprint.service_identity`). `client` is what ``open_client(RetrievalConfig)`` returns."""
    identity = getattr(client, "identity", None)
    if not callable(identity):
        raise TypeError(f"{type(client).__name__} has no identity(): give the naive-RAG cache a retriever identity "
                        "yourself (index folders and retrieval services have one)")
    return json.dumps(identity(), sort_keys=True, ensure_ascii=False)


def _question_key(row: QARow) -> str:
    return stable_hash([row.id, row.question, list(row.golden_answers)], 32, "sha256")


class NaiveRagCache:
    """Acc(G(Q, top-`topk` passages of Q), A) per question, computed once and kept on disk (see the module).

    The identities are content keys: `retriever_identity(client)`, ``llm_fingerprint(generator)`` and
    ``llm_fingerprint(judge)`` (`agentic_retriever.base.fingerprint`); `judge_identity` None means span check only.
    """

    def __init__(self, folder: str | Path, retriever_identity: str, generator_identity: str,
                 judge_identity: str | None, topk: int = 3):
        for name, value in (("retriever_identity", retriever_identity), ("generator_identity", generator_identity)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if judge_identity is not None and (not isinstance(judge_identity, str) or not judge_identity):
            raise ValueError(f"judge_identity must be a non-empty string or None (span check only), "
                             f"got {judge_identity!r}")
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk must be a positive integer, got {topk!r}")
        self.folder = Path(folder)
        self.retriever_identity, self.generator_identity, self.judge_identity = (
            retriever_identity, generator_identity, judge_identity)
        self.topk = topk
        judged = judge_identity is not None
        #: Everything that decides a record's value besides the question; its hash names the file.
        self.key_fields: dict[str, Any] = {
            "version": _VERSION, "retriever": retriever_identity, "generator": generator_identity,
            "judge": judge_identity, "topk": topk, "generator_prompt": GENERATOR_PROMPT,
            "generator_sampling": dataclasses.asdict(GENERATOR_SAMPLING),
            "judge_prompt": JUDGE_PROMPT if judged else None,
            "judge_sampling": dataclasses.asdict(JUDGE_SAMPLING) if judged else None,
        }
        self.path = self.folder / f"naive_rag-{stable_hash(self.key_fields, 16, 'sha256')}.jsonl"

    def accuracies(self, rows: Sequence[QARow], client: RetrievalClient, generator: LLM, judge: LLM | None,
                   batch_size: int = 64) -> dict[str, float]:
        """Question id -> naive-RAG accuracy (0.0 or 1.0) for every row; computes the rows the file lacks,
        `batch_size` questions per retrieve/generate call, appending each batch durably."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if (judge is None) != (self.judge_identity is None):
            raise ValueError(f"this cache was keyed {'without' if self.judge_identity is None else 'with'} a judge "
                             f"but accuracies() got {'none' if judge is None else 'one'}")
        keys = _unique_keys(rows)
        with self._open() as handle:
            done = self._read(handle)
            todo = list({key: row for row, key in zip(rows, keys) if key not in done}.values())
            if len(todo) < len(set(keys)):
                log.info("%s already holds %d of %d questions", self.path, len(set(keys)) - len(todo), len(set(keys)))
            for start in range(0, len(todo), batch_size):
                batch = todo[start:start + batch_size]
                records = self._compute(batch, client, generator, judge)
                handle.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())
                done.update((r["key"], r["accuracy"]) for r in records)
        return {row.id: done[key] for row, key in zip(rows, keys)}

    def _compute(self, batch: list[QARow], client: RetrievalClient, generator: LLM, judge: LLM | None
                 ) -> list[dict[str, Any]]:
        questions = [row.question for row in batch]
        hits = client.retrieve(questions, self.topk, questions=questions)
        if len(hits) != len(batch):
            raise RuntimeError(f"the retriever returned {len(hits)} result lists for {len(batch)} questions")
        items = generation_accuracy(questions, hits, [list(row.golden_answers) for row in batch], generator=generator,
                                    judge=judge).items
        return [{"key": _question_key(row), "id": row.id, "accuracy": item.accuracy, "how": item.how,
                 "prediction": item.prediction, "judge_answer": item.judge_answer,
                 "documents": [p.id for p in passages]}
                for row, passages, item in zip(batch, hits, items)]

    @contextmanager
    def _open(self) -> Iterator[IO[bytes]]:
        """The cache file, locked, opened for reading and appending; its key fields written beside it once."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with WriterLock(lock_beside(self.path), f"the naive-RAG cache {self.path}"), open(self.path, "a+b") as handle:
            key_file = self.path.with_name(self.path.stem + ".key.json")
            if not key_file.exists():
                write_json(key_file, self.key_fields)
            yield handle

    def _read(self, handle: IO[bytes]) -> dict[str, float]:
        """Question key -> accuracy of every record; a partial last line is cut off, a bad line is an error."""
        handle.seek(0)
        data = handle.read()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            log.warning("%s: dropping a partial last line (%d bytes, from an interrupted write); its questions "
                        "will be computed again", self.path, len(data) - keep)
            handle.truncate(keep)
        done: dict[str, float] = {}
        for line_no, line in enumerate(data[:keep].decode("utf-8").splitlines(), start=1):
            if line.strip():
                key, accuracy = self._record(line, line_no)
                done[key] = accuracy
        return done

    def _record(self, line: str, line_no: int) -> tuple[str, float]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(self.path, line_no, json_error_text(error)) from None
        if not isinstance(row, dict):
            raise DataFormatError(self.path, line_no, f"expected a JSON object, got {type(row).__name__}")
        if not isinstance(row.get("key"), str):
            raise DataFormatError(self.path, line_no, "expected a string", field="key")
        if row.get("accuracy") not in (0, 1) or isinstance(row.get("accuracy"), bool):
            raise DataFormatError(self.path, line_no, f"expected 0.0 or 1.0, got {row.get('accuracy')!r}",
                                  field="accuracy")
        return row["key"], float(row["accuracy"])


def _unique_keys(rows: Sequence[QARow]) -> list[str]:
    """Each row's question key; one id with two different questions (or golden answers) is an error."""
    keys, by_id = [], {}
    for row in rows:
        if not isinstance(row, QARow):
            raise TypeError(f"rows must be QARow (agentic_retriever.base.qa_sources), got {type(row).__name__}")
        key = _question_key(row)
        if by_id.setdefault(row.id, key) != key:
            raise ValueError(f"question id {row.id!r} is given twice with different questions or golden answers")
        keys.append(key)
    return keys


# -------------------------------------------------------------------------------------------- training filters


#: The golden answers of the questions s3 removes from training (section 4.1, "Datasets").
def _drop_reasons(rows: Sequence[QARow], naive_rag_accuracy: Mapping[str, float] | None, drop_yes_no: bool,
                  drop_naive_rag_solved: bool) -> Iterator[tuple[QARow, str | None]]:
    """Each row with the first filter that drops it ("yes_no", then "naive_rag_solved"), or None when kept."""
    if drop_naive_rag_solved and naive_rag_accuracy is None:
        raise ValueError("drop_naive_rag_solved needs the naive-RAG accuracies (NaiveRagCache.accuracies)")
    for row in rows:
        if drop_yes_no and is_yes_no(row.golden_answers):
            yield row, "yes_no"
        elif drop_naive_rag_solved:
            if row.id not in naive_rag_accuracy:
                raise KeyError(f"no naive-RAG accuracy for question {row.id!r}")
            yield row, "naive_rag_solved" if naive_rag_accuracy[row.id] > 0 else None
        else:
            yield row, None


def training_rows(rows: Sequence[QARow], naive_rag_accuracy: Mapping[str, float] | None, *,
                  drop_yes_no: bool = True, drop_naive_rag_solved: bool = True) -> list[QARow]:
    """s3's training questions: without yes/no (and true/false) questions (section 4.1), and only those whose
    naive-RAG accuracy is 0 (section 3.2), each filter a switch. Yes/no questions are dropped first, so
    `naive_rag_accuracy` needs only the other questions."""
    reasons = _drop_reasons(rows, naive_rag_accuracy, drop_yes_no, drop_naive_rag_solved)
    return [row for row, reason in reasons if reason is None]


def training_filter_counts(rows: Sequence[QARow], naive_rag_accuracy: Mapping[str, float] | None, *,
                           drop_yes_no: bool = True, drop_naive_rag_solved: bool = True) -> dict[str, int]:
    """What `training_rows` does with the same arguments, counted: ``questions``, ``dropped_yes_no``,
    ``dropped_naive_rag_solved`` and ``kept``."""
    counts = {"questions": 0, "dropped_yes_no": 0, "dropped_naive_rag_solved": 0, "kept": 0}
    for _, reason in _drop_reasons(rows, naive_rag_accuracy, drop_yes_no, drop_naive_rag_solved):
        counts["questions"] += 1
        counts[f"dropped_{reason}" if reason else "kept"] += 1
    return counts
