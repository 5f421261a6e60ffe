"""Settings search: train a grid of settings and keep the one that scores best on held-out training questions.

Each combination of the grid (e.g. learning rate x temperature x epochs) is trained by `train_retriever`
into its own subfolder, with held-out model selection on (`checkpoint_selection`), and scored by what its manifest
says: the held-out metric of the checkpoint it kept (the base's score when no epoch beat the base). The
search reads evidence labels of the held-out slice only, never the dev set, like the selection it builds on.
A finished subfolder with the same data and settings is reused (`train_retriever`'s fingerprint cache), so a
rerun, or a grid that grows, trains only the new combinations.

    best, table = choose_training_settings(config, {"learning_rate": [1e-5, 3e-5], "temperature": [0.01, 0.05]})
    train_retriever(dataclasses.replace(best, out="runs/x/retriever"))   # or use the best subfolder as is
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from pathlib import Path

from agentic_retriever.base.jsonl import read_json, write_json
from .config import RetrieverTrainConfig
from .export import MANIFEST_FILE

__all__ = ["SEARCH_FILE", "choose_training_settings"]

log = logging.getLogger(__name__)

SEARCH_FILE = "settings_search.json"


def choose_training_settings(base_config: RetrieverTrainConfig, grid: dict[str, list],
                             root: str | Path | None = None) -> tuple[RetrieverTrainConfig, list[dict]]:
    """Train every combination of `grid` (field name -> values, top-level fields of `RetrieverTrainConfig`)
    on top of `base_config` into ``ROOT/<name>/`` (ROOT: `root`, default ``base_config.out``); return the
    best config (its ``out`` the best subfolder; grid order breaks ties) and the table of all runs, one dict
    per run: the grid values, ``out``, ``score`` (held-out metric of the kept checkpoint), ``kept``,
    ``base_score`` and ``per_checkpoint``. The table is also written to ``ROOT/settings_search.json``."""
    if not base_config.select_on:
        raise ValueError("a settings search needs held-out model selection: set select_on and select_index")
    if not grid:
        raise ValueError("empty grid: name at least one setting and its values")
    known = {f.name for f in dataclasses.fields(RetrieverTrainConfig)}
    for name, values in grid.items():
        if name not in known or name in ("out", "encoder"):
            raise ValueError(f"grid setting {name!r} is not a top-level training setting "
                             f"(known: {', '.join(sorted(known - {'out', 'encoder'}))})")
        if not isinstance(values, list | tuple) or not values:
            raise ValueError(f"grid setting {name!r} needs a non-empty list of values, got {values!r}")
    root = Path(root or base_config.out)
    if not str(root):
        raise ValueError("a settings search needs a root folder (root or base_config.out)")
    from .trainer import train_retriever  # lazy: pulls in torch and sentence-transformers

    names = list(grid)
    table = []
    for values in itertools.product(*(grid[name] for name in names)):
        chosen = dict(zip(names, values))
        config = dataclasses.replace(base_config, out=str(root / _run_name(chosen)), **chosen)
        out = train_retriever(config)
        selection = read_json(Path(out) / MANIFEST_FILE).get("selection") or {}
        per_checkpoint = selection.get("per_checkpoint", {})
        score = per_checkpoint.get(selection.get("kept"))
        if score is None:
            raise ValueError(f"{out}/{MANIFEST_FILE} has no held-out selection result")
        table.append({**chosen, "out": str(out), "score": score, "kept": selection["kept"],
                      "base_score": per_checkpoint.get("base"), "per_checkpoint": per_checkpoint})
        log.info("settings %s: held-out %s %.4f (kept %s)", chosen, base_config.select_metric, score, selection["kept"])
    best_row = max(table, key=lambda row: row["score"])  # max keeps the first of equal scores
    best = dataclasses.replace(base_config, out=best_row["out"], **{name: best_row[name] for name in names})
    write_json(root / SEARCH_FILE, {"metric": base_config.select_metric, "select_on": base_config.select_on,
                                    "grid": grid, "best": {name: best_row[name] for name in names} | {
                                        "out": best_row["out"], "score": best_row["score"]}, "runs": table})
    log.info("best settings %s (held-out %s %.4f); table in %s", {n: best_row[n] for n in names},
             base_config.select_metric, best_row["score"], root / SEARCH_FILE)
    return best, table


def _run_name(chosen: dict) -> str:
    """A folder name of the grid values: ``learning_rate=2e-05,temperature=0.01``."""
    return ",".join(re.sub(r"[^A-Za-z0-9_.+=-]", "_", f"{name}={value}") for name, value in chosen.items())
