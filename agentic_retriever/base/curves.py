"""Training curves of a Hugging Face `Trainer` run: its log history as ``metrics.jsonl`` and a PNG.

Shared by the retriever trainer, the agent's warm start and the agent's RL trainer: one panel per logged
metric (loss, learning rate, and whatever else the run logs, such as the retriever's in-batch accuracy or
the agent's reward), against the step, at most four panels per row. It lives in the shared base because both
sides use it (docs/architecture.md, "Layers").

The same three trainers also report their logs to TensorBoard and/or Weights & Biases (``report_to``):
`resolve_report_to` turns the setting into the integrations to use; the Hugging Face trainers (retriever
training, warm start) get them as ``TrainingArguments.report_to`` (`hf_reporting`, `train_resuming`), and the RL
trainer's custom loop writes its step metrics through `ScalarLogger`. Both
write tags ``train/<metric>`` at the update (RL: the step), and both are imported only when asked for.

    report_to = resolve_report_to(["auto"])           # ["tensorboard"] when it is installed, else []
    logger = ScalarLogger(report_to, "runs/x/logs", run_name="x")
    logger.log({"step": 1, "reward": 0.4}, step=1)     # train/reward at step 1
    logger.close()
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from .hf_checkpoints import last_complete_checkpoint, mark_complete_callback
from .jsonl import atomic_write, naming_disk_full

log = logging.getLogger(__name__)

__all__ = ["REPORT_TO", "ScalarLogger", "hf_reporting", "integration_installed", "resolve_report_to",
           "train_resuming", "validate_report_to", "write_training_curves"]

#: Values of a ``report_to`` setting: auto (TensorBoard when it is installed), none, or the integrations.
REPORT_TO = ("auto", "none", "tensorboard", "wandb")
#: The W&B project when WANDB_PROJECT is not set.
WANDB_PROJECT = "agentic-retriever"

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


# ------------------------------------------------------------------------------------------------ report_to


def integration_installed(name: str) -> bool:
    """Whether the package of a logging integration (``tensorboard``, ``wandb``) can be imported."""
    if sys.modules.get(name) is not None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def validate_report_to(report_to: str | Sequence[str]) -> None:
    """Raise ValueError on a value that is not one of `REPORT_TO`, or on 'none' next to another."""
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    unknown = [name for name in names if name not in REPORT_TO]
    if unknown:
        raise ValueError(f"report_to: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(REPORT_TO)}")
    if "none" in names and len(names) > 1:
        raise ValueError(f"report_to: 'none' turns reporting off and cannot go with others, got {names}")


def _missing_integration(name: str) -> ImportError:
    return ImportError(f"report_to {name} needs the {name} package: pip install 'agentic-retriever[{name}]' "
                       "(or report_to none)")


def resolve_report_to(report_to: str | Sequence[str] | None) -> list[str]:
    """The integrations a run reports to: ``auto`` (and None) is ``tensorboard`` when it is installed and
    nothing otherwise, ``none`` is nothing, ``tensorboard`` and ``wandb`` are themselves; an integration asked
    for by name whose package is missing is an ImportError naming the package."""
    names = ["auto"] if report_to is None else [report_to] if isinstance(report_to, str) else list(report_to)
    validate_report_to(names)
    out: list[str] = []
    for name in names:
        if name == "auto":
            out += ["tensorboard"] if integration_installed("tensorboard") else []
        elif name != "none":
            if not integration_installed(name):
                raise _missing_integration(name)
            out.append(name)
    return list(dict.fromkeys(out))


def hf_reporting(args_class: type, report_to: Sequence[str], log_dir: str | Path, run_name: str = "") -> dict:
    """Keyword arguments of a Hugging Face ``TrainingArguments`` (`args_class`) that report to `report_to`
    (already resolved) with TensorBoard events in `log_dir`: ``report_to``, ``run_name`` and, on transformers
    versions that have the setting (before 5), ``logging_dir``; on later ones `train_resuming` does it."""
    kwargs: dict = {"report_to": list(report_to)}
    if run_name:
        kwargs["run_name"] = run_name
    if any(f.name == "logging_dir" for f in dataclasses.fields(args_class)):
        kwargs["logging_dir"] = str(log_dir)
    return kwargs


def _point_tensorboard_at(trainer, log_dir: str | Path) -> None:
    """Make the TensorBoard callback of a Hugging Face `trainer` write to `log_dir` (transformers 5 takes the
    folder from the callback, or TENSORBOARD_LOGGING_DIR, not from the arguments)."""
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__name__ == "TensorBoardCallback":
            callback.logging_dir = str(log_dir)


@contextlib.contextmanager
def _wandb_environment(report_to: Sequence[str], log_dir: str | Path) -> Iterator[None]:
    """While a Hugging Face trainer runs with ``wandb`` in `report_to`: W&B's local files under `log_dir` and
    the project ``agentic-retriever``, unless WANDB_DIR / WANDB_PROJECT say otherwise (restored afterwards)."""
    if "wandb" not in report_to:
        yield
        return
    saved = {key: os.environ.get(key) for key in ("WANDB_DIR", "WANDB_PROJECT")}
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_DIR", str(log_dir))
    os.environ.setdefault("WANDB_PROJECT", WANDB_PROJECT)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def train_resuming(trainer, checkpoints: Path, report_to: Sequence[str], log_dir: str | Path, what: str):
    """Run a Hugging Face `trainer`, resuming from the last whole checkpoint in `checkpoints` if there is one (each
    new checkpoint is marked whole once saved, and partial ones are removed: `hf_checkpoints`), with its
    TensorBoard and W&B logs under `log_dir`; returns ``trainer.train``'s output."""
    _point_tensorboard_at(trainer, log_dir)
    trainer.add_callback(mark_complete_callback())
    last = last_complete_checkpoint(checkpoints, remove_partial=trainer.is_world_process_zero())
    if last:
        log.info("resuming %s from %s", what, last)
    with _wandb_environment(report_to, log_dir), naming_disk_full(checkpoints, probe=True):
        return trainer.train(resume_from_checkpoint=last)


