"""``loop.placement: ray`` on a real multi-node Ray cluster made on this machine (`ray.cluster_utils.Cluster`: a head
declaring 2 GPUs and a second node declaring 4, as resources; no GPU is touched): shards land on both nodes and see
only the GPU ids Ray gave them, a server asking for 4 GPUs lands on the node that has them and waits while none
does, a killed shard fails the step naming its log, nothing is left after an interrupt, and the loop's rollouts and
mining placed by Ray give exactly the rows of the local placement."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (the dev extra has it)")

from agentic_retriever.app.loop import steps as loop_steps  # noqa: E402
from agentic_retriever.base.client import RetrievalConfig  # noqa: E402
from agentic_retriever.base.sessions import signal_handlers_kept  # noqa: E402
from agentic_retriever.app.loop.config import LoopConfig, LoopRayConfig, LoopServiceConfig  # noqa: E402
from agentic_retriever.app.loop.placement import shard_count  # noqa: E402
from agentic_retriever.app.loop.processes import (  # noqa: E402
    LoopSignal, StepServerSpec, StepServers, signals_stop_children,
)
from agentic_retriever.app.loop.ray_placement import RayServer, reachable_url, run_on_ray  # noqa: E402
from agentic_retriever.app.loop.service import LoopService  # noqa: E402
from tests.fakes import free_port, ray_temp_dir  # noqa: E402
from tests.app.loop.test_loop import make_job, workdir  # noqa: E402,F401  (the fixture)

HEAD_GPUS, SECOND_GPUS = 2, 4

#: A shard: writes where it runs (the GPU ids it sees) into its own file, then waits a moment so that the shards
#: of one call overlap (each holds its GPU while the others are placed).
SHARD = ("import os, sys, time, json; time.sleep(float(sys.argv[2])); "
         "open(sys.argv[1], 'w').write(json.dumps({'gpus': os.environ['CUDA_VISIBLE_DEVICES']}))")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two Ray nodes on this machine: the head with 2 GPUs, a second node with 4 (declared resources)."""
    from ray.cluster_utils import Cluster

    with ray_temp_dir(tmp_path_factory) as temp, pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")  # no token written to ~/.ray
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 4, "num_gpus": HEAD_GPUS, "object_store_memory": 80 * 2**20, "temp_dir": temp,
            "include_dashboard": False})  # its metrics agent writes into temp after the shutdown
        cluster.add_node(num_cpus=4, num_gpus=SECOND_GPUS, object_store_memory=80 * 2**20)
        with signal_handlers_kept():  # ray.init's driver SIGTERM handler would outlive the test
            ray.init(address=cluster.address, log_to_driver=False)
        try:
            yield {n["NodeID"]: int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["Alive"]}
        finally:
            ray.shutdown()
            cluster.shutdown()


