"""The loop's processes on named devices (agentic_retriever.app.loop.processes): shards with the CUDA_VISIBLE_DEVICES
their entry names, the step servers of ``loop.step_servers`` up exactly while their steps run, and the rollout and
mining steps split over processes giving what one process gives."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from agent.trajectory import read_trajectories
from agentic_retriever.app.config_loader import build_config
from agentic_retriever.app.loop import STEPS, LoopConfig, LoopJob, LoopServiceConfig
from agentic_retriever.app.loop import steps as loop_steps
from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.index import build_index
from agentic_retriever.app.loop.processes import (StepServers, concatenate, device_env, run_on_devices,
                                                  step_server_specs,
                                              write_section)
from agentic_retriever.app.loop.runner import _Loop
from agentic_retriever.app.loop.service import LoopService
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.mining.config import MiningConfig
from agentic_retriever.mining.selection import SelectionConfig
from tests.fakes import answer_turn, free_port, make_trajectory, search_turn, write_jsonl
from tests.app.loop.test_loop import make_job, workdir  # noqa: F401  (the fixture)

PRINT_DEVICES = "import os, sys; open(sys.argv[1], 'w').write(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"


def test_each_process_sees_the_devices_its_entry_names_and_a_failure_names_its_log(tmp_path):
    outs = [tmp_path / f"seen-{i}" for i in range(3)]
    run_on_devices([[sys.executable, "-c", PRINT_DEVICES, str(out)] for out in outs], ["cpu", "3", "4,5"],
                   tmp_path / "logs", "probe")
    assert [out.read_text() for out in outs] == ["''", "'3'", "'4,5'"]

    fail = [sys.executable, "-c", "import sys; print('shard broke here'); sys.exit(3)"]
    ok = [sys.executable, "-c", PRINT_DEVICES, str(tmp_path / "late")]
    with pytest.raises(RuntimeError, match=r"1 of 2 probe processes failed") as error:
        run_on_devices([fail, ok], ["cpu", "cpu"], tmp_path / "logs", "probe", numbers=[7, 8])
    assert "probe 7 exited with status 3" in str(error.value) and "shard broke here" in str(error.value)
    assert str(tmp_path / "logs" / "probe-7.log") in str(error.value)
    assert (tmp_path / "late").read_text() == "''"  # the other shard ran to its end


PRINT_THREADS = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get('OMP_NUM_THREADS', 'unset'))"


def test_processes_run_at_once_share_the_cores_and_a_users_thread_count_stands(tmp_path, monkeypatch):
    """n shards on c cores get c // n threads each (at least 1), not c each; OMP_NUM_THREADS set by the user wins."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    for n in (1, 2, 3):
        outs = [tmp_path / f"threads-{n}-{i}" for i in range(n)]
        run_on_devices([[sys.executable, "-c", PRINT_THREADS, str(out)] for out in outs], ["cpu"] * n,
                       tmp_path / "logs", f"threads{n}")
        assert [out.read_text() for out in outs] == [str(max(1, cores // n))] * n
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    run_on_devices([[sys.executable, "-c", PRINT_THREADS, str(tmp_path / "mine")]], ["0"], tmp_path / "logs", "own")
    assert (tmp_path / "mine").read_text() == "7"


def test_device_entries_are_checked_where_they_are_set():
    assert device_env("cpu")["CUDA_VISIBLE_DEVICES"] == "" and device_env("0,1")["CUDA_VISIBLE_DEVICES"] == "0,1"
    with pytest.raises(ValueError, match="loop.mining_devices: device 'gpu0' is neither"):
        LoopConfig(mining_devices=["0", "gpu0"])
    with pytest.raises(ValueError, match=r"loop.step_servers.scorer.steps: a list of the steps"):
        LoopConfig(step_servers={"scorer": {"command": "x", "health_url": "http://h/health", "steps": ["mine"]}})
    with pytest.raises(ValueError, match=r"loop.step_servers.scorer: unknown field\(s\) port"):
        LoopConfig(step_servers={"scorer": {"command": "x", "health_url": "u", "steps": ["mining"], "port": 1}})
    with pytest.raises(ValueError, match=r"loop.step_servers.scorer.command: required"):
        LoopConfig(step_servers={"scorer": {"health_url": "u", "steps": ["mining"]}})


def test_the_previous_releases_loop_services_key_is_read_as_step_servers_with_a_warning(tmp_path):
    """0.1 called the step servers ``loop.services``; "service" now means the retrieval service alone."""
    scorer = {"command": "serve", "health_url": "http://h/health", "steps": ["mining"]}
    path = tmp_path / "loop.yaml"
    path.write_text(json.dumps({"loop": {"services": {"scorer": scorer}}}))
    with pytest.warns(FutureWarning, match=r"loop.yaml: loop: .services. is deprecated, write .step_servers."):
        loop = build_config(LoopConfig, "loop", None, str(path))
    assert loop.step_servers == {"scorer": scorer}


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_step_server_runs_exactly_while_the_steps_that_name_it_run(tmp_path):
    port = free_port()
    health = f"http://127.0.0.1:{port}/"
    specs = step_server_specs({"scorer": {"command": f"{{python}} -m http.server {port} --bind 127.0.0.1",
                                          "health_url": health, "steps": ["trajectories", "mining"], "devices": "cpu"}},
                              STEPS)
    with StepServers(specs, tmp_path / "services") as servers:
        servers.before("agent")
        assert not _up(health) and not servers.running
        servers.before("trajectories")
        assert _up(health)
        process = servers.running["scorer"]
        servers.before("mining")  # still needed: the same process
        assert servers.running["scorer"] is process and _up(health)
        servers.before("retriever")
        assert not servers.running and process.poll() is not None and not _up(health)
        servers.before("mining")
        assert _up(health)
    assert not servers.running and not _up(health)  # leaving the loop stops it
    assert (tmp_path / "services" / "scorer.log").is_file()


def test_a_server_that_dies_or_never_answers_is_an_error_naming_its_log(tmp_path):
    dies = step_server_specs({"s": {"command": f"{sys.executable} -c \"print('no model here'); raise SystemExit(2)\"",
                                    "health_url": f"http://127.0.0.1:{free_port()}/", "steps": ["mining"]}}, STEPS)
    with StepServers(dies, tmp_path) as servers, pytest.raises(RuntimeError, match="exited with status 2") as error:
        servers.before("mining")
    assert "no model here" in str(error.value) and not servers.running

    mute = step_server_specs({"s": {"command": f"{sys.executable} -c \"import time; time.sleep(60)\"",
                                    "health_url": f"http://127.0.0.1:{free_port()}/", "steps": ["mining"],
                                    "start_timeout_s": 2}}, STEPS)
    with StepServers(mute, tmp_path) as servers, pytest.raises(TimeoutError, match="did not answer 200 within 2 s"):
        servers.before("mining")
    assert not servers.running


def _kill_server(server) -> None:
    """SIGKILL the server's own process (as the kernel's OOM killer would), not the guard that started it."""
    guard = server.process.pid
    children = Path(f"/proc/{guard}/task/{guard}/children").read_text().split()
    os.kill(int(children[0]), signal.SIGKILL)
    server.process.wait(30)  # the guard ends with its command's signal


def test_a_step_server_killed_mid_step_is_restarted_and_the_step_run_again_within_its_bound(tmp_path):
    """A real SIGKILL of the server under a running step: the loop starts the server again and runs the step again
    (it continues from what it stored); past ``max_restarts`` the error names the server, its log and the log's
    last lines."""
    port = free_port()
    health = f"http://127.0.0.1:{port}/"
    specs = step_server_specs({"scorer": {"command": f"{sys.executable} -m http.server {port} --bind 127.0.0.1",
                                          "health_url": health, "steps": ["mining"], "max_restarts": 1}}, STEPS)
    state = _Loop(LoopJob(loop=LoopConfig(out=str(tmp_path / "loop")), agent_train=None, rollout=None, mine=None,
                          train=None, index=None))
    started = []

    def mine(kills: int):
        def run(folder: Path) -> dict:
            started.append(servers.running["scorer"])
            if len(started) <= kills:
                _kill_server(started[-1])
            return {"status": httpx.get(health, timeout=5.0).status_code}  # refused while the server is dead
        return run

    with StepServers(specs, tmp_path / "services") as servers:
        state.step_servers = servers
        record = state.step(1, "mining", {"try": 1}, mine(kills=1))
        assert record.summary == {"status": 200} and record.attempts == 1
        assert len(started) == 2 and started[0] is not started[1] and servers.restarts == {"scorer": 1}
        with pytest.raises(RuntimeError, match=r"step server scorer died with status -9 during mining \(.*scorer.log\)"
                                               r"[\s\S]*GET / HTTP[\s\S]*max_restarts") as error:
            state.step(1, "mining", {"try": 2}, mine(kills=3))
        assert isinstance(error.value.__context__, httpx.ConnectError)  # what the step itself met
    assert state.manifest.get(1, "mining").status == "running"  # the loop's next run continues it


def test_a_written_section_reads_back_as_the_same_settings(tmp_path):
    from agentic_retriever.mining.job import MineJobConfig

    config = MineJobConfig(trajectories="t.jsonl", out="o", agent=LLMConfig(model="m", precision="bf16"),
                           retrieval=RetrievalConfig(url="http://h:1"),
                           mining=MiningConfig(num_candidates=7, selection=SelectionConfig(num_negatives=2)))
    path = write_section(tmp_path / "mine_run.yaml", "mine_run", config)
    assert build_config(MineJobConfig, "mine_run", None, str(path)) == config


def test_concatenate_joins_in_order_and_writes_whole(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"i": 0}, {"i": 1}])
    (tmp_path / "b.jsonl").write_text('{"i": 2}')  # no final newline
    assert concatenate([a, tmp_path / "b.jsonl"], tmp_path / "out.jsonl") == 3
    assert [json.loads(line)["i"] for line in (tmp_path / "out.jsonl").read_text().splitlines()] == [0, 1, 2]
    with pytest.raises(FileNotFoundError):
        concatenate([a, tmp_path / "missing.jsonl"], tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_text().count("\n") == 3  # the earlier file stands


@pytest.mark.slow
def test_rollouts_and_mining_split_over_two_processes_give_one_processs_results(workdir, tiny_model_dir,
                                                                                 tiny_causal_lm_dir):
    """Step 2 as two `agent rollout --shard` processes (the tiny Llama, greedy) joins into every question once, in
    order; step 3 as two `mine run --shard` processes (LR from the retriever, no LLM) merges into exactly the rows
    one process mines."""
    job = make_job(tiny_model_dir, tiny_causal_lm_dir, rollout_devices=["cpu", "cpu"])
    job = dataclasses.replace(job, rollout=dataclasses.replace(
        job.rollout, env=dataclasses.replace(job.rollout.env, temperature=0.0, max_new_tokens_per_turn=6)))
    build_index(dataclasses.replace(job.index, out="index/base"))
    with LoopService(LoopServiceConfig(), "index/base") as service:
        retrieval = RetrievalConfig(url=service.url)
        summary = loop_steps.roll_out(job, tiny_causal_lm_dir, retrieval, workdir / "rollouts")
        ids = [t.question_id for t in read_trajectories(summary["trajectories"])]
        assert ids == [f"q{j}" for j in range(4, 10)] and summary == {
            "trajectories": str(workdir / "rollouts" / "trajectories.jsonl"), "questions": 6, "processes": 2}
        assert sorted(p.name for p in (workdir / "rollouts" / "logs").iterdir()) == ["rollout-0.log", "rollout-1.log"]

        write_jsonl(workdir / "trajectories.jsonl", [_searched(j) for j in range(4, 10)])
        mine = dataclasses.replace(job.mine, scorer=LLMConfig(), mining=dataclasses.replace(
            job.mine.mining, lr_scorer="retriever", use_sub_answers=False,
            selection=SelectionConfig(use_gac=False, lr_threshold=0, num_negatives=3, negatives="release",
                                      false_negative_filter=False)))
        one = loop_steps.mine_rows(dataclasses.replace(job, mine=mine), "trajectories.jsonl", "unused", retrieval,
                                   workdir / "one")
        sharded_job = dataclasses.replace(job, mine=mine, loop=dataclasses.replace(job.loop, mining_devices=["cpu"] * 2))
        two = loop_steps.mine_rows(sharded_job, "trajectories.jsonl", "unused", retrieval, workdir / "two")
    rows = [Path(s["rows_path"]).read_text().splitlines() for s in (one, two)]
    assert rows[0] and rows[0] == rows[1] and one["rounds"] == two["rounds"]
    assert (workdir / "two" / "mine_run.yaml").is_file() and (workdir / "two" / "shards" / "1-of-2").is_dir()


def _searched(j: int) -> dict:
    """A trajectory that searched once for city `j` and answered."""
    hit = ScoredPassage(id=str(j), title=f"City {j}", text=f"About city {j}.", score=1.0)
    turns = [search_turn(f"city {j}", [hit]), answer_turn(f"city {j}")]
    return make_trajectory(f"q{j}", f"Which city is number {j}?", [f"city {j}"], turns, f"city {j}").to_json()


def test_ray_placement_without_ray_names_the_extra(monkeypatch):
    """``loop.placement: ray`` imports Ray only then; without it, the error says which extra brings it."""
    import importlib

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "agentic_retriever.app.loop.ray_placement", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'agentic-retriever\[ray\]'"):
        importlib.import_module("agentic_retriever.app.loop.ray_placement")


def test_a_step_server_with_api_key_env_shares_a_fresh_key_with_the_loops_processes(tmp_path, monkeypatch):
    """The paper config's scorer: the loop puts a random key in the variable (vLLM's server reads VLLM_API_KEY),
    the server sees it, the loop's own processes inherit it and Ray's are handed it; a key the user set stands."""
    from agentic_retriever.app.loop.processes import FORWARDED

    monkeypatch.delenv("TEST_SCORER_KEY", raising=False)
    monkeypatch.setattr("agentic_retriever.app.loop.processes.FORWARDED", set(FORWARDED))
    port, seen = free_port(), tmp_path / "seen"
    serve = (f"import os, sys, http.server; open({str(seen)!r}, 'w').write(os.environ['TEST_SCORER_KEY']); "
             f"http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')")
    specs = step_server_specs({"scorer": {"command": f"{sys.executable} -c \"{serve}\"",
                                          "api_key_env": "TEST_SCORER_KEY", "health_url": f"http://127.0.0.1:{port}/",
                                          "steps": ["mining"]}}, STEPS)
    with StepServers(specs, tmp_path / "services") as servers:
        servers.before("mining")
        key = os.environ["TEST_SCORER_KEY"]
        assert len(key) >= 40 and seen.read_text() == key
        from agentic_retriever.app.loop import processes

        assert "TEST_SCORER_KEY" in processes.FORWARDED
    assert "TEST_SCORER_KEY" not in os.environ  # the key the loop made goes with its server
    monkeypatch.setenv("TEST_SCORER_KEY", "chosen-by-the-user")
    with StepServers(specs, tmp_path / "services") as servers:
        servers.before("mining")
        assert seen.read_text() == "chosen-by-the-user"
    with pytest.raises(ValueError, match=r"loop.step_servers.scorer.api_key_env: the name of an environment variable"):
        step_server_specs({"scorer": {"command": "x", "health_url": "http://h/", "steps": ["mining"],
                                      "api_key_env": "not a name"}}, STEPS)
