"""``python -m agentic_retriever.base.session_guard PARENT_PID COMMAND...``: run COMMAND in this session, and stop
the whole session when the process PARENT_PID dies, however it dies.

`sessions.start_session` starts every child of the loop through this guard, as its session leader. A loop that is
SIGKILLed (the OOM killer, a scheduler's hard kill after its grace period) cannot stop anything; without the guard its
step servers (a 72B vLLM scorer holding four GPUs and a port) and shards would live on. The kernel tells the guard
its parent died (``PR_SET_PDEATHSIG``: SIGTERM), and the guard then stops every process of the session (SIGTERM to
the group, SIGKILL to what is left after the grace period, `sessions.kill_session`), its own included. A SIGTERM
from `sessions.stop_session` is handled the same way. The guard exits as its command exited: the same status, or
killed by the same signal. SIGINT, SIGHUP, SIGQUIT and the user signals sent to the guard are passed on to the
command.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from .sessions import kill_session

#: Signals the guard passes on to its command instead of acting on them (a terminal's Ctrl-C to the process the
#: caller started, a hang-up), so a command that traps them (verl's launch.sh) gets them as before.
FORWARDED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: How each forwarded signal was handled when the guard started (ignored or default), given back to the command.
_INHERITED = {signum: signal.getsignal(signum) for signum in FORWARDED}

#: Seconds the session's processes get between SIGTERM and SIGKILL once the parent is gone.
GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1


def _signal_on_parent_death(signum: int) -> None:
    """Ask the kernel (Linux) to send `signum` to this process when the thread that started it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _default_forwarded_signals() -> None:
    """In the command's process before it runs: the forwarded signals handled as they were when this guard
    started (the handlers installed here are not the command's)."""
    for signum, handler in _INHERITED.items():
        signal.signal(signum, handler)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m agentic_retriever.base.session_guard PARENT_PID COMMAND...", file=sys.stderr)
        return 2
    parent, command = int(argv[0]), argv[1:]
    stopping, child = [], None

    def stop(signum, frame) -> None:
        if stopping:  # the SIGTERM kill_session sends to the group, this process included
            return
        stopping.append(signum)
        kill_session(os.getsid(0), GRACE_S, leader=child.pid if child else None, spare=os.getpid())

    pending: list[int] = []

    def forward(signum, frame) -> None:  # to the command, as if sent to it (it may trap them: launch.sh does)
        if child is None:
            pending.append(signum)
        else:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    for signum in FORWARDED:
        signal.signal(signum, forward)
    # a child starts with the signal mask of the thread that started it (Ray's and gRPC's threads block SIGINT):
    # unblocked, a signal that came meanwhile is delivered now, and the command starts with it unblocked too
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, *FORWARDED})
    _signal_on_parent_death(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request above took effect
        return 1
    child = subprocess.Popen(command, preexec_fn=_default_forwarded_signals)
    for signum in pending:  # a signal that came before the command started
        child.send_signal(signum)
    while True:
        try:
            status = child.wait()
            break
        except InterruptedError:
            continue
    if status < 0:  # die of the same signal, so the caller sees what the command saw
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
