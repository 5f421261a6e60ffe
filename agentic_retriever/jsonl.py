"""JSONL reading with precise errors, and atomic (write-temp-then-rename) writing."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any


class DataFormatError(ValueError):
    """Bad input data; the message names the file, the line and the field."""

    def __init__(self, path: str | os.PathLike, line: int | None, problem: str, field: str | None = None):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        where = f"{path}:{line}" if line is not None else str(path)
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{problem}")


def iter_jsonl(path: str | os.PathLike, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line number, object) for every non-blank line; raise DataFormatError on bad lines.

    `start`/`stop` select the non-blank lines with index start..stop-1 (a shard's slice): only those are parsed.
    """
    index = 0
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if stop is not None and index >= stop:
                return
            index += 1
            if index <= start:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(path, line_no, f"invalid JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(row, dict):
                raise DataFormatError(path, line_no, f"expected a JSON object, got {type(row).__name__}")
            yield line_no, row


def require_field(path: str | os.PathLike, line: int, row: dict, field: str, kind: type | tuple[type, ...]) -> Any:
    """Return row[field], or raise DataFormatError naming file, line and field when missing or mistyped."""
    if field not in row:
        raise DataFormatError(path, line, "missing", field=field)
    value = row[field]
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in _as_tuple(kind):
        names = "/".join(k.__name__ for k in _as_tuple(kind))
        raise DataFormatError(path, line, f"expected {names}, got {type(value).__name__}", field=field)
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside `path`; on success rename it over `path`, on error remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Write rows atomically; return how many were written."""
    count = 0
    with atomic_write(path) as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write one JSON document atomically (indented, for people to read)."""
    with atomic_write(path) as handle:
        json.dump(obj, handle, indent=2, ensure_ascii=False)
        handle.write("\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError as error:
            raise DataFormatError(path, error.lineno, f"invalid JSON ({error.msg})") from None
