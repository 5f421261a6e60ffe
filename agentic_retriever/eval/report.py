"""Rendering of evaluation results: a Markdown table and a bar chart (PNG)."""

from __future__ import annotations

from pathlib import Path


def render_table(results: dict[str, dict[str, float]]) -> str:
    """Markdown table, one row per system, one column per metric (values to 3 decimals; "–" where a system
    has no value for a metric)."""
    metrics = _metrics(results)
    lines = ["| index | " + " | ".join(_label(m) for m in metrics) + " |",
             "|---|" + "---:|" * len(metrics)]
    lines += [f"| {name} | " + " | ".join(f"{values[m]:.3f}" if m in values else "–" for m in metrics) + " |"
              for name, values in results.items()]
    return "\n".join(lines)


def _metrics(results: dict[str, dict[str, float]]) -> list[str]:
    """Every metric of any system, in first-seen order."""
    return list(dict.fromkeys(m for values in results.values() for m in values))


def _label(metric: str) -> str:
    name, _, k = metric.partition("@")
    return {"recall": "Recall", "mrr": "MRR", "ndcg": "nDCG"}.get(name, name) + (f"@{k}" if k else "")


def plot_metrics(results: dict[str, dict[str, float]], path: str | Path, title: str) -> None:
    """Grouped bars: metrics on the x axis, one bar per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = _metrics(results)
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(1.6 * len(metrics) + 2, 4))
    for i, (name, values) in enumerate(results.items()):
        xs = [m + i * width - 0.4 + width / 2 for m in range(len(metrics))]
        bars = ax.bar(xs, [values.get(m, float("nan")) for m in metrics], width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(metrics)), [_label(m) for m in metrics])
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
