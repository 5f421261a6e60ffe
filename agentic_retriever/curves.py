"""Training curves of a Hugging Face `Trainer` run: its log history as ``metrics.jsonl`` and a PNG.

Shared by the retriever trainer, the agent's warm start and the agent's RL trainer: one panel per logged
metric (loss, learning rate, and whatever else the run logs, such as the retriever's in-batch accuracy or
the agent's reward), against the step, at most four panels per row. It lives outside `training` because
the agent may not import `training` (docs/architecture.md, "Import rules").
"""

from __future__ import annotations

import json
from pathlib import Path

from .jsonl import atomic_write

__all__ = ["write_training_curves"]

#: Keys of Trainer log entries that are bookkeeping, not curves.
_MAX_COLUMNS = 4  # panels per row of the figure

_NOT_CURVES = {"step", "epoch", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
               "train_loss", "grad_norm"}


def write_training_curves(history: list[dict], folder: str | Path, title: str,
                          metrics_file: str = "metrics.jsonl", plot_file: str = "training_curves.png",
                          xlabel: str = "update") -> list[str]:
    """Write the step-wise entries of `history` to `folder/metrics_file` and plot each metric; return the
    plotted metric names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    entries = [h for h in history if "step" in h]
    with atomic_write(folder / metrics_file) as handle:
        for entry in entries:
            handle.write(json.dumps(entry) + "\n")
    names = sorted({k for h in entries for k, v in h.items() if k not in _NOT_CURVES and isinstance(v, int | float)},
                   key=lambda k: (k != "loss", k))
    columns = min(_MAX_COLUMNS, max(1, len(names)))
    rows = max(1, -(-len(names) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows + 0.4), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        points = [(h["step"], h[name]) for h in entries if isinstance(h.get(name), int | float)]
        ax.plot(*zip(*points), marker="o", markersize=3)
        ax.set_xlabel(xlabel)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))  # keep the title clear of the top row
    with atomic_write(folder / plot_file, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return names
