"""Append-only files and the embeddings memmap under real faults: a child SIGKILLed in the middle of an append or
an encode, a full disk (a file-size limit, and a small tmpfs that really fills), and a second writer on the same
artifact. The same command again finishes with every row once, as an uninterrupted run writes them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.faults.harness import ROOT, killed, run_child, small_disk_available, succeeded
from tests.fakes import synthetic_rows, write_jsonl

# ------------------------------------------------------------------------------------------------ trajectories

_ROLLOUTS = """
    import json
    from agent.env import EnvConfig
    from agent.rollouts import run_rollouts
    from tests.fakes import FakeClient, ScriptedLLM, load_smollm2_tokenizer
    rows = [{{"id": f"q{{i}}", "question": f"question number {{i}}?", "golden_answers": [f"ans {{i}}"]}} for i in range(6)]
    script = {{f"question number {{i}}?": ["<search> s </search>", f"<answer> ans {{i}} </answer>"] for i in range(6)}}
    summary = run_rollouts(rows, ScriptedLLM(load_smollm2_tokenizer(), script), FakeClient(), EnvConfig(), {path!r},
                           batch_size=2)
    print(json.dumps({{"written": summary.written, "skipped": summary.skipped}}))
"""


def _trajectory_ids(path: Path) -> list[str]:
    return [json.loads(line)["question_id"] for line in path.read_text(encoding="utf-8").splitlines()]


def _answers(path: Path) -> list[tuple]:
    return [(row["question_id"], row["answer"], row["em"]) for row in map(json.loads, path.open(encoding="utf-8"))]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The trajectory file of an uninterrupted run."""
    path = tmp_path_factory.mktemp("rollouts") / "reference.jsonl"
    succeeded(run_child(_ROLLOUTS.format(path=str(path))))
    return path


@pytest.mark.slow
def test_rollouts_killed_in_the_middle_of_an_append_finish_with_every_trajectory_once(tmp_path, reference):
    path = tmp_path / "t.jsonl"
    # the second batch's append: 40% of its bytes reach the file, then SIGKILL
    assert killed(run_child(_ROLLOUTS.format(path=str(path)), kill_at="os:write", nth=2, when="part",
                            file="t.jsonl"))
    assert not path.read_bytes().endswith(b"\n")  # a torn last line, as a kill mid-write leaves it
    again = succeeded(run_child(_ROLLOUTS.format(path=str(path))))
    assert json.loads(again.stdout.splitlines()[-1]) == {"written": 4, "skipped": 2}
    assert _trajectory_ids(path) == ["q0", "q1", "q2", "q3", "q4", "q5"]
    assert _answers(path) == _answers(reference)


@pytest.mark.slow
def test_a_full_disk_during_rollouts_names_the_file_and_keeps_whole_lines(tmp_path, reference):
    path = tmp_path / "t.jsonl"
    lines = reference.read_bytes().splitlines(keepends=True)
    limit = len(b"".join(lines[:2])) + len(lines[2]) // 2  # room for the first batch and half a line more
    full = run_child(_ROLLOUTS.format(path=str(path)), fsize=limit)
    assert full.returncode == 1 and "DiskFullError" in full.stderr and f"no space left while writing {path}" in full.stderr
    assert path.read_bytes() == b"".join(lines[:2])  # the failed append was cut back: whole lines only
    succeeded(run_child(_ROLLOUTS.format(path=str(path))))
    assert _answers(path) == _answers(reference)


_HOLD_WRITER = """
    import sys, time
    from agent.trajectory import TrajectoryWriter
    with TrajectoryWriter({path!r}):
        print("holding", flush=True)
        time.sleep(120)
"""


def _holder(code: str) -> subprocess.Popen:
    """A child that opens a writer and holds it until killed; returned once it holds it."""
    process = subprocess.Popen([sys.executable, "-c", __import__("textwrap").dedent(code)], cwd=ROOT,
                               env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.strip() == "holding", process.stderr.read() if process.poll() is not None else line
    return process


def test_a_second_rollout_writer_is_refused_with_the_holders_pid_and_a_dead_holders_lock_is_taken_over(tmp_path):
    path = tmp_path / "t.jsonl"
    holder = _holder(_HOLD_WRITER.format(path=str(path)))
    try:
        second = run_child(_ROLLOUTS.format(path=str(path)))
        assert second.returncode == 1 and "WriterLockedError" in second.stderr
        assert f"the trajectory file {path} is being written by another process (pid {holder.pid} on" in second.stderr
        assert not path.exists() or path.read_bytes() == b""  # nothing written beside the holder
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    succeeded(run_child(_ROLLOUTS.format(path=str(path))))  # the holder is gone: its lock is taken over
    assert _trajectory_ids(path) == ["q0", "q1", "q2", "q3", "q4", "q5"]


# ------------------------------------------------------------------------------------------------ mining stores

_STORE = """
    from agentic_retriever.mining.store import StageStore
    with StageStore({path!r}) as store:
        for start in range(0, 12, 4):
            todo = [f"k{{i}}" for i in range(start, start + 4) if f"k{{i}}" not in store]
            store.put({{key: {{"value": key * 40}} for key in todo}})
"""


def test_a_mining_store_killed_mid_append_resumes_with_every_record_once(tmp_path):
    path = tmp_path / "stage.jsonl"
    assert killed(run_child(_STORE.format(path=str(path)), kill_at="os:write", nth=2, when="part",
                            file="stage.jsonl"))
    assert not path.read_bytes().endswith(b"\n")
    succeeded(run_child(_STORE.format(path=str(path))))
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()]
    assert keys == [f"k{i}" for i in range(12)]


