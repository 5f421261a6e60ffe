"""Other selections of one mining run's scores: the ablations of the utility signals ("Agentic-R: Learning to
Retrieve for Agentic Search", arXiv 2601.11888, section 5.3 and Table 2: "w/o GAC", "w/o LR") and other GAC or
LR thresholds, each mined from a copy of the full run's stage stores, so no candidate is scored twice.

A re-selection that would score a candidate (its settings differ beyond selection: another GAC target, another
scorer) is refused after the fact by the run's own counts, naming the variant.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

from .config import MiningConfig
from .job import MineJobConfig, run_mine_job
from .outputs import MiningResult

__all__ = ["ABLATIONS", "ablation_mining", "mine_ablations", "reselect", "slug"]

log = logging.getLogger(__name__)

#: Mining variant -> (MiningConfig overrides, SelectionConfig overrides); "full" is the method itself. Each other
#: variant selects from the full run's scores: "w/o GAC" ignores GAC, "w/o LR" turns the LR stage off.
ABLATIONS = {
    "full": ({}, {}),
    "w/o GAC": ({}, {"use_gac": False}),
    "w/o LR": ({"lr_scorer": "none"}, {}),
    "no false-negative filter": ({}, {"false_negative_filter": False}),
}


def slug(name: str) -> str:
    """A folder name for a variant's name ("w/o GAC" -> "w-o-gac")."""
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")


def ablation_mining(mining: MiningConfig, name: str) -> MiningConfig:
    """`mining` with the ablation `name` of `ABLATIONS` applied."""
    if name not in ABLATIONS:
        raise ValueError(f"unknown ablation {name!r}: one of {', '.join(ABLATIONS)}")
    overrides, selection = ABLATIONS[name]
    return dataclasses.replace(mining, **overrides, selection=dataclasses.replace(mining.selection, **selection))


def reselect(job: MineJobConfig, full_run: Path, out: Path, mining: MiningConfig, label: str,
             may_score: tuple[str, ...] = ()) -> MiningResult:
    """Mine `job` into `out` with `mining`, from a copy of `full_run`'s stage stores: a selection-only change, so
    no candidate may be scored by GAC or local relevance, except by the stages in `may_score` (checked from the
    run's counts; `label` names the variant in the error). The copy is refreshed every time: one made when the
    full run had mined fewer rounds would lack the new ones."""
    shutil.copytree(Path(full_run) / "stages", Path(out) / "stages", dirs_exist_ok=True)
    result = run_mine_job(dataclasses.replace(job, out=str(out), mining=mining))
    computed = {stage: result.stats["this_run"][stage]["computed"] for stage in ("gac", "local_relevance")}
    rescored = {stage: count for stage, count in computed.items() if count and stage not in may_score}
    if rescored:
        counts = ", ".join(f"{stage}: {count} computed" for stage, count in rescored.items())
        raise RuntimeError(f"{label} rescored candidates ({counts}): its settings differ beyond selection")
    for stage in may_score:
        if computed.get(stage):
            log.info("%s computed %d %s records the full run had not", label, computed[stage], stage)
    return result


def mine_ablations(job: MineJobConfig, out: Path, ablations: list[str]) -> dict[str, Path]:
    """The full method into ``out/full``, then each other of `ablations` re-selected from its stage stores into
    ``out/<slug>``; returns each variant's training rows (``retriever_train.jsonl``) by name. "w/o LR" may score
    GAC on rounds the full run judged by LR alone (LR below the threshold with ``skip_hopeless_gac``, or never
    parsed); every other variant scores nothing."""
    unknown = [name for name in ablations if name not in ABLATIONS]
    if unknown:
        raise ValueError(f"unknown ablation(s) {', '.join(map(repr, unknown))}: one of {', '.join(ABLATIONS)}")
    full = dataclasses.replace(job, out=str(Path(out) / "full"))
    run_mine_job(full)
    rows = {"full": Path(full.out) / "retriever_train.jsonl"}
    for name in ablations:
        if name != "full":
            rows[name] = reselect(job, Path(full.out), Path(out) / slug(name), ablation_mining(job.mining, name),
                                  f"ablation {name!r}", may_score=("gac",) if name == "w/o LR" else ()).rows_path
    return rows
