"""Child processes in sessions of their own: started with their output in a log, stopped with everything they
started (workers that moved to process groups of their own included), and the tail of a log for an error. Shared by
the loop's steps and services and by the agent's verl runs (`agent.rl.verl`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

#: The word in a configured command (a service, the retriever launcher, verl's launcher) that stands for the loop's
#: own interpreter, so that ``{python} -m torch.distributed.run`` runs the torch of the loop's environment whatever
#: PATH holds (an unactivated venv's ``torchrun`` or ``vllm`` is another interpreter's, or none).
PYTHON = "{python}"


def command_words(command: str) -> list[str]:
    """`command` split like a shell, each `PYTHON` word replaced by this interpreter (``sys.executable``)."""
    return [sys.executable if word == PYTHON else word for word in shlex.split(command)]


#: How a child's guard starts: this package imported from where this process found it, whatever the child's working
#: folder and PYTHONPATH (which its command inherits unchanged).
_GUARD = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
          "from agentic_retriever.base.session_guard import main; sys.exit(main(sys.argv[1:]))")

#: Lines of a failed process's log quoted in the error.
_TAIL_LINES = 20


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """The last `lines` lines of a process's log, for an error message."""
    if not path.exists():
        return f"(no log at {path})"
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def session_members(session: int) -> list[int]:
    """The live processes of `session` (a child started by `start_session`, with everything it started that stayed
    in its session, whatever process group they moved to); zombies, which hold nothing, are not counted."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                if os.getsid(int(entry)) == session and stat[stat.rindex(")") + 2] != "Z":
                    members.append(int(entry))
            except (OSError, ValueError):
                continue
    return members


def kill_session(session: int, grace_s: float, leader: int | None = None, spare: int | None = None) -> None:
    """SIGTERM to the session leader's process group, then, once the leader is gone or after `grace_s`, SIGKILL to
    every process left in the session: a leader that exited first, or workers in process groups of their own
    (Ray's, vLLM's), are stopped all the same. `leader`: the process whose exit ends the grace period (default: the
    session's leader); `spare`: a process of the session that is killed by no one (the caller)."""
    try:
        os.killpg(session, signal.SIGTERM)
    except ProcessLookupError:
        pass
    leader = session if leader is None else leader
    deadline = time.monotonic() + grace_s
    while leader in session_members(session) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in session_members(session):
        if pid == spare:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


#: Every child the loop started with `start_session` and has not stopped: what `stop_all` stops on a signal.
_CHILDREN: set[subprocess.Popen] = set()


def start_session(command: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                  cwd: Path | None = None) -> subprocess.Popen:
    """`command` in a session of its own (so that stopping it stops everything it starts), stdout and stderr
    appended to `log_path`, registered until `stop_session`. The session's leader is `session_guard`, which runs
    `command` and stops the whole session when this process dies, even by SIGKILL (FileNotFoundError at once for
    a command that is not there)."""
    command = list(command)
    if shutil.which(command[0], path=(env or os.environ).get("PATH")) is None and not os.path.isfile(command[0]):
        raise FileNotFoundError(f"no such program: {command[0]!r} (command {shlex.join(command)})")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    guarded = [sys.executable, "-c", _GUARD, str(os.getpid()), *command]
    with open(log_path, "ab") as handle:  # the child keeps its own descriptor
        process = subprocess.Popen(guarded, env=env, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    _CHILDREN.add(process)
    return process


def stop_session(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop a child of `start_session` and everything in its session (`kill_session`), even when the child itself
    has already exited; reaps it."""
    kill_session(process.pid, grace_s if process.poll() is None else 0.0)
    process.wait()
    _CHILDREN.discard(process)


def stop_all(grace_s: float = 30.0) -> None:
    """Stop every child the loop started and has not stopped (`stop_session`)."""
    for process in list(_CHILDREN):
        stop_session(process, grace_s)


@contextmanager
def signal_handlers_kept(signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
    """Give this process's handlers of `signums` back after the block: around a library call that installs its own
    where the caller handles those signals (``ray.init`` gives a driver a SIGTERM handler that exits it). Outside the
    main thread, where no handler can be set, the block runs as it is."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.getsignal(signum) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in before.items():
            if handler is not None:
                signal.signal(signum, handler)