# ------------------------------------------------------------------------------------------------ embeddings memmap

_QUERIES = ["river castle", "comet near the glacier", "item 42", "holds item 7 of kind reef"]


def _build_code(model: str, corpus: Path, out: Path, embeddings: Path) -> str:
    return f"""
        import json
        from agentic_retriever.base.encoder import EncoderConfig
        from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index, open_index
        build_index(IndexBuildConfig(corpus={str(corpus)!r}, out={str(out)!r},
                                     dense=DenseParams(chunk_size=64, embeddings_dir={str(embeddings)!r}),
                                     encoder=EncoderConfig(model={model!r}, precision="fp32")))
        result = open_index({str(out)!r}).search({_QUERIES!r}, 8)
        print(json.dumps({{"ids": result.ids, "scores": [list(map(float, row)) for row in result.scores]}}))
    """


def _answers_of(process) -> dict:
    return json.loads(process.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def built_uninterrupted(tmp_path_factory, tiny_model_dir) -> dict:
    folder = tmp_path_factory.mktemp("index")
    corpus = write_jsonl(folder / "corpus.jsonl", synthetic_rows(300))
    return _answers_of(succeeded(run_child(_build_code(tiny_model_dir, corpus, folder / "idx", folder / "emb"))))


def _assert_same_index(got: dict, expected: dict) -> None:
    assert got["ids"] == expected["ids"]
    np.testing.assert_allclose(got["scores"], expected["scores"], atol=1e-6)


@pytest.mark.slow
def test_an_index_build_killed_while_encoding_resumes_at_its_last_chunk(tmp_path, tiny_model_dir,
                                                                         built_uninterrupted):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(300))
    code = _build_code(tiny_model_dir, corpus, tmp_path / "idx", tmp_path / "emb")
    assert killed(run_child(code, kill_at="agentic_retriever.base.encoder:Encoder.encode_passages", nth=3))
    state = next((tmp_path / "emb").glob("*.state.json"))
    assert json.loads(state.read_text())["rows_done"] == 128  # two chunks of 64 were final
    _assert_same_index(_answers_of(succeeded(run_child(code))), built_uninterrupted)


def test_a_second_index_build_on_the_same_embeddings_is_refused(tmp_path, tiny_model_dir):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(300))
    hold = f"""
        import time
        import agentic_retriever.index.dense as dense
        def held(*args, **kwargs):
            print("holding", flush=True)
            time.sleep(120)
        dense._encode_resumable = held
        {_build_code(tiny_model_dir, corpus, tmp_path / "idx", tmp_path / "emb").strip()}
    """
    holder = _holder(hold)
    try:
        second = run_child(_build_code(tiny_model_dir, corpus, tmp_path / "idx2", tmp_path / "emb"))
        assert second.returncode == 1 and "WriterLockedError" in second.stderr
        assert f"(pid {holder.pid} on" in second.stderr and "the passage embeddings" in second.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.mark.slow
def test_a_disk_that_fills_while_encoding_is_an_error_naming_the_file_not_a_sigbus(tmp_path, tiny_model_dir,
                                                                                    built_uninterrupted):
    """A 16 KiB tmpfs for the 38 KB embeddings file: the blocks are reserved before the memmap is written, so the
    build stops with DiskFullError naming the file (unreserved, the first write to a missing page was a SIGBUS,
    exit 135 with no message); with the disk back, the same build finishes."""
    small = tmp_path / "small-disk"
    if not small_disk_available(tmp_path / "probe"):
        pytest.skip("this machine does not let a process mount a tmpfs in a namespace of its own (unshare)")
    small.mkdir()
    corpus = write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(300))
    code = _build_code(tiny_model_dir, corpus, tmp_path / "idx", small)
    full = run_child(code, tmpfs=(small, 16384))
    assert full.returncode == 1, (full.returncode, full.stderr[-2000:])
    assert "DiskFullError" in full.stderr and f"no space left while writing {small}/embeddings-" in full.stderr
    _assert_same_index(_answers_of(succeeded(run_child(code))), built_uninterrupted)


