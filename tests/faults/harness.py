"""Real faults for the fault matrix: a child Python process that is SIGKILLed at a chosen point inside a write, or
that runs with a file-size limit as its full disk (portable: ``RLIMIT_FSIZE`` needs no mount and no root).

A kill point is a function named ``module:Qualified.name``: its n-th call sends SIGKILL to the child itself, before
the call, after it, or (``when="part"``, for ``os:write``) after writing the first 40% of what it was given, so the file is left
as a kill in the middle of the write leaves it. Nothing is raised: the process dies as a scheduler or the OOM
killer would kill it, and what is on disk is what the next run finds.

    killed = run_child(CODE, kill_at="transformers.trainer_callback:TrainerState.save_to_json")
    assert killed.returncode == -signal.SIGKILL
    again = run_child(CODE)              # the same command again
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PRELUDE = r'''
import importlib, os, resource, signal, sys

def _resolve(target):
    module_name, _, qualname = target.partition(":")
    owner = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name

def _install_kill(target, nth, when):
    owner, name = _resolve(target)
    original = getattr(owner, name)
    calls = [0]

    def killing(*args, **kwargs):
        if _fault.get("file") and not os.readlink(f"/proc/self/fd/{args[0]}").endswith(_fault["file"]):
            return original(*args, **kwargs)  # os.write to another file than the one under test
        calls[0] += 1
        if calls[0] != nth:
            return original(*args, **kwargs)
        if when == "part":  # os.write(fd, data): the first 40% reach the file (mid-record), then the process dies
            fd, data = args
            original(fd, bytes(data)[: len(data) * 2 // 5 + 1])
        elif when == "after":
            original(*args, **kwargs)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(owner, name, staticmethod(killing) if isinstance(owner, type) and isinstance(
        owner.__dict__.get(name), staticmethod) else killing)

_fault = __FAULT__
if _fault.get("fsize") is not None:  # the full disk: writes past this many bytes fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (_fault["fsize"], resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
if _fault.get("kill_at"):
    _install_kill(_fault["kill_at"], _fault["nth"], _fault["when"])
'''


def run_child(code: str, kill_at: str | None = None, nth: int = 1, when: str = "before",
              file: str = "", fsize: int | None = None, tmpfs: tuple[Path, int] | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `code` (Python, dedented) in a child process with the fault given, from the repository root; returns
    the finished process (``returncode == -9`` when the kill point was reached). With `file`, only calls whose first
    argument is a descriptor of a file whose path ends so count (``os:write`` to the file under test). `tmpfs` (folder, bytes) mounts a
    filesystem of that size on the folder for the child alone (a user and mount namespace: `small_disk_available`),
    a disk that really fills."""
    fault = {"kill_at": kill_at, "nth": nth, "when": when, "file": file, "fsize": fsize}
    script = _PRELUDE.replace("__FAULT__", repr(fault)) + "\n" + textwrap.dedent(code)
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-c", script]
    if tmpfs is not None:
        folder, size = tmpfs
        command = [*_SMALL_DISK, f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"', str(folder), *command]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


_SMALL_DISK = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c"]


def small_disk_available(folder: Path) -> bool:
    """Whether this machine lets a process mount a small tmpfs in a namespace of its own (no root needed where
    unprivileged user namespaces are allowed)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run([*_SMALL_DISK, 'mount -t tmpfs -o size=4096 tmpfs "$0"', str(folder)],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def killed(process: subprocess.CompletedProcess) -> bool:
    return process.returncode == -signal.SIGKILL


def succeeded(process: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`process`, asserted to have exited 0 (its stderr's tail in the message otherwise)."""
    assert process.returncode == 0, f"exit {process.returncode}:\n{process.stderr[-3000:]}"
    return process


def as_literal(value) -> str:
    """`value` as a Python literal for a child's code (paths as strings)."""
    return repr(json.loads(json.dumps(value, default=str)))
