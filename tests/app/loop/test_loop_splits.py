"""The loop keeps its question sets apart (agentic_retriever/app/loop/splits.py): no training set of the loop shares a
question with the retriever's selection slice or a dev set, by id, parent or normalised question."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from agentic_retriever.app.commands import command
from agentic_retriever.app.config_loader import build_config
from agentic_retriever.app.loop.config import LoopConfig, LoopEvalConfig, LoopJob
from agentic_retriever.app.loop.splits import check_splits
from agentic_retriever.base.data.prepare import prepare_defaults
from tests.fakes import write_jsonl

QUICKSTART = Path(__file__).resolve().parents[3] / "configs" / "loop_quickstart.yaml"


def _section(section: str):
    """A section of configs/loop_quickstart.yaml, built as `agentic-retriever loop` builds it."""
    return build_config(command(section).config_class(), section, argparse.Namespace(workdir=None), str(QUICKSTART))


def _quickstart_job() -> LoopJob:
    return LoopJob(build_config(LoopConfig, "loop", None, str(QUICKSTART)), agent_train=_section("agent_train"),
                   rollout=None, mine=None, train=_section("retriever_train"), index=None,
                   warm_start=_section("agent_sft"), prepare=_section("data_prepare"))


def test_the_quickstart_loops_sets_are_disjoint_and_its_old_rl_set_met_the_selection_slice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = _quickstart_job()
    prepare_defaults(job.prepare)
    counts = check_splits(job)
    assert set(counts) == {"agent_train.qa", "loop.mining_qa", "agent_sft.qa", "retriever_train.select_on",
                           "loop.eval.leaf_qa", "loop.eval.multihop_qa", "loop.eval.agent_qa"}
    assert counts["agent_train.qa"] > 32  # 4 PPO steps of 8 questions
    old = dataclasses.replace(job, agent_train=dataclasses.replace(
        job.agent_train, qa="runs/quickstart/data/fanoutqa_leaf_train_answerable.jsonl"))
    with pytest.raises(ValueError, match=r"agent_train\.qa .* and retriever_train\.select_on .* share"):
        check_splits(old)


def _rows(path: Path, ids, **extra) -> str:
    return str(write_jsonl(path, [{"id": f"q{i}", "question": f"Question number {i}?", "golden_answers": ["a"]}
                                  | extra for i in ids]))


def _job(rl: str, mining: str, dev: str) -> LoopJob:
    loop = LoopConfig(mining_qa=mining, eval=LoopEvalConfig(leaf_qa=dev, multihop_qa=dev, agent_qa=dev))
    rl_config = _section("agent_train")
    return LoopJob(loop, agent_train=dataclasses.replace(rl_config, qa=rl), rollout=None, mine=None, train=None,
                   index=None)


def test_a_training_set_meeting_dev_after_normalisation_is_refused_naming_both(tmp_path):
    dev = _rows(tmp_path / "dev.jsonl", range(10, 14))
    mining = _rows(tmp_path / "mining.jsonl", range(4, 8))
    assert check_splits(_job(_rows(tmp_path / "rl.jsonl", range(0, 8)), mining, dev))["agent_train.qa"] == 8
    leaked = str(write_jsonl(tmp_path / "leak.jsonl", [{"id": "x1", "question": "  question NUMBER 12 ",
                                                         "golden_answers": []}]))
    with pytest.raises(ValueError, match=r"agent_train\.qa \(.*leak\.jsonl\) and loop\.eval\.leaf_qa \(.*dev\.jsonl\)"):
        check_splits(_job(leaked, mining, dev))
    with pytest.raises(ValueError, match=r"loop\.mining_qa .* share 2 question keys .*id:q10"):
        check_splits(_job(leaked.replace("leak", "rl"), _rows(tmp_path / "m2.jsonl", [10]), dev))
