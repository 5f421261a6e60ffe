"""mining_stats.json and its picture: what went in, what was dropped and why, what the scorers did, what it cost.

Statistics are kept as additive counters (`new_counters`), so shards merge by adding them (`add_counters`);
`summarize` turns counters into the report (rates, parse rates, the LR histogram), and `plot_stats` draws it.

Costs come in two kinds: ``cost`` is what the stored results this output is built from cost when they were
computed, whichever run computed them (each stored record carries its share of its batch's calls, tokens
and seconds), so it is the same for a run done at once and a run resumed three times; ``this_run`` is what
this invocation computed, reused from the stores, and spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["LR_BINS", "STAGES", "add_counters", "count_gac", "count_local_relevance", "lr_bin", "new_counters",
           "plot_stats", "summarize"]

STAGES = ("candidates", "sub_answers", "local_relevance", "gac")
LR_BINS = [f"{lo}-{lo + 9}" for lo in range(0, 90, 10)] + ["90-100"]
_COST = ("calls", "sequences", "prompt_tokens", "completion_tokens", "seconds")


def new_counters() -> dict[str, Any]:
    return {
        "trajectories": 0,
        "rounds_in": 0,
        "dropped": {},
        "rounds_mined": 0,
        "rows": 0,
        "gac_target": {},
        "positives_per_round": {},
        "sub_answers": {"trajectories": 0, "ok": 0, "count_mismatch": 0, "queries": 0, "given": 0},
        "local_relevance": {"rounds": 0, "with_sub_answer": 0, "without_sub_answer": 0, "windows": 0,
                            "windows_first_try": 0, "windows_after_retry": 0, "windows_failed": 0,
                            "histogram": [0] * len(LR_BINS)},
        "gac": {"rounds": 0, "candidates": 0, "correct": 0, "rounds_with_correct": 0, "further_searches": 0,
                "no_answer": 0},
        "cost": {stage: dict.fromkeys(_COST, 0) for stage in STAGES},
        "this_run": {stage: {"computed": 0, "reused": 0, **dict.fromkeys(_COST, 0)} for stage in STAGES},
    }


def lr_bin(lr: float) -> int:
    """Index of the LR histogram bin of a score in 0..100."""
    return min(int(lr // 10), len(LR_BINS) - 1)


def count_local_relevance(counters: dict, record: dict) -> None:
    """Count one round's stored LR record: its template, its listwise windows, its scores' histogram."""
    counts = counters["local_relevance"]
    counts["rounds"] += 1
    counts["with_sub_answer" if record["template"] == "with_sub_answer" else "without_sub_answer"] += 1
    for window in record.get("windows", []):
        counts["windows"] += 1
        if window["status"] != "ok":
            counts["windows_failed"] += 1
        elif len(window["outputs"]) == 1:
            counts["windows_first_try"] += 1
        else:
            counts["windows_after_retry"] += 1
    for score in record["scores"] or []:
        counts["histogram"][lr_bin(score)] += 1


def count_gac(counters: dict, record: dict, values: list[float], threshold: float) -> None:
    """Count one round's stored GAC record, whose graded values are `values`, against the GAC threshold."""
    counts = counters["gac"]
    correct = [value >= threshold for value in values]
    counts["rounds"] += 1
    counts["candidates"] += len(correct)
    counts["correct"] += sum(correct)
    counts["rounds_with_correct"] += int(any(correct))
    counts["further_searches"] += sum(record.get("further_searches", []))
    counts["no_answer"] += sum(a is None for a in record.get("answers", []))


def add_counters(total: dict, other: dict) -> dict:
    """`total` += `other`, recursively (numbers add, lists add element-wise, missing keys are taken)."""
    for key, value in other.items():
        if key not in total:
            total[key] = value if not isinstance(value, (dict, list)) else _copy(value)
        elif isinstance(value, dict):
            add_counters(total[key], value)
        elif isinstance(value, list):
            total[key] = [a + b for a, b in zip(total[key], value)]
        elif isinstance(value, bool):
            total[key] = total[key] and value
        else:
            total[key] = total[key] + value
    return total


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return list(value)
    return value


