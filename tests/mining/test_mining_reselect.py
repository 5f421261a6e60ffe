"""Re-selections of one mining run (agentic_retriever/mining/reselect.py): the ablations mined from the full run's
stores without scoring a candidate again, and a variant that would score again refused by name. The mining itself
is the real pipeline with the fake agent and scorer of test_mining_pipeline, run as `run_mine_job` runs it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agentic_retriever.mining import mine
from agentic_retriever.mining.job import MineJobConfig
from agentic_retriever.mining.reselect import ABLATIONS, ablation_mining, mine_ablations, reselect, slug
from tests.fakes import FakeAgent, FakeScorer
from tests.mining.test_mining_pipeline import WORLD, config, trajectories


@pytest.fixture
def mined(tmp_path, monkeypatch) -> list[tuple[Path, FakeAgent, FakeScorer]]:
    """Each mining run `run_mine_job` would do: its output folder and the fake LLMs it called."""
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories()))
    runs = []

    def run_mine_job(job: MineJobConfig):
        agent, scorer = FakeAgent(), FakeScorer()
        runs.append((Path(job.out), agent, scorer))
        return mine(path, WORLD, agent, scorer, job.mining, Path(job.out))

    monkeypatch.setattr("agentic_retriever.mining.reselect.run_mine_job", run_mine_job)
    return runs


def _first_ids(path: Path) -> list[str]:
    return [json.loads(line)["passage_ids"][0] for line in path.read_text().splitlines()]


def test_ablations_are_reselected_from_the_full_runs_scores_without_scoring_again(mined, tmp_path):
    job = MineJobConfig(mining=config())
    rows = mine_ablations(job, tmp_path / "mining", ["full", "w/o GAC", "w/o LR"])
    assert list(rows) == ["full", "w/o GAC", "w/o LR"]
    assert [out.name for out, _, _ in mined] == ["full", "w-o-gac", "w-o-lr"]
    (_, full_agent, full_scorer), (_, gac_agent, gac_scorer), (_, lr_agent, lr_scorer) = mined
    assert full_agent.calls and full_scorer.calls  # the full run scored
    assert not gac_agent.calls and not gac_scorer.calls  # w/o GAC reads its stores
    # w/o LR scores no LR, and GAC only on rounds the full run judged by LR alone (one never parsed, one hopeless)
    assert not lr_scorer.calls and 0 < len(lr_agent.calls) < len(full_agent.calls)
    assert _first_ids(rows["w/o GAC"])[0] == "urban_cowboy_club-3"  # LR 95 leads, though it answers wrongly
    assert _first_ids(rows["full"])[0] == "urban_cowboy_club-0"


def test_a_variant_that_would_score_again_is_refused_by_name(mined, tmp_path):
    job = MineJobConfig(mining=config())
    mine_ablations(job, tmp_path / "mining", ["full"])
    with pytest.raises(RuntimeError, match=r"GAC metric contains rescored candidates \(gac: \d+ computed\)"):
        reselect(job, tmp_path / "mining" / "full", tmp_path / "mining" / "contains",
                 dataclasses.replace(job.mining, gac_metric="contains"), "GAC metric contains")


def test_unknown_ablations_are_refused_before_mining(mined, tmp_path):
    with pytest.raises(ValueError, match=r"unknown ablation\(s\) 'w/o question'"):
        mine_ablations(MineJobConfig(mining=config()), tmp_path, ["full", "w/o question"])
    with pytest.raises(ValueError, match="unknown ablation 'none'"):
        ablation_mining(config(), "none")
    assert not mined


def test_every_ablation_changes_only_what_it_names():
    base = config()
    assert ablation_mining(base, "full") == base
    assert ablation_mining(base, "w/o GAC").selection.use_gac is False
    without_lr = ablation_mining(base, "w/o LR")
    assert without_lr.lr_scorer == "none" and without_lr.selection == base.selection
    assert {slug(name) for name in ABLATIONS} == {"full", "w-o-gac", "w-o-lr", "no-false-negative-filter"}
