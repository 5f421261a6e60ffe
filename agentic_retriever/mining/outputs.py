"""What a mining run (or a merge of shards) writes, and the result type that says where.

In the run folder: ``retriever_train.jsonl`` (the training rows: Agentic-R's released row format plus each
passage's graded GAC, `training_row`), ``rounds.jsonl`` (per round its candidate table with each candidate's
role, `round_record`, which the audit joins with evidence labels), ``mining_stats.json`` (counters and rates,
`stats.summarize`, with `run_info`) and ``mining_stats.png``. The formats are in docs/data-formats.md
("Retriever training rows", "Mining rounds") and docs/mining.md ("Outputs"). `write_outputs` writes them all
from scratch, each atomically, so they never hold duplicated or half-written rows.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from agentic_retriever.base.jsonl import write_json, write_jsonl
from .config import MiningConfig
from .prompts import PROMPT_VERSION
from .rounds import Round
from .selection import Candidate, SelectionConfig
from .stats import plot_stats

__all__ = ["PLOT_FILE", "ROUNDS_FILE", "ROWS_FILE", "STATS_FILE", "MiningResult", "round_record", "run_info",
           "training_row", "write_outputs"]

log = logging.getLogger(__name__)

ROWS_FILE, STATS_FILE, PLOT_FILE = "retriever_train.jsonl", "mining_stats.json", "mining_stats.png"
ROUNDS_FILE = "rounds.jsonl"


@dataclass
class MiningResult:
    """Where a mining run (or a merge) wrote its outputs, and its statistics."""

    out_dir: Path
    rows_path: Path
    stats_path: Path
    plot_path: Path | None
    rows: int
    stats: dict


def training_row(rnd: Round, dataset: str, passages: list[Candidate], gac_threshold: float) -> dict:
    """One training row in Agentic-R's released format (docs/data-formats.md, "Retriever training rows"), plus
    each passage's graded GAC value (``gac``) for soft-label training, and the round's ``sample`` when it comes from
    a question's sampled trajectory after the first."""
    row = {
        "dataset": dataset, "query_id": rnd.question_id, "question": rnd.question, "round_index": rnd.round_index,
        "history_queries": list(rnd.history_queries), "query_text": rnd.query,
        "passage_ids": [c.passage_id for c in passages],
        "scores": [{"em": None if c.gac is None else int(c.gac >= gac_threshold),
                    "local_utility": None if c.lr is None else round(c.lr / 100, 4),
                    "gac": c.gac} for c in passages],
    }
    return {**row, "sample": rnd.sample} if rnd.sample else row


def round_record(rnd: Round, passages: list[dict], table: list[Candidate], gac_threshold: float | None,
                 roles: dict[str, str], drop_reason: str | None) -> dict:
    """One line of ``rounds.jsonl``: the round's candidate table with each candidate's role."""
    return {
        "round_id": rnd.id, "question_id": rnd.question_id, "question": rnd.question, "sample": rnd.sample,
        "round_index": rnd.round_index, "query": rnd.query,
        "status": "dropped" if drop_reason else "mined", "drop_reason": drop_reason,
        "candidates": [{"id": c.passage_id, "title": p["title"], "rank": c.rank, "score": round(p["score"], 6),
                        "lr": c.lr, "gac": c.gac,
                        "gac_pass": None if c.gac is None or gac_threshold is None else c.gac >= gac_threshold,
                        "contains_answer": c.contains_answer, "role": roles.get(c.passage_id)}
                       for c, p in zip(table, passages)],
    }


def run_info(config: MiningConfig, selection: SelectionConfig, scorer_used, agent, scorer, shard, total: int,
             seconds: float, retriever=None) -> dict:
    """The run's description in ``mining_stats.json``: models (names and content fingerprints), the candidate
    retriever's identity, scorer, settings, shard, wall time."""
    return {
        "prompt_version": PROMPT_VERSION,
        "lr_scorer": scorer_used.name if scorer_used is not None else None,
        "scorer_model": scorer.name if scorer is not None else None,
        "agent_model": agent.name if agent is not None else None,
        "scorer_fingerprint": scorer.fingerprint if scorer is not None and config.needs_scorer_llm else None,
        "agent_fingerprint": agent.fingerprint if agent is not None and selection.use_gac else None,
        "retriever": retriever,
        "gac_mode": (f"{config.gac_mode} ({config.gac_metric})" if config.gac_mode == "rollout"
                     else f"{config.gac_mode} ({config.gac_criterion})") if selection.use_gac else None,
        "selection": asdict(selection),
        "shard": list(shard),
        "trajectories_in_file": total,
        "wall_seconds": round(seconds, 3),
        "config": asdict(config),
    }


def write_outputs(work: Path, rows: list[dict], round_records: list[dict], stats: dict, plot: bool) -> MiningResult:
    """Write the rows, the round records, the statistics (and their picture) into `work`."""
    rows_path, stats_path = work / ROWS_FILE, work / STATS_FILE
    write_jsonl(rows_path, rows)
    write_jsonl(work / ROUNDS_FILE, round_records)
    write_json(stats_path, stats)
    plot_path = None
    if plot:
        plot_path = work / PLOT_FILE
        plot_stats(stats, plot_path)
    log.info("wrote %d rows to %s and statistics to %s", len(rows), rows_path, stats_path)
    return MiningResult(work, rows_path, stats_path, plot_path, len(rows), stats)
