"""JSONL reading with precise errors, atomic (write-temp-then-rename) writing, and the i-of-n slices of a file's rows.

Temporary files and folders are created beside their target with the mode ``open()`` / ``mkdir()`` would
give a new one (0666 / 0777 less the umask), not ``tempfile``'s 0600 / 0700, so what is renamed into place
is as readable as any other file the process writes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any


log = logging.getLogger(__name__)

#: What a write meets when no byte more fits: a full disk, a full quota, the process's file-size limit.
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskFullError(OSError):
    """A write found no space (full disk or quota, or the file-size limit); the message names the file."""


#: Room a failed writer's folder must still have for its failure not to count as a full disk (`naming_disk_full`).
PROBE_BYTES = 64 << 20


@contextlib.contextmanager
def naming_disk_full(path: str | os.PathLike, probe: bool = False) -> Iterator[None]:
    """Turn a full disk met inside the block into a DiskFullError that names `path` and says what to do.

    An OSError says so by its errno. Some writers say nothing usable (torch.save: "unexpected pos 576 vs 534";
    safetensors' own error type): with `probe`, any other Exception is checked by reserving `PROBE_BYTES` in a
    file beside `path`, and counts as a full disk when that reservation meets one."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as error:
        if error.errno not in _DISK_FULL:
            raise
        raise _disk_full(path, error.errno, error.strerror) from error
    except Exception as error:
        full = _room_missing(Path(path)) if probe else None
        if full is None:
            raise
        raise _disk_full(path, full.errno, full.strerror) from error


def _disk_full(path: str | os.PathLike, number: int, reason: str | None) -> DiskFullError:
    return DiskFullError(number, f"no space left while writing {path} ({reason}): the disk or quota is full, or "
                         "the file-size limit was reached; free space and run the same command again (finished "
                         "work is kept)", str(path))


def _room_missing(path: Path) -> OSError | None:
    """The full-disk error that reserving `PROBE_BYTES` beside `path` meets, or None when there is room (or the
    filesystem cannot reserve)."""
    folder = path if path.is_dir() else path.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    try:
        probe, fd = _create_beside(folder / "space-probe", lambda c: os.open(c, _FILE_FLAGS, 0o666))
    except OSError as error:
        return error if error.errno in _DISK_FULL else None
    try:
        os.posix_fallocate(fd, 0, PROBE_BYTES)
    except OSError as error:
        return error if error.errno in _DISK_FULL else None
    finally:
        os.close(fd)
        os.unlink(probe)
    return None


def reserve_disk(path: str | os.PathLike) -> None:
    """Allocate every block of the file at `path` now (``posix_fallocate``), so writes through a memory map of it
    cannot meet a full disk later (there they are a SIGBUS, not an error); DiskFullError when the disk lacks
    the room. Filesystems that cannot reserve are left as they are, with a warning."""
    with naming_disk_full(path):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            log.warning("%s: this filesystem cannot reserve the file's blocks (%s); a full disk while writing it "
                        "would kill the process", path, error.strerror)
        finally:
            os.close(fd)


def append_whole(handle: IO[bytes], data: bytes, path: str | os.PathLike) -> None:
    """Append `data` to the unbuffered binary `handle` (opened for appending to `path`) and fsync it. When the write
    fails (a full disk: DiskFullError naming `path`), the file is cut back to its size before the call, so an
    append-only record file never ends in a partial record that the same process would write after."""
    fd = handle.fileno()
    start = os.lseek(fd, 0, os.SEEK_END)
    with naming_disk_full(path):
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, start)
            raise


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
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            line = utf8_line(raw, path, line_no)
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


def utf8_line(raw: bytes, path: str | os.PathLike, line: int) -> str:
    """`raw` (line `line` of `path`) as text, or DataFormatError naming the file, the line and the column of the
    first byte that is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataFormatError(path, line, f"not UTF-8 text (byte 0x{raw[error.start]:02x} at column "
                              f"{len(raw[:error.start].decode('utf-8', 'replace')) + 1}); save the file as "
                              "UTF-8") from None


def read_utf8_text(path: str | os.PathLike) -> str:
    """The whole of a text file, or DataFormatError naming the line of its first byte that is not UTF-8."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        start = data.rfind(b"\n", 0, error.start) + 1
        end = data.find(b"\n", error.start)
        utf8_line(data[start:end if end >= 0 else len(data)], path, line)
        raise  # not reached: the line holds the byte


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


def folder_built_once(target: str | os.PathLike, build: Callable[[Path], None]) -> Path:
    """`target`, built by ``build(folder)`` into a new folder beside it and renamed into place when it is not there
    yet (its files with new-file modes: `give_new_file_modes`). A crash leaves no half-built `target`, and of
    processes building it at once the first rename wins, the others' builds are dropped: for caches keyed by content,
    whose every build is the same."""
    target = Path(target)
    if target.is_dir():
        return target
    building = temp_folder_beside(target)
    try:
        build(building)
        give_new_file_modes(building)
        try:
            os.rename(building, target)
        except OSError:
            if not target.is_dir():  # not a concurrent build that finished first
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def replace_folder(building: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Put the filled folder `building` (beside `out`) in the place of `out`: its files get new-file modes
    (`give_new_file_modes`), `out` (if any) is renamed aside to a hidden ``.NAME.XXXXXXXX.replaced``, `building`
    is renamed to `out`, and only then is the old folder removed. A kill at any point leaves `out` whole (the old
    folder or the new one) or absent, never half-deleted; asides left by a kill are removed by the next call."""
    building, out = Path(building), Path(out)
    give_new_file_modes(building)
    for stale in out.parent.glob(f".{out.name}.*.replaced"):
        shutil.rmtree(stale)
    aside = None
    if out.exists():
        aside = out.with_name(f".{out.name}.{secrets.token_hex(4)}.replaced")
        out.rename(aside)
    building.rename(out)
    if aside is not None:
        shutil.rmtree(aside)
    return out


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", private: bool = False) -> Iterator[IO]:
    """Open a temp file beside `path`; on success rename it over `path`, on error remove it. The file gets the
    mode a new file from ``open()`` gets (0666 less the umask), or 0600 when `private` (a secret: readable by its
    owner alone from its first byte on); a full disk is a DiskFullError naming `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming_disk_full(path):
        tmp, fd = _create_beside(path, lambda candidate: os.open(candidate, _FILE_FLAGS, 0o600 if private else 0o666))
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