# ------------------------------------------------------------------------------------ index generation and manifest

def _bm25_code(corpus: Path, out: Path) -> str:
    return f"""
        import json
        from agentic_retriever.index import IndexBuildConfig, build_index, open_index
        build_index(IndexBuildConfig(corpus={str(corpus)!r}, out={str(out)!r}, backend="bm25"))
        print(json.dumps(open_index({str(out)!r}).search({_QUERIES!r}, 5).ids))
    """


def _searched_ids(index: Path) -> list:
    return _answers_of(succeeded(run_child(f"""
        import json
        from agentic_retriever.index import open_index
        print(json.dumps(open_index({str(index)!r}).search({_QUERIES!r}, 5).ids))
    """)))


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_rebuild_killed_at_its_manifest_leaves_one_whole_index_and_the_rerun_gives_the_new_one(tmp_path, when):
    """An index rebuilt on a new corpus, SIGKILLed just before its manifest is written (the new generation's files
    are there, the old manifest names the old one) or just after (the new manifest is in, the old generation not yet
    removed): the folder opens as one whole index, the old or the new, and the same command again gives exactly
    the index an uninterrupted build gives, with one generation folder left."""
    old_corpus = write_jsonl(tmp_path / "old.jsonl", synthetic_rows(200))
    new_corpus = write_jsonl(tmp_path / "new.jsonl", synthetic_rows(300)[100:])
    index = tmp_path / "idx"
    old = _answers_of(succeeded(run_child(_bm25_code(old_corpus, index))))
    new = _answers_of(succeeded(run_child(_bm25_code(new_corpus, tmp_path / "reference"))))
    assert old != new
    assert killed(run_child(_bm25_code(new_corpus, index),
                            kill_at="agentic_retriever.index.manifest:IndexManifest.save", when=when))
    assert _searched_ids(index) == (old if when == "before" else new)
    assert _answers_of(succeeded(run_child(_bm25_code(new_corpus, index)))) == new
    assert len([p for p in index.iterdir() if p.is_dir() and p.name.startswith("data-")]) == 1


# ------------------------------------------------------------------------------------------------------- loop.json

_LOOP = """
    import json
    from pathlib import Path
    from agentic_retriever.app.loop import LoopConfig, LoopJob
    from agentic_retriever.app.loop.runner import _Loop

    state = _Loop(LoopJob(loop=LoopConfig(out={out!r}), agent_train=None, rollout=None, mine=None, train=None,
                          index=None))

    def step(name):
        def run(folder):
            folder.mkdir(parents=True, exist_ok=True)  # the step's artifact
            with open({out!r} + "/runs.log", "a") as log:
                log.write(name + "\\n")
            return {{"made": name}}
        return run

    for i, name in enumerate(["agent", "trajectories", "mining", "retriever"]):
        state.step(1, name, {{"n": i}}, step(name))
    print(json.dumps({{name: [record.status, record.summary] for name, record in state.manifest.steps.items()}}))
"""


@pytest.fixture(scope="module")
def loop_reference(tmp_path_factory) -> dict:
    return _answers_of(succeeded(run_child(_LOOP.format(out=str(tmp_path_factory.mktemp("loop") / "reference")))))


@pytest.mark.parametrize("kill", [dict(kill_at="os:fsync", nth=3, when="before"),
                                  dict(kill_at="os:replace", nth=4, when="before"),
                                  dict(kill_at="os:replace", nth=5, when="after")])
def test_a_loop_killed_while_writing_its_record_continues_with_every_step_done_once(tmp_path, kill, loop_reference):
    """``loop.json`` is rewritten at every step's start and end: a SIGKILL while its temp file is being made whole
    (before the fsync), before its rename or after it leaves a record the next run reads, and that run does what
    is left: the same record as an uninterrupted run's, and no finished step run twice."""
    reference = loop_reference
    out = tmp_path / "loop"
    assert killed(run_child(_LOOP.format(out=str(out)), **kill))
    before = (out / "runs.log").read_text().split() if (out / "runs.log").exists() else []
    assert _answers_of(succeeded(run_child(_LOOP.format(out=str(out))))) == reference
    runs = (out / "runs.log").read_text().split()
    assert sorted(f"1/{name}" for name in set(runs)) == sorted(reference)
    assert len(runs) - len(set(runs)) <= 1  # the step the kill interrupted may run again, no other
    assert runs[:len(before)] == before
