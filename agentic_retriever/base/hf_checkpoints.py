"""Resume checkpoints of a Hugging Face `Trainer` that are whole or ignored.

transformers' Trainer writes ``checkpoint-N`` in place (weights, optimiser, scheduler, RNG, ``trainer_state.json``)
and ``get_last_checkpoint`` picks the newest folder by name, whatever it holds: a process killed, or a disk
filled, while a checkpoint is being saved leaves a partial folder that every rerun then fails to load. Here a
checkpoint counts only once it is known to be whole:

* `mark_complete_callback()` (a Trainer callback) runs after the Trainer has saved a checkpoint: it waits for every
  process (a barrier under ``torchrun``: DeepSpeed ranks write their own shards), fsyncs the folder's files, and
  then writes ``checkpoint_complete.json`` with each file's size, atomically. The marker is the commit point.
* `last_complete_checkpoint` resumes from the newest checkpoint whose marker is there and whose files still have
  the recorded sizes; newer folders without one are what a kill or a full disk left mid-save, and the main
  process removes them (with a warning), so the Trainer's own rotation and next save meet no debris.

Used by `agentic_retriever.base.curves.train_resuming`, the resume of the retriever trainer and of the agent's warm
start.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from .jsonl import read_json, write_json

__all__ = ["COMPLETE_MARKER", "checkpoint_is_complete", "last_complete_checkpoint", "mark_complete",
           "mark_complete_callback"]

log = logging.getLogger(__name__)

#: Written last into a checkpoint folder: the checkpoint is whole.
COMPLETE_MARKER = "checkpoint_complete.json"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def _file_sizes(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_size for path in sorted(folder.rglob("*"))
            if path.is_file() and path.name != COMPLETE_MARKER}


def mark_complete(folder: Path, step: int) -> None:
    """Make the files of `folder` durable, then write its marker (the commit point)."""
    sizes = _file_sizes(folder)
    for name in sizes:
        with open(folder / name, "rb") as handle:
            os.fsync(handle.fileno())
    write_json(folder / COMPLETE_MARKER, {"step": step, "files": sizes})


def checkpoint_is_complete(folder: str | os.PathLike) -> bool:
    """Whether `folder` has its marker and every file the marker lists, at the recorded size."""
    folder = Path(folder)
    try:
        recorded = read_json(folder / COMPLETE_MARKER)["files"]
        return all((folder / name).stat().st_size == size for name, size in recorded.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def last_complete_checkpoint(folder: str | os.PathLike, remove_partial: bool = True) -> str | None:
    """The newest whole checkpoint in `folder` (as a path string, what ``resume_from_checkpoint`` takes), or None.
    With `remove_partial` (the main process), checkpoint folders that are not whole are removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = sorted(((int(match.group(1)), path) for path in folder.iterdir()
                    if path.is_dir() and (match := _CHECKPOINT.fullmatch(path.name))), reverse=True)
    complete = None
    for _, path in found:
        if checkpoint_is_complete(path):
            complete = complete or path
        elif remove_partial:
            log.warning("removing %s: a checkpoint that was not saved whole (the run was killed or the disk "
                        "filled while saving it)", path)
            shutil.rmtree(path)
    return str(complete) if complete else None


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def mark_complete_callback():
    """A Trainer callback: after each save, every process waits for the others and the main one marks the new
    checkpoint whole (`mark_complete`). (A factory, so importing this module does not import transformers.)"""
    from transformers import TrainerCallback

    class MarkCompleteCheckpoints(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            _barrier()
            if state.is_world_process_zero:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if folder.is_dir():
                    mark_complete(folder, state.global_step)
            _barrier()
            return control

    return MarkCompleteCheckpoints()
