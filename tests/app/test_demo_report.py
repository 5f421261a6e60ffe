"""The demo report's sentence on model selection names what was kept, on which inputs and by which scores; the
demo's (and the benchmarks') trajectory files are named by what makes their trajectories; the demo says what it
runs on."""

import dataclasses
from pathlib import Path

import pytest

from agent.rollouts import RolloutConfig
from agentic_retriever.app.demo import keyed_rollout, selection_note
from agentic_retriever.base.client import RetrievalConfig


def test_selection_note_names_the_inputs_that_decided_and_the_scores():
    selection = {"metric": "mrr@10", "compose_with": ["none", "parent"], "kept": "epoch-2",
                 "per_checkpoint": {"base": 0.8414, "epoch-1": 0.8665, "epoch-2": 0.8686}}
    note = selection_note(selection)
    assert "the bare question and composed with its parent question, the mean deciding" in note
    assert "base 0.841, epoch-1 0.867, epoch-2 0.869" in note and note.rstrip().endswith("kept epoch-2.")


def test_selection_note_says_when_the_base_was_kept_and_is_empty_without_a_selection():
    note = selection_note({"metric": "mrr@10", "compose_with": ["self"], "kept": "base",
                           "per_checkpoint": {"base": 0.9, "epoch-1": 0.8}})
    assert "(Q [SEP] Q)" in note and "kept the BASE weights" in note and "the mean deciding" not in note
    assert selection_note(None) == "" and selection_note({"kept": None}) == ""


def test_a_rollout_file_is_named_by_everything_that_makes_its_trajectories(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text('{"encoder": "a"}')
    rollout = RolloutConfig(qa="q.jsonl", retrieval=RetrievalConfig(index=str(index)), limit=36)
    rollout.agent.model = "agent-1"

    def path(config=rollout):
        keyed = keyed_rollout(config, tmp_path, "trajectories_mining")
        assert dataclasses.replace(keyed, out=config.out) == config  # only the output file is set
        return Path(keyed.out)

    first = path()
    assert first.parent == tmp_path and first.name.startswith("trajectories_mining_") and first.suffix == ".jsonl"
    assert path() == first
    changed = [path(dataclasses.replace(rollout, agent=dataclasses.replace(rollout.agent, model="agent-2"))),
               path(dataclasses.replace(rollout, limit=72)),
               path(dataclasses.replace(rollout, env=dataclasses.replace(rollout.env, temperature=0.7), samples=2)),
               path(dataclasses.replace(rollout, retrieval=RetrievalConfig(url="http://127.0.0.1:8000")))]
    (index / "manifest.json").write_text('{"encoder": "b"}')  # a retrained retriever's index
    changed.append(path())
    assert len({first, *changed}) == 6



@pytest.mark.parametrize("kind", ["amx", "avx512_bf16", "fp32"])
def test_the_demo_says_before_its_first_step_the_machine_class_its_precision_and_the_class_time(kind, monkeypatch):
    import torch

    from agentic_retriever.app import demo
    from agentic_retriever.base.encoder import EncoderConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(demo, "cpu_class", lambda: kind)
    job = demo.MainJob(demo.DemoConfig(encoder=EncoderConfig(precision="bf16" if kind != "fp32" else "fp32")))
    note = demo.machine_note(job, cores=2)
    minutes, measured_on = demo.DEMO_MINUTES[kind]
    assert f"CPU class {kind}" in note and f"took {minutes:.0f} min" in note and measured_on in note
    assert ("encoder bf16" if kind != "fp32" else "encoder fp32") in note and "cores here" not in note
    assert "4 cores here" in demo.machine_note(job, cores=4), "a machine unlike the measured one is told so"
