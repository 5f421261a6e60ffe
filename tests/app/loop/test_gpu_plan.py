"""Where the loop's processes run on the GPUs: the service's index placement (``loop.service.index_gpu``) as the
loop opens, swaps and evaluates indexes, and the paper config against the table of docs/loop.md, "The GPU plan"
(the table is read from the document, so a change to either that the other does not follow fails here)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import Path

import httpx
import pytest

from agentic_retriever.app.commands import command
from agentic_retriever.app.config_loader import build_config
from agentic_retriever.app.loop import STEPS
from agentic_retriever.app.loop import steps as loop_steps
from agentic_retriever.app.loop.config import LoopConfig, LoopServiceConfig
from agentic_retriever.app.loop.processes import step_server_specs
from agentic_retriever.app.loop.service import LoopService
from agentic_retriever.base.sessions import command_words
from agentic_retriever.index import DenseParams, build_index
from tests.app.loop.test_loop import make_job, workdir  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[3]
PAPER_CONFIG = ROOT / "configs" / "agentic_r_loop.yaml"


def _faiss_sees_gpus() -> bool:
    import faiss

    return getattr(faiss, "get_num_gpus", lambda: 0)() > 0


@pytest.fixture
def recorded_on_gpus(workdir, tiny_model_dir, tiny_causal_lm_dir) -> tuple:
    """The loop's job and two dense indexes whose builds recorded ``dense.gpu: on``."""
    job = make_job(tiny_model_dir, tiny_causal_lm_dir)
    for name in ("first", "second"):
        build_index(dataclasses.replace(job.index, out=f"index/{name}", dense=DenseParams(type="flat", gpu="on")))
    return job, "index/first", "index/second"


def _health(service: LoopService) -> dict:
    """The service's /health as the loop reads it (with its admin token: the index folder in full)."""
    return httpx.get(f"{service.url}/health", headers={"Authorization": f"Bearer {service.token}"}, timeout=30).json()


def test_index_gpu_off_keeps_the_services_index_in_host_memory_across_swaps(recorded_on_gpus, capsys):
    _, first, second = recorded_on_gpus
    with LoopService(LoopServiceConfig(index_gpu="off"), first) as service:
        started = _health(service)
        service.serve(second)
        swapped = _health(service)
    assert started["search_device"] == "cpu" and swapped["search_device"] == "cpu"
    assert swapped["index_dir"] == str(Path(second).resolve()) and swapped["generation"] == 1
    assert started["query_device"] == swapped["query_device"] is not None
    printed = capsys.readouterr().out
    assert "index searched on cpu, queries encoded on" in printed and "searched on cpu)" in printed


def test_index_gpu_on_without_gpus_for_faiss_stops_the_service_at_its_start_naming_the_extra(recorded_on_gpus):
    if _faiss_sees_gpus():
        pytest.skip("FAISS sees GPUs here: the index goes onto them")
    _, first, _ = recorded_on_gpus
    with pytest.raises(RuntimeError, match=r"agentic-retriever\[faiss-gpu\]"):
        with LoopService(LoopServiceConfig(index_gpu="on"), first):
            pass


def test_step_6_opens_the_evaluated_indexes_where_the_service_keeps_its_own(recorded_on_gpus):
    """The retrieval metrics of step 6 open each index in the loop's process with the service's placement: with
    ``off``, indexes whose builds said ``on`` are evaluated on the host (as built, FAISS without GPUs refuses)."""
    job, first, second = recorded_on_gpus
    host = dataclasses.replace(job, loop=dataclasses.replace(job.loop, service=LoopServiceConfig(index_gpu="off")))
    report = loop_steps.evaluate_iteration(dataclasses.replace(
        host, loop=dataclasses.replace(host.loop, eval=dataclasses.replace(host.loop.eval, agent_questions=0))),
        first, second, "unused", Path("eval"))
    assert report["retrieval"]["new"]["leaf_questions"] == 4
    if not _faiss_sees_gpus():
        as_built = dataclasses.replace(job, loop=dataclasses.replace(job.loop, eval=dataclasses.replace(
            job.loop.eval, agent_questions=0)))
        with pytest.raises(RuntimeError, match="gpu=on but FAISS sees no GPU"):
            loop_steps.evaluate_iteration(as_built, first, second, "unused", Path("eval-as-built"))


