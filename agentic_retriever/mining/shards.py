"""Sharding a mining run, and merging the shards.

``shard=(i, n)`` mines the i-th of n contiguous slices of the trajectory file (`read_shard`) into
``<out>/shards/<i>-of-<n>/`` (`shard_dir`; separate stores, so shards run in parallel); `merge_shards`
concatenates their outputs into ``<out>/`` in file order, which gives the same rows as one unsharded run
(negative sampling is seeded per round, not per run). See docs/mining.md, "mine merge (sharding)".
"""

from __future__ import annotations

import os
from pathlib import Path

from agentic_retriever.base.jsonl import DataFormatError, check_shard, iter_jsonl, parse_shard, read_json, shard_bounds
from .environment import Trajectory
from .outputs import ROUNDS_FILE, ROWS_FILE, STATS_FILE, MiningResult, write_outputs
from .plan import merge_plans
from .stats import add_counters, new_counters, summarize

__all__ = ["merge_shards", "parse_shard", "read_shard", "shard_bounds", "shard_dir"]


def shard_dir(out_dir: str | os.PathLike, shard: tuple[int, int]) -> Path:
    """Where shard (i, n) writes: ``out_dir`` itself for (0, 1), else ``out_dir/shards/<i>-of-<n>``."""
    i, n = check_shard(shard)
    return Path(out_dir) if n == 1 else Path(out_dir) / "shards" / f"{i}-of-{n}"


def read_shard(path: str | os.PathLike, shard: tuple[int, int], limit: int | None = None
               ) -> tuple[list[Trajectory], int]:
    """The trajectories of contiguous slice i of n (non-blank lines; only its first `limit` when given), and the
    file's total."""
    with open(path, encoding="utf-8") as handle:
        total = sum(1 for line in handle if line.strip())
    start, stop = shard_bounds(total, shard)
    stop = stop if limit is None else min(stop, start + limit)
    trajectories = [Trajectory.from_json(row, path, line) for line, row in iter_jsonl(path, start, stop)]
    seen: set[str] = set()
    for t in trajectories:
        if t.id in seen:
            raise DataFormatError(path, None, f"trajectory {t.id!r} (question id and sample) appears twice",
                                  field="question_id")
        seen.add(t.id)
    return trajectories, total


def _settings(value):
    """A config without the settings that do not change results (progress bars, plotting)."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in ("progress", "plot")}
    return value


def merge_shards(out_dir: str | os.PathLike, num_shards: int, plot: bool = True) -> MiningResult:
    """Join the outputs of shards 0..num_shards-1 of `out_dir` into `out_dir` (rows in file order, counters added).

    Every shard must have finished (its ``retriever_train.jsonl`` and ``mining_stats.json`` exist; a missing
    one is named in the error) with the same settings and models.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    folders = [shard_dir(out_dir, (i, num_shards)) for i in range(num_shards)]
    missing = [str(f) for f in folders if not (f / ROWS_FILE).exists() or not (f / STATS_FILE).exists()]
    if missing:
        raise FileNotFoundError(f"shards not finished (no {ROWS_FILE} / {STATS_FILE}): {', '.join(missing)}")
    rows, round_records, counters, first, seconds, plans = [], [], new_counters(), None, 0.0, []
    for folder in folders:
        stats = read_json(folder / STATS_FILE)
        plans.append(stats.get("plan") or {})
        first = first or stats
        for name in ("config", "prompt_version", "scorer_model", "agent_model", "scorer_fingerprint",
                     "agent_fingerprint", "retriever"):
            if _settings(stats.get(name)) != _settings(first.get(name)):
                raise ValueError(f"{folder} was mined with another {name} than {folders[0]}: not merging")
        rows.extend(row for _, row in iter_jsonl(folder / ROWS_FILE))
        if (folder / ROUNDS_FILE).is_file():
            round_records.extend(record for _, record in iter_jsonl(folder / ROUNDS_FILE))
        add_counters(counters, stats["counters"])
        seconds += stats.get("wall_seconds", 0.0)
    info = {k: v for k, v in first.items() if k in ("prompt_version", "lr_scorer", "scorer_model", "agent_model",
                                                      "scorer_fingerprint", "agent_fingerprint", "retriever",
                                                      "gac_mode", "selection", "trajectories_in_file", "config")}
    info.update(shard=[0, num_shards], merged_shards=num_shards, wall_seconds=round(seconds, 3),
                plan=merge_plans(plans))
    return write_outputs(Path(out_dir), rows, round_records, summarize(counters, info), plot)
