"""Training curves of a Hugging Face `Trainer` run: its log history as ``metrics.jsonl`` and a PNG.

Shared by the retriever trainer and the agent's warm start: one panel per logged metric (loss, learning
rate, and whatever else the run logs, such as the retriever's in-batch accuracy), against the update step.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..jsonl import atomic_write

__all__ = ["write_training_curves"]

#: Keys of Trainer log entries that are bookkeeping, not curves.
_NOT_CURVES = {"step", "epoch", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
               "train_loss", "grad_norm"}


def write_training_curves(history: list[dict], folder: str | Path, title: str,
                          metrics_file: str = "metrics.jsonl", plot_file: str = "training_curves.png") -> list[str]:
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
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(4.2 * max(1, len(names)), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        points = [(h["step"], h[name]) for h in entries if isinstance(h.get(name), int | float)]
        ax.plot(*zip(*points), marker="o", markersize=3)
        ax.set_xlabel("update")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_write(folder / plot_file, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return names
