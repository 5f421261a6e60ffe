"""One writer per artifact: an advisory lock that a second writer meets at once, naming the holder.

A multi-day run is resumed by starting the same command again; a requeued job can start beside the old one
that is still running. Two writers on one loop folder, trajectory file, retriever output or embeddings file
corrupt it (duplicate rows, a clipped line, a memmap truncated under the first writer). Each of those writers
holds a `WriterLock` for as long as it writes: an exclusive ``flock`` on a small lock file beside (or inside)
what it writes, with the holder's pid, host and start time written into it.

* The second writer is refused at once with `WriterLockedError`, which names the artifact, the lock file and the
  holder's pid and host.
* A stale lock is taken over: the kernel lets go of a ``flock`` when its holder exits, however it exits
  (SIGKILL included), so the next writer simply acquires it; the pid left in the file is only information.
* Readers take no lock. The lock is advisory and per host on most network filesystems: on NFS, ``flock`` is
  emulated with POSIX locks (Linux >= 2.6.12), which lock across clients; on filesystems without locks the
  acquisition raises an OSError naming the lock file.

    with WriterLock("runs/x/loop.lock", "the loop folder runs/x"):
        ...   # the only writer of runs/x
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

__all__ = ["WriterLock", "WriterLockedError", "lock_beside"]


class WriterLockedError(RuntimeError):
    """Another live process holds the writer lock of an artifact."""

    def __init__(self, what: str, lock_path: Path, holder: str):
        self.what, self.lock_path, self.holder = what, lock_path, holder
        super().__init__(f"{what} is being written by another process ({holder or 'holder unknown'}; lock "
                         f"{lock_path}): one writer at a time. Wait for it to finish or stop it; a lock whose "
                         "holder has exited is taken over by itself")


def lock_beside(path: str | os.PathLike) -> Path:
    """The lock file of `path` (a file or a folder that is replaced by rename): ``PATH.lock`` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


class WriterLock:
    """An exclusive, non-blocking ``flock`` on `lock_path` for the writer of `what` (see the module docstring).
    A context manager; `acquire` / `release` for a holder that outlives one block."""

    def __init__(self, lock_path: str | os.PathLike, what: str):
        self.lock_path, self.what = Path(lock_path), what
        self._fd: int | None = None

    def acquire(self) -> WriterLock:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = _read_holder(fd)
                os.close(fd)
                if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise WriterLockedError(self.what, self.lock_path, holder) from None
                raise OSError(error.errno, f"cannot lock {self.lock_path} for {self.what}: {error.strerror}") from None
            if _same_file(fd, self.lock_path):
                break
            os.close(fd)  # its holder removed the file (`remove`) after this opened it: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                  .encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let go of the lock (the lock file stays: removing it would race with the next writer's open)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """Remove the lock file, then let go (for an artifact that is gone once its writer is done: a writer that
        opened the file meanwhile sees it removed and locks a new one)."""
        if self._fd is not None:
            self.lock_path.unlink(missing_ok=True)
        self.release()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
