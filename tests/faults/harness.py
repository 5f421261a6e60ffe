"""Real faults for the fault matrix: a child Python process that is SIGKILLed at a chosen point inside a write, or
that runs with a file-size limit as its full disk (portable: ``RLIMIT_FSIZE`` needs no mount and no root).

A kill point is a function named ``module:Qualified.name``: its n-th call sends SIGKILL to the child itself, before
the call, after it, or (for ``os:write``) after writing the first half of what it was given, so the file is left
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
        calls[0] += 1
        if calls[0] != nth:
            return original(*args, **kwargs)
        if when == "half":  # os.write(fd, data): the first half reaches the file, then the process dies
            fd, data = args
            original(fd, bytes(data)[: max(1, len(data) // 2)])
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
              fsize: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `code` (Python, dedented) in a child process with the fault given, from the repository root; returns
    the finished process (``returncode == -9`` when the kill point was reached)."""
    fault = {"kill_at": kill_at, "nth": nth, "when": when, "fsize": fsize}
    script = _PRELUDE.replace("__FAULT__", repr(fault)) + "\n" + textwrap.dedent(code)
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def killed(process: subprocess.CompletedProcess) -> bool:
    return process.returncode == -signal.SIGKILL


def succeeded(process: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`process`, asserted to have exited 0 (its stderr's tail in the message otherwise)."""
    assert process.returncode == 0, f"exit {process.returncode}:\n{process.stderr[-3000:]}"
    return process


def as_literal(value) -> str:
    """`value` as a Python literal for a child's code (paths as strings)."""
    return repr(json.loads(json.dumps(value, default=str)))
