"""Per-stage result stores: append-only JSONL keyed by a hash of each item's inputs and settings.

Every mining stage (candidates, sub-answers, local relevance, global answer correctness) stores one record per
item (round or trajectory) under ``key = stable_hash(stage, stage version, the item's inputs, the settings
that change its result)``. A run computes only the keys its store lacks, and appends each finished batch
durably (flush + fsync). Hence:

* resumable: a killed run loses at most the batch in flight; the next run computes the missing keys only;
* idempotent: a key is written once (a second `put` of a key is ignored), so nothing is duplicated;
* selective recomputation: changing a setting changes the keys of the stages that read it (and of the stages
  fed by their results), and only those; earlier results stay in the file, so switching a setting back
  costs nothing;
* crash-safe: a last line without its newline (a crash mid-write) is cut off on open, with a warning.

Records are not held in memory: the store keeps key -> (offset, length) and reads a record when asked, so
the candidate passages of a paper-scale run (hundreds of thousands of rounds x 20 passages) stay on disk.
One process owns a store folder at a time (an advisory lock says so); mining shards use separate folders.

    with StageStore("runs/x/mining/stages/candidates.jsonl") as store:
        todo = [key for key in keys if key not in store]
        store.put({key: {"passages": [...]}} for key in todo)
        store.get(keys[0])
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Self

from agentic_retriever.base.jsonl import DataFormatError, append_whole, atomic_write, json_error_text
from agentic_retriever.base.writer_lock import WriterLock, WriterLockedError, lock_beside

__all__ = ["StageStore", "StoreLockedError", "open_stores"]

log = logging.getLogger(__name__)

_PREFIX = b'{"key": "'


class StoreLockedError(WriterLockedError):
    """Another process is writing the same store (one mining run per folder; mining shards use separate folders)."""


class StageStore:
    """One stage's append-only record file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(lock_beside(self.path), f"the mining store {self.path}")
        try:
            self._lock.acquire()
        except WriterLockedError as error:
            raise StoreLockedError(error.what, error.lock_path, error.holder) from None
        self._index: dict[str, tuple[int, int]] = {}
        self.path.touch()
        self._load_index()
        self._append = open(self.path, "ab", buffering=0)  # noqa: SIM115 (held until close)
        self._read = open(self.path, "rb")  # noqa: SIM115
        self._end = self.path.stat().st_size

    def _load_index(self) -> None:
        with open(self.path, "rb+") as handle:
            offset = 0
            for line_no, line in enumerate(handle, start=1):
                if not line.endswith(b"\n"):
                    log.warning("%s: dropping a partial last line (%d bytes, from an interrupted write)",
                                self.path, len(line))
                    handle.truncate(offset)
                    break
                key = self._key_of(line, line_no)
                if key is not None and key not in self._index:
                    self._index[key] = (offset, len(line))
                offset += len(line)

    def _key_of(self, line: bytes, line_no: int) -> str | None:
        if not line.strip():
            return None
        if line.startswith(_PREFIX):  # what `put` writes: read the key without parsing the record
            end = line.find(b'"', len(_PREFIX))
            if end > 0:
                return line[len(_PREFIX):end].decode("ascii")
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(self.path, line_no, json_error_text(error)) from None
        if not isinstance(row, dict) or not isinstance(row.get("key"), str):
            raise DataFormatError(self.path, line_no, "expected an object with a string key", field="key")
        return row["key"]

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def keys(self) -> Iterator[str]:
        return iter(self._index)

    def get(self, key: str) -> dict | None:
        """The record stored under `key`, or None."""
        where = self._index.get(key)
        if where is None:
            return None
        self._read.seek(where[0])
        return json.loads(self._read.read(where[1]))["value"]

    def put(self, records: Mapping[str, dict] | Iterable[tuple[str, dict]]) -> int:
        """Append the records whose keys are new, durably; return how many were written."""
        items = records.items() if isinstance(records, Mapping) else records
        lines, keys = [], []
        for key, value in items:
            if key in self._index or key in keys:
                continue
            lines.append((json.dumps({"key": key, "value": value}, ensure_ascii=False) + "\n").encode("utf-8"))
            keys.append(key)
        if not lines:
            return 0
        append_whole(self._append, b"".join(lines), self.path)
        for key, line in zip(keys, lines):
            self._index[key] = (self._end, len(line))
            self._end += len(line)
        return len(lines)

    def compact(self, keep: Iterable[str]) -> int:
        """Rewrite the file atomically with only the records of `keep`; return how many were dropped."""
        keep = [k for k in dict.fromkeys(keep) if k in self._index]
        records = [(k, self.get(k)) for k in keep]
        dropped = len(self._index) - len(keep)
        self._append.close()
        self._read.close()
        with atomic_write(self.path, "wb") as handle:
            for key, value in records:
                handle.write((json.dumps({"key": key, "value": value}, ensure_ascii=False) + "\n").encode("utf-8"))
        self._index = {}
        self._load_index()
        self._append = open(self.path, "ab", buffering=0)  # noqa: SIM115
        self._read = open(self.path, "rb")  # noqa: SIM115
        self._end = self.path.stat().st_size
        return dropped

    def close(self) -> None:
        for handle in (self._append, self._read):
            handle.close()
        self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_stores(folder: Path, stages: Iterable[str]) -> dict[str, StageStore]:
    """Stage name -> its store ``folder/<stage>.jsonl``; none is left open when one fails to open."""
    stores: dict[str, StageStore] = {}
    try:
        for stage in stages:
            stores[stage] = StageStore(folder / f"{stage}.jsonl")
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    return stores