def _summary_writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise _missing_integration("tensorboard") from None
    return SummaryWriter


def _wandb():
    try:
        import wandb
    except ImportError:
        raise _missing_integration("wandb") from None
    return wandb


class ScalarLogger:
    """The scalars of a custom training loop to TensorBoard and/or W&B, tagged as the Hugging Face trainers tag
    theirs (``train/<name>``, at the given step). With nothing to report to it does nothing.

    TensorBoard events go to `log_dir`; the writer opens lazily at the first `log` with ``purge_step`` at that
    step, so a run resumed from a checkpoint drops the events a killed run wrote after it. W&B keeps its files
    in `log_dir` and logs to the project WANDB_PROJECT (default ``agentic-retriever``) under `run_name`, with
    `config` as the run's settings.
    """

    def __init__(self, report_to: Sequence[str], log_dir: str | Path, run_name: str = "",
                 config: Mapping | None = None):
        self.report_to = list(report_to)
        self.log_dir = Path(log_dir)
        self.run_name, self.config = run_name, dict(config or {})
        self._tensorboard = self._wandb_run = None
        self._writer_class = _summary_writer_class() if "tensorboard" in self.report_to else None
        self._wandb_module = _wandb() if "wandb" in self.report_to else None

    def log(self, metrics: Mapping, step: int) -> None:
        """Report the numbers of `metrics` (not ``step``, not booleans) at `step`."""
        scalars = {f"train/{name}": float(value) for name, value in metrics.items()
                   if name != "step" and isinstance(value, int | float) and not isinstance(value, bool)}
        if not scalars or not self.report_to:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self._writer_class is not None:
            if self._tensorboard is None:
                self._tensorboard = self._writer_class(log_dir=str(self.log_dir), purge_step=step)
            for tag, value in scalars.items():
                self._tensorboard.add_scalar(tag, value, step)
            self._tensorboard.flush()
        if self._wandb_module is not None:
            if self._wandb_run is None:
                self._wandb_run = self._wandb_module.init(
                    project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), name=self.run_name or None,
                    dir=str(self.log_dir), config=self.config)
            self._wandb_run.log(scalars, step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None
