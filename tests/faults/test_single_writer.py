"""One writer per folder: the loop folder and a retriever output, each held by a real run in a child process (paused
inside its work); a second run on the same folder is refused at once, naming the holder's pid and the folder;
once the holder is SIGKILLed, its lock is taken over by the next run. (Trajectory files and embeddings:
test_writer_faults.py; mining stores: tests/mining/test_mining_store.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.faults.harness import ROOT, run_child, succeeded
from tests.faults.test_retriever_faults import _inputs, _train_code

_PAUSED = """
    import time
    def paused(*args, **kwargs):
        print("holding", flush=True)
        time.sleep(120)
    {patch}
"""


def _hold(code: str, cwd) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                               env=os.environ | {"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.strip() == "holding", process.stderr.read() if process.poll() is not None else line
    return process


def _run_in(cwd, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(ROOT)}, timeout=300)


_LOOP = """
    from agentic_retriever.app.loop.runner import run_loop
    from tests.app.loop.test_loop import make_job
    run_loop(make_job("unused-encoder", "unused-agent"))
"""


@pytest.fixture()
def holders():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait()


def test_a_second_loop_on_the_same_folder_is_refused_and_a_dead_loops_lock_is_taken_over(tmp_path, holders):
    patch = "import agentic_retriever.app.loop.runner as runner; runner._run_loop = paused"
    holder = _hold(textwrap.dedent(_PAUSED).format(patch=patch) + textwrap.dedent(_LOOP), tmp_path)
    holders.append(holder)
    second = _run_in(tmp_path, _LOOP)
    assert second.returncode == 1 and "WriterLockedError" in second.stderr
    assert f"the loop folder loop is being written by another process (pid {holder.pid} on" in second.stderr
    assert "lock loop/loop.lock" in second.stderr
    assert not (tmp_path / "loop" / "loop.json").exists()  # the refused run wrote nothing

    holder.send_signal(signal.SIGKILL)
    holder.wait()
    ran = """
        import agentic_retriever.app.loop.runner as runner
        runner._run_loop = lambda *args: print("ran as the loop folder's writer")
    """
    after = _run_in(tmp_path, textwrap.dedent(ran) + textwrap.dedent(_LOOP))
    assert after.returncode == 0 and "ran as the loop folder's writer" in after.stdout, after.stderr[-2000:]


def test_a_second_training_into_the_same_retriever_output_is_refused(tmp_path, tiny_model_dir, holders):
    corpus, rows = _inputs(tmp_path)
    out = tmp_path / "retriever"
    code = _train_code(tiny_model_dir, corpus, rows, out)
    patch = "import agentic_retriever.training.trainer as trainer; trainer._train_retriever = paused"
    holders.append(holder := _hold(textwrap.dedent(_PAUSED).format(patch=patch) + textwrap.dedent(code), ROOT))
    second = run_child(code)
    assert second.returncode == 1 and "WriterLockedError" in second.stderr
    assert f"the retriever output {out} is being written by another process (pid {holder.pid} on" in second.stderr
    assert not (tmp_path / "retriever.checkpoints").exists()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    succeeded(run_child(code))
    assert (out / "train_manifest.json").is_file()
