"""What a verl run leaves on the host after it ends, removed by its ``launch.sh`` on exit (`remove_leftovers`).

verl 0.9.1 sends the actor's weights to a rollout server it cannot share CUDA memory with (verl's platform says
``is_ipc_supported`` False: CPU runs, and GPUs without IPC) through shared memory and ZMQ. Its segments
(``/dev/shm/psm_*``, Python's ``multiprocessing.shared_memory`` names, and ``/dev/shm/verl_weights_*``, verl's
transfer buffer, 2 GiB sparse) and the IPC socket files of ZMQ and vLLM in the temporary folder stay behind when a
process dies before unlinking them, and some even after a clean exit: about 400 MB of ``psm_*`` a run on the CPU
(docs/verl.md). A leftover is a file of those kinds created since the run started that no live process holds open or
mapped (segments) or has bound (sockets, ``/proc/net/unix``), so a file of another program, or of a run still going,
is never touched.

    python -m agent.rl.verl.leftovers --since 1764370000.0   # launch.sh's EXIT trap
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SHM_PATTERNS = ("psm_*", "verl_weights_*")


def _bound_sockets(proc: Path) -> set[str]:
    """Paths of the Unix sockets some process has bound (``/proc/net/unix``: the path is the last column)."""
    try:
        lines = (proc / "net" / "unix").read_text(encoding="utf-8", errors="replace").splitlines()[1:]
    except OSError:
        return set()
    return {fields[-1] for fields in (line.split() for line in lines) if len(fields) >= 8}


def files_in_use(proc: Path = Path("/proc")) -> set[str]:
    """Paths any process this user can read holds open (``/proc/PID/fd``), mapped (``/proc/PID/maps``) or bound as
    a Unix socket."""
    used = _bound_sockets(proc)
    for pid in proc.iterdir():
        if not pid.name.isdigit():
            continue
        try:
            for fd in (pid / "fd").iterdir():
                try:
                    used.add(os.readlink(fd))
                except OSError:
                    continue
            with open(pid / "maps", encoding="utf-8", errors="replace") as maps:
                fields = (line.split(maxsplit=5) for line in maps)  # the sixth field, when there is one, is the path
                used.update(field[5].strip() for field in fields if len(field) == 6)
        except OSError:  # the process ended, or is not ours to read
            continue
    return {path.removesuffix(" (deleted)") for path in used}


def leftovers(since: float, candidates: Iterable[Path], in_use: set[str]) -> list[Path]:
    """The `candidates` modified at or after `since` (a time.time() value) that no process holds."""
    found = []
    for path in candidates:
        try:
            if path.stat().st_mtime >= since and str(path) not in in_use:
                found.append(path)
        except FileNotFoundError:
            continue
    return found


def remove_leftovers(since: float, shm_dir: Path = SHM_DIR,
                     socket_dirs: Iterable[Path] = (Path(tempfile.gettempdir()),)) -> dict[Path, int]:
    """Remove the shared-memory segments in `shm_dir` and the socket files in `socket_dirs` (not below them) left
    since `since`: their sizes in bytes (a sparse segment counts its full length)."""
    candidates = [path for pattern in SHM_PATTERNS for path in shm_dir.glob(pattern)] if shm_dir.is_dir() else []
    for folder in socket_dirs:
        candidates += [path for path in Path(folder).glob("*") if path.is_socket()]
    removed = {}
    for path in leftovers(since, candidates, files_in_use()):
        try:
            size = path.stat().st_size
            path.unlink()
            removed[path] = size
        except FileNotFoundError:
            continue
    return removed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", type=float, required=True, help="the run's start (seconds since the epoch)")
    args = parser.parse_args(argv)
    removed = remove_leftovers(args.since)
    print(f"verl run ended: removed {len(removed)} leftover shared-memory segments and sockets "
          f"({sum(removed.values()) / 2**20:.0f} MiB)", flush=True)


if __name__ == "__main__":
    main()