def test_a_bare_on_or_off_in_yaml_is_the_word_and_other_values_are_refused_by_name(tmp_path):
    """YAML 1.1 reads ``index_gpu: on`` as true: the config keeps the word; a value outside the choices is an
    error naming the field."""
    config = tmp_path / "loop.yaml"
    config.write_text("loop:\n  service:\n    index_gpu: off\n")
    assert build_config(LoopConfig, "loop", None, str(config)).service.index_gpu == "off"
    config.write_text("loop:\n  service:\n    index_gpu: gpus\n")
    with pytest.raises(ValueError, match=r"loop\.service\.index_gpu: 'gpus' is not one of auto, on, off"):
        build_config(LoopConfig, "loop", None, str(config))


# ------------------------------------------------------------------------------ the paper config against the doc


def _plan_table() -> dict[str, dict[str, str]]:
    """docs/loop.md's GPU plan, by step (the scorer's row, which has no step of its own, as ``scorer``)."""
    text = (ROOT / "docs" / "loop.md").read_text()
    section = text[text.index("## The GPU plan"):].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    header, *body = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert header == ["step", "processes", "GPUs", "per GPU"]
    return {(step or ("scorer" if "lr_scorer" in processes else "")): dict(zip(header, [step, processes, gpus, per]))
            for step, processes, gpus, per in body}


def _gpus(cell: str) -> set[int]:
    """``0-7``, ``4-7`` or ``0, 1, 2, 3`` as a set of GPU numbers."""
    numbers: set[int] = set()
    for part in cell.split(","):
        low, _, high = part.strip().partition("-")
        numbers |= set(range(int(low), int(high or low) + 1))
    return numbers


def _section(name: str, set_by_loop: tuple[str, ...] = ()):
    """A section of the paper config composed as `agentic-retriever loop --config` composes it."""
    return build_config(command(name).config_class(), name, argparse.Namespace(workdir=None), str(PAPER_CONFIG),
                        set_by_caller=set_by_loop)


def _flag(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


def test_the_paper_configs_placement_is_the_documented_gpu_plan():
    table = _plan_table()
    loop, rollout, index = _section("loop"), _section("agent_rollout", ("qa",)), _section("index_build", ("out",))
    node = set(range(loop.verl.n_gpus_per_node))
    assert node == set(range(8)) and loop.verl.nnodes == 1

    service = table["service (whole loop)"]
    encoder_gpus, index_gpus = re.fullmatch(r"(.+) \(encoder\), (.+) \(index\)", service["GPUs"]).groups()
    assert loop.service.index_gpu == "on" and f"index_gpu: {loop.service.index_gpu}" in service["processes"]
    assert _gpus(index_gpus) == node and _gpus(encoder_gpus) == {0} and not loop.service.url  # served here

    assert _gpus(table["1 agent (verl)"]["GPUs"]) == node
    one_each = [[int(d)] for d in loop.rollout_devices]
    assert table["2 trajectories"]["GPUs"] == table["6 evaluate"]["GPUs"] == "one each"
    assert sorted(one_each) == [[g] for g in sorted(node)]
    assert f"{len(one_each)} x `agent rollout --shard i/{len(one_each)}`" in table["2 trajectories"]["processes"]
    assert table["2 trajectories"]["per GPU"].startswith(f"{rollout.agent.gpu_memory_utilization:g} of memory")

    mining = _gpus(table["3 mining"]["GPUs"])
    assert mining == {int(d) for d in loop.mining_devices} and len(loop.mining_devices) == len(mining)
    (scorer,) = [spec for spec in step_server_specs(loop.step_servers, STEPS) if spec.name == "lr_scorer"]
    words = command_words(scorer.command)
    assert _gpus(table["scorer"]["GPUs"]) == {int(d) for d in scorer.devices.split(",")} == node - mining
    assert scorer.steps == ("mining",) and int(_flag(words, "--tensor-parallel-size")) == len(node - mining)
    assert table["scorer"]["per GPU"].startswith(f"{float(_flag(words, '--gpu-memory-utilization')):g}:")
    assert f"--tensor-parallel-size {_flag(words, '--tensor-parallel-size')}" in table["scorer"]["processes"]

    launcher = command_words(loop.retriever_launcher)
    assert _gpus(table["4 retriever"]["GPUs"]) == node and int(_flag(launcher, "--nproc_per_node")) == len(node)
    assert shlex.join(launcher[1:]) in table["4 retriever"]["processes"]
    assert _gpus(table["5 index"]["GPUs"]) == node and index.encoder.devices == ["all"]  # every visible GPU