def _wait_all_gpus_free(timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("GPU", 0) < HEAD_GPUS + SECOND_GPUS:
        assert time.monotonic() < deadline, f"GPUs still held: {ray.available_resources()}"
        time.sleep(0.2)


def test_shards_spread_over_both_nodes_each_seeing_only_its_own_gpu(cluster, tmp_path):
    _wait_all_gpus_free()
    n = HEAD_GPUS + SECOND_GPUS
    commands = [[sys.executable, "-c", SHARD, str(tmp_path / f"seen-{k}.json"), "3"] for k in range(n)]
    places = run_on_ray(commands, 1.0, 0.5, tmp_path / "logs", "rollout")
    seen = [json.loads((tmp_path / f"seen-{k}.json").read_text())["gpus"] for k in range(n)]
    assert [p["gpus"] for p in places] == seen  # the process sees exactly the ids Ray gave its actor
    by_node = {node: sorted(p["gpus"] for p in places if p["node"] == node) for node in cluster}
    assert by_node == {node: [str(g) for g in range(gpus)] for node, gpus in cluster.items()}  # every GPU once
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [f"rollout-{k}.log" for k in range(n)]


def test_more_shards_than_free_gpus_start_as_earlier_ones_finish(cluster, tmp_path):
    _wait_all_gpus_free()
    n = HEAD_GPUS + SECOND_GPUS + 2
    commands = [[sys.executable, "-c", SHARD, str(tmp_path / f"seen-{k}.json"), "1"] for k in range(n)]
    places = run_on_ray(commands, 1.0, 0.25, tmp_path / "logs", "mining")
    assert len(places) == n and all((tmp_path / f"seen-{k}.json").is_file() for k in range(n))


def test_the_shard_count_comes_from_the_clusters_free_gpus_and_is_kept_for_a_rerun(cluster, tmp_path):
    _wait_all_gpus_free()
    loop = LoopConfig(placement="ray", ray=LoopRayConfig(gpus_per_shard=2))
    assert shard_count(loop, "mining", tmp_path) == (HEAD_GPUS + SECOND_GPUS) // 2
    recorded = json.loads((tmp_path / "mining.shards.json").read_text())
    assert recorded == {"shards": 3, "gpus_per_shard": 2}
    wider = LoopConfig(placement="ray", ray=LoopRayConfig(gpus_per_shard=1))
    assert shard_count(wider, "mining", tmp_path) == 3  # the step's shards as first cut, whatever is free now
    assert shard_count(LoopConfig(placement="ray", ray=LoopRayConfig(rollout_shards=5)), "rollout", tmp_path) == 5
    with pytest.raises(ValueError, match="loop.rollout_devices and loop.mining_devices stay empty"):
        LoopConfig(placement="ray", mining_devices=["0"])


def test_a_killed_shard_fails_the_step_naming_its_log(cluster, tmp_path):
    _wait_all_gpus_free()
    killed = "import os, signal; print('shard 1 starts', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    commands = [[sys.executable, "-c", SHARD, str(tmp_path / "seen-0.json"), "0"], [sys.executable, "-c", killed]]
    with pytest.raises(RuntimeError) as error:
        run_on_ray(commands, 1.0, 0.5, tmp_path / "logs", "mining")
    message = str(error.value)
    assert "1 of 2 mining processes failed" in message and "mining 1 exited with status -9" in message
    assert str(tmp_path / "logs" / "mining-1.log") in message and "shard 1 starts" in message
    assert (tmp_path / "seen-0.json").is_file()


def _alive_with(marker: str) -> list[int]:
    """Processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_text(errors="replace"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_an_interrupted_step_leaves_nothing_of_its_shards_running(cluster, tmp_path):
    _wait_all_gpus_free()
    marker = f"ray-interrupt-{os.getpid()}"
    tree = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
            f"'{marker}-worker']); time.sleep(600)")
    commands = [[sys.executable, "-c", tree, f"{marker}-shard"] for _ in range(3)]
    threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(LoopSignal), signals_stop_children():
        run_on_ray(commands, 1.0, 0.5, tmp_path / "logs", "rollout")
    assert _alive_with(marker) == []
    _wait_all_gpus_free()  # every actor gone: the GPUs are back


def test_a_server_asking_for_4_gpus_waits_for_a_node_that_has_them(cluster, tmp_path):
    """The scorer of the paper config (devices 4,5,6,7: 4 GPUs): refused by a timeout naming the wait while one of
    the second node's GPUs is held, then placed there once it is free, its loopback URLs pointing at that node."""
    _wait_all_gpus_free()
    port = free_port()
    command = f"{sys.executable} -m http.server {port} --bind 0.0.0.0 --directory {tmp_path}"
    spec = StepServerSpec(name="lr_scorer", command=command, health_url=f"http://localhost:{port}/",
                          steps=("mining",), devices="4,5,6,7", start_timeout_s=6)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    # 3 GPUs held one by one: wherever Ray puts them, no node keeps 4 free (2 + 4 in all)
    holders = [RayServer.start(sleeper, tmp_path / f"holder-{k}.log", 1.0, 0.0, 30, "holder") for k in range(3)]
    try:
        with StepServers([spec], tmp_path / "services", LoopRayConfig()) as servers:
            with pytest.raises(TimeoutError, match="no node of the Ray cluster had 4 free GPUs"):
                servers.before("mining")
    finally:
        for holder in holders:
            holder.stop()
    _wait_all_gpus_free()
    spec = dataclasses.replace(spec, start_timeout_s=60)
    with StepServers([spec], tmp_path / "services", LoopRayConfig()) as servers:
        servers.before("mining")
        server = servers.running["lr_scorer"]
        placed_on = server.place
        assert placed_on["node"] == _node_with(cluster, SECOND_GPUS)
        assert sorted(placed_on["gpus"].split(",")) == ["0", "1", "2", "3"]
        assert servers.reachable(f"http://localhost:{port}/v1") == f"http://{server.address}:{port}/v1"
        assert servers.reachable("http://localhost:1/v1") == "http://localhost:1/v1"  # not a server's port
    _wait_all_gpus_free()


def _node_with(cluster: dict[str, int], gpus: int) -> str:
    (node,) = [n for n, count in cluster.items() if count == gpus]
    return node


def test_reachable_url_replaces_only_a_loopback_host():
    assert reachable_url("http://localhost:8001/v1", "10.0.0.7") == "http://10.0.0.7:8001/v1"
    assert reachable_url("http://0.0.0.0:8001/health", "10.0.0.7") == "http://10.0.0.7:8001/health"
    assert reachable_url("http://scorer.internal:8001/v1", "10.0.0.7") == "http://scorer.internal:8001/v1"


def test_the_loops_service_under_ray_binds_where_other_nodes_reach_it(cluster, workdir, tiny_model_dir,
                                                                      tiny_causal_lm_dir):
    from agentic_retriever.index import build_index

    job = make_job(tiny_model_dir, tiny_causal_lm_dir)
    build_index(dataclasses.replace(job.index, out="index/base"))
    with pytest.raises(ValueError, match="cannot reach the loop's service at loop.service.host 127.0.0.1"):
        with LoopService(LoopServiceConfig(), "index/base", for_cluster=True):
            pass
    with LoopService(LoopServiceConfig(host="0.0.0.0"), "index/base", for_cluster=True) as service:
        assert service.url == f"http://{ray.util.get_node_ip_address()}:{service._thread.port}"
        assert Path(service.serving()).resolve() == (workdir / "index" / "base").resolve()


@pytest.mark.slow
def test_rollouts_and_mining_placed_by_ray_give_the_rows_of_one_process(cluster, workdir, tiny_model_dir,
                                                                         tiny_causal_lm_dir):
    """Steps 2 and 3 as two Ray-placed shards each (CPU work on GPU-labelled actors) against the same steps in the
    loop's process: the same trajectories in question order, exactly the same mined rows."""
    from agent.trajectory import read_trajectories
    from agentic_retriever.base.llm import LLMConfig
    from agentic_retriever.index import build_index
    from agentic_retriever.mining.selection import SelectionConfig

    _wait_all_gpus_free()
    job = make_job(tiny_model_dir, tiny_causal_lm_dir)
    job = dataclasses.replace(job, rollout=dataclasses.replace(
        job.rollout, env=dataclasses.replace(job.rollout.env, temperature=0.0, max_new_tokens_per_turn=6)),
        mine=dataclasses.replace(job.mine, scorer=LLMConfig(), mining=dataclasses.replace(
            job.mine.mining, lr_scorer="retriever", use_sub_answers=False,
            selection=SelectionConfig(use_gac=False, lr_threshold=0, num_negatives=3, negatives="release",
                                      false_negative_filter=False))))
    placed = dataclasses.replace(job, loop=dataclasses.replace(job.loop, placement="ray", ray=LoopRayConfig(
        rollout_shards=2, mining_shards=2, cpus_per_process=0.5)))
    build_index(dataclasses.replace(job.index, out="index/base"))
    from tests.app.loop.test_loop_processes import _searched
    from tests.fakes import write_jsonl

    write_jsonl(workdir / "trajectories.jsonl", [_searched(j) for j in range(4, 10)])
    with LoopService(LoopServiceConfig(host="0.0.0.0"), "index/base", for_cluster=True) as service:
        retrieval = RetrievalConfig(url=service.url)
        rolled = loop_steps.roll_out(placed, tiny_causal_lm_dir, retrieval, workdir / "rollouts")
        one = loop_steps.mine_rows(job, "trajectories.jsonl", "unused", retrieval, workdir / "one")
        two = loop_steps.mine_rows(placed, "trajectories.jsonl", "unused", retrieval, workdir / "two")
    ids = [t.question_id for t in read_trajectories(rolled["trajectories"])]
    assert ids == [f"q{j}" for j in range(4, 10)] and rolled["processes"] == 2
    rows = [Path(s["rows_path"]).read_text().splitlines() for s in (one, two)]
    assert rows[0] and rows[0] == rows[1] and one["rounds"] == two["rounds"]
    assert (workdir / "two" / "shards" / "1-of-2").is_dir() and (workdir / "two" / "mining.shards.json").is_file()


def test_a_process_stopped_before_its_start_never_runs(cluster, tmp_path):
    """The loop stops a step's actors while their starts may still be on the way (an interrupt right after the
    step began): a start that comes after the stop refuses, so no process is left behind the actor."""
    from agentic_retriever.app.loop.ray_placement import ProcessActor

    actor = ProcessActor.options(num_cpus=0).remote()
    assert ray.get(actor.stop.remote(1.0)) is None
    with pytest.raises(ray.exceptions.RayTaskError, match="stopped before it started"):
        ray.get(actor.start.remote([sys.executable, "-c", "import time; time.sleep(600)"], str(tmp_path / "late.log"),
                                   str(tmp_path)))
    assert not (tmp_path / "late.log").exists()
    ray.kill(actor)
