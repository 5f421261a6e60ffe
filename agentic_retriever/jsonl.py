"""JSONL reading with precise errors, atomic (write-temp-then-rename) writing, and the i-of-n slices of a file's rows.

Temporary files and folders are created beside their target with the mode ``open()`` / ``mkdir()`` would
give a new one (0666 / 0777 less the umask), not ``tempfile``'s 0600 / 0700, so what is renamed into place
is as readable as any other file the process writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
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
                raise DataFormatError(path, line_no, json_error_text(error)) from None
            if not isinstance(row, dict):
                raise DataFormatError(path, line_no, f"expected a JSON object, got {type(row).__name__}")
            yield line_no, row


def json_error_text(error: json.JSONDecodeError) -> str:
    """``invalid JSON (<reason> at column N)`` for a DataFormatError that names the line. Some of `json`'s
    reasons end in "at" ("Unterminated string starting at", "Invalid control character at"): it is not repeated."""
    reason = error.msg.removesuffix(" at")
    return f"invalid JSON ({reason} at column {error.colno})"


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


_FILE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def _create_beside(path: Path, create: Callable[[Path], object]) -> tuple[Path, object]:
    """Create a new, uniquely named hidden ``.NAME.XXXXXXXX.tmp`` beside `path` with `create`; retry on a clash."""
    for _ in range(100):
        candidate = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return candidate, create(candidate)
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file beside {path}")


def temp_folder_beside(path: str | os.PathLike) -> Path:
    """A new empty folder beside `path` (created with mode 0777 less the umask, like ``mkdir``), to fill and then
    rename over `path`; the caller removes it when the rename does not happen."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder, _ = _create_beside(path, lambda candidate: os.mkdir(candidate, 0o777))
    return folder


def give_new_file_modes(folder: str | os.PathLike) -> None:
    """Give every file under `folder` the mode a new file from ``open()`` gets (0666 less the umask, read from a
    probe file so the process umask is never changed): some writers leave theirs 0600 (safetensors' model files),
    which other users of a shared cache or run folder could not read."""
    folder = Path(folder)
    probe, fd = _create_beside(folder / "mode", lambda candidate: os.open(candidate, _FILE_FLAGS, 0o666))
    os.close(fd)
    mode = stat.S_IMODE(os.stat(probe).st_mode)
    os.unlink(probe)
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def replace_folder(building: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Put the filled folder `building` (beside `out`) in the place of `out`: its files get new-file modes
    (`give_new_file_modes`), then `out`, if any, is removed and `building` renamed to it."""
    building, out = Path(building), Path(out)
    give_new_file_modes(building)
    if out.exists():
        shutil.rmtree(out)
    building.rename(out)
    return out


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside `path`; on success rename it over `path`, on error remove it. The file gets the
    mode a new file from ``open()`` gets (0666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, fd = _create_beside(path, lambda candidate: os.open(candidate, _FILE_FLAGS, 0o666))
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
            raise DataFormatError(path, error.lineno, json_error_text(error)) from None


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (0-based i) as (i, n): slice i of n of a file's rows, as `agent rollout` and `mine run` take it."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"a shard is written i/n (e.g. 0/4), got {text!r}") from None
    check_shard((i, n))
    return i, n


def check_shard(shard: tuple[int, int]) -> tuple[int, int]:
    """`shard` (i, n), refused unless 0 <= i < n."""
    i, n = shard
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard}")
    return i, n


def shard_bounds(total: int, shard: tuple[int, int]) -> tuple[int, int]:
    """[start, stop) of contiguous slice i of n over `total` items: the slices cover every item once."""
    i, n = check_shard(shard)
    return i * total // n, (i + 1) * total // n