def _rate(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def summarize(counters: dict, info: dict) -> dict:
    """The mining_stats.json document: `info` (scorers, settings, shard...) plus counters and derived rates."""
    lr, gac, sub = counters["local_relevance"], counters["gac"], counters["sub_answers"]
    parsed = lr["windows_first_try"] + lr["windows_after_retry"]
    return {
        **info,
        "trajectories": counters["trajectories"],
        "rounds": {"in": counters["rounds_in"], "mined": counters["rounds_mined"],
                   "dropped": dict(sorted(counters["dropped"].items())),
                   "dropped_total": sum(counters["dropped"].values())},
        "rows": counters["rows"],
        "gac_target": counters["gac_target"],
        "positives_per_round": dict(sorted(counters["positives_per_round"].items(), key=lambda kv: int(kv[0]))),
        "sub_answers": {**sub, "parse_rate": _rate(sub["ok"], sub["trajectories"]),
                        "given_rate": _rate(sub["given"], sub["queries"])},
        "local_relevance": {
            **{k: v for k, v in lr.items() if k != "histogram"},
            "parse_rate": _rate(parsed, lr["windows"]),
            "first_try_parse_rate": _rate(lr["windows_first_try"], lr["windows"]),
            "histogram": dict(zip(LR_BINS, lr["histogram"])),
        },
        "gac": {**gac, "rate": _rate(gac["correct"], gac["candidates"]),
                "rounds_with_correct_rate": _rate(gac["rounds_with_correct"], gac["rounds"]),
                "mean_further_searches": _rate(gac["further_searches"], gac["candidates"])},
        "cost": {stage: {k: round(v, 3) for k, v in c.items()} for stage, c in counters["cost"].items()},
        "this_run": {stage: {k: round(v, 3) for k, v in c.items()} for stage, c in counters["this_run"].items()},
        "counters": counters,
    }


def plot_stats(stats: dict, path: str | Path) -> None:
    """Four panels: rounds kept and dropped by reason, the LR histogram, positives per round, seconds per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentic_retriever.base.jsonl import atomic_write

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    rounds = stats["rounds"]
    labels = ["mined"] + list(rounds["dropped"])
    values = [rounds["mined"]] + list(rounds["dropped"].values())
    ax = axes[0][0]
    bars = ax.barh(labels, values, color=["tab:green"] + ["tab:red"] * len(rounds["dropped"]))
    ax.bar_label(bars, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(f"rounds: {rounds['in']} in, {rounds['mined']} mined, {stats['rows']} rows", fontsize=9)

    ax = axes[0][1]
    lr = stats["local_relevance"]
    bars = ax.bar(list(lr["histogram"]), list(lr["histogram"].values()), color="tab:blue")
    ax.bar_label(bars, fontsize=7)
    ax.tick_params(axis="x", labelsize=7, rotation=45)
    rate = lr["parse_rate"]
    ax.set_title(f"LR ({stats.get('lr_scorer', '?')}); parse rate "
                 f"{'n/a' if rate is None else f'{rate:.2f}'}", fontsize=9)

    ax = axes[1][0]
    positives = stats["positives_per_round"]
    bars = ax.bar(list(positives), list(positives.values()), color="tab:purple")
    ax.bar_label(bars, fontsize=7)
    gac_rate = stats["gac"]["rate"]
    ax.set_title(f"positives per mined round; GAC rate {'n/a' if gac_rate is None else f'{gac_rate:.2f}'}",
                 fontsize=9)

    ax = axes[1][1]
    stages = list(stats["cost"])
    seconds = [stats["cost"][s]["seconds"] for s in stages]
    bars = ax.bar(stages, seconds, color="tab:orange")
    ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title("seconds per stage (cost of the stored results)", fontsize=9)
    fig.suptitle(f"utility mining: {stats['trajectories']} trajectories", fontsize=10)
    fig.tight_layout()
    with atomic_write(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
