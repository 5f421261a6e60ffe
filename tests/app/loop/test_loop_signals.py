"""The loop's child processes under failure (agentic_retriever.app.loop.processes): real process trees, each with a
worker that leaves its parent's process group (as Ray's and vLLM's workers do), stopped whatever way their step
ends: a leader that exits first, a server that dies before its health check, a loop killed with SIGTERM mid-step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentic_retriever.app.loop.processes import StepServerSpec, StepServers, signals_stop_children
from agentic_retriever.base.sessions import session_members, signal_handlers_kept, start_session, stop_session
from tests.faults.harness import ROOT


def _tree(pid_file: Path, then: str) -> list[str]:
    """A leader that starts a worker, which moves to a process group of its own and then writes its pid to
    `pid_file`; the leader goes on with `then`."""
    worker = (f"import os, time; os.setpgid(0, 0); open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid())); "
              f"os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(600)")
    code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", {worker!r}])
        {then}
    """)
    return [sys.executable, "-c", code]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _wait_for(path: Path, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return int(path.read_text())


def _gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_leader_that_exits_first_leaves_nothing_of_its_tree(tmp_path):
    process = start_session(_tree(tmp_path / "worker", "sys.exit(0)"), tmp_path / "tree.log")
    worker = _wait_for(tmp_path / "worker")
    assert process.wait(timeout=60) == 0 and _alive(worker)  # the leader is gone, its worker lives on
    assert os.getpgid(worker) == worker != process.pid  # out of reach of a signal to the leader's group
    stop_session(process)
    assert _gone(worker) and session_members(process.pid) == []


def test_a_server_that_dies_before_its_health_check_takes_its_workers_with_it(tmp_path):
    spec = StepServerSpec(name="scorer", command=" ".join(_quote(_tree(tmp_path / "worker", "sys.exit(1)"))),
                          health_url="http://127.0.0.1:9/health", steps=("mining",), start_timeout_s=60)
    with StepServers([spec], tmp_path / "services") as servers:
        with pytest.raises(RuntimeError, match="exited with status 1 before"):
            servers.before("mining")
    assert _gone(_wait_for(tmp_path / "worker"))


def _quote(words: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(word) for word in words]


def test_a_loop_killed_with_sigterm_mid_step_stops_every_process_and_exits_with_the_signals_status(tmp_path):
    """The loop's process as the CLI runs it: the signal raises where the step waits, the step's cleanup and the
    handler stop every tree, and the process exits 128 + 15."""
    loop = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from agentic_retriever.app.loop.processes import LoopSignal, run_on_devices, signals_stop_children
        tree = {_tree(tmp_path / "worker", "time.sleep(600)")!r}
        try:
            with signals_stop_children():
                run_on_devices([tree], ["cpu"], Path({str(tmp_path / "logs")!r}), "shard")
        except LoopSignal as stopped:
            sys.exit(stopped.exit_status)
    """)
    loop_process = subprocess.Popen([sys.executable, "-c", loop])
    worker = _wait_for(tmp_path / "worker")
    loop_process.send_signal(signal.SIGTERM)
    assert loop_process.wait(timeout=120) == 128 + signal.SIGTERM
    assert _gone(worker)


def test_a_loop_killed_with_sigkill_leaves_no_step_server_or_worker_behind(tmp_path):
    """SIGKILL cannot be caught: the loop's own cleanup never runs. Each child's session guard hears of its parent's
    death from the kernel and stops the whole session: the server (a leader) and the worker it moved to a process
    group of its own (as vLLM's engine processes do)."""
    loop = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from agentic_retriever.app.loop.processes import StepServerSpec, StepServers
        spec = StepServerSpec(name="scorer",
                              command={" ".join(_quote(_tree(tmp_path / "worker", "time.sleep(600)")))!r},
                              health_url="http://127.0.0.1:9/health", steps=("mining",), start_timeout_s=600)
        with StepServers([spec], Path({str(tmp_path / "services")!r})) as servers:
            servers.before("mining")   # waits for a health URL that never answers
    """)
    loop_process = subprocess.Popen([sys.executable, "-c", loop], env=os.environ | {"PYTHONPATH": str(ROOT)})
    worker = _wait_for(tmp_path / "worker")
    server = os.getsid(worker)
    assert _alive(server)
    loop_process.send_signal(signal.SIGKILL)
    assert loop_process.wait(timeout=60) == -signal.SIGKILL
    assert _gone(worker, timeout_s=30) and _gone(server, timeout_s=30) and session_members(server) == []


def test_the_signal_handlers_before_are_restored(tmp_path):
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with signals_stop_children():
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_session_started_where_sigint_is_blocked_still_gets_a_sigint(tmp_path):
    """A child starts with its parent thread's signal mask (Ray's and gRPC's threads block SIGINT): the session's
    guard unblocks what it forwards, so an interrupt still reaches it and its command. (The caller handles SIGINT, as
    an interactive loop does: a disposition left ignored by an earlier test of this worker would reach the command as
    ignored, by design.)"""
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process = start_session([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                                tmp_path / "command.log")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        signal.signal(signal.SIGINT, handler)
    try:
        deadline = time.monotonic() + 60
        while "up" not in (tmp_path / "command.log").read_text():
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) != 0
    finally:
        stop_session(process, 5)


def test_a_library_call_that_installs_its_own_signal_handlers_leaves_the_callers_in_place():
    """`signal_handlers_kept` (around ray.init, which gives a driver a SIGTERM handler that exits it): inside the
    block the library's handlers, after it the caller's again, also when the block fails."""
    def ours(signum, frame):
        raise AssertionError("not called")

    before, before_hup = signal.signal(signal.SIGTERM, ours), signal.getsignal(signal.SIGHUP)
    try:
        with pytest.raises(RuntimeError), signal_handlers_kept():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            raise RuntimeError("the library call failed")
        assert signal.getsignal(signal.SIGTERM) is ours and signal.getsignal(signal.SIGHUP) == before_hup
    finally:
        signal.signal(signal.SIGTERM, before)
