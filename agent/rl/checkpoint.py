"""Checkpoints of an RL run: everything the next step depends on, written atomically.

A checkpoint is a folder ``OUT/checkpoints/step-000010`` holding ``state.pt`` (the trainable weights of the
policy and the critic, optimiser and scheduler states, the torch RNG state) and ``trainer_state.json`` (step,
position in the question stream, metric history). It is written to a hidden sibling and renamed, so a
folder with the final name is complete; the newest two are kept, and all are removed once the run has exported
its policy (`remove_checkpoints`: a run whose policy exists is finished and never resumes, and a 7B policy's
optimiser state is tens of GB per checkpoint). Rollout sampling is seeded by the step number, so resuming from
step k gives exactly the step k + 1 of an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["TrainerState", "latest_checkpoint", "load_checkpoint", "remove_checkpoints", "save_checkpoint",
           "trainable_state"]

log = logging.getLogger(__name__)

KEEP = 2


@dataclass
class TrainerState:
    step: int = 0            # finished steps
    cursor: int = 0          # questions consumed from the seeded stream
    history: list[dict] | None = None


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that training changes (all of them, or LoRA adapters and the value head)."""
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


def _load_trainable(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    expected = {name for name, p in model.named_parameters() if p.requires_grad}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"checkpoint {what} does not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
    model.load_state_dict(state, strict=False)


def save_checkpoint(folder: Path, state: TrainerState, modules: dict[str, Any]) -> Path:
    """Write checkpoint ``folder/step-NNNNNN``; `modules` maps names to models (trainable weights are saved),
    optimisers and schedulers (their state dicts)."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{state.step:06d}"
    tmp = folder / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    payload = {"torch_rng": torch.get_rng_state()}
    for name, module in modules.items():
        if module is None:
            continue
        payload[name] = trainable_state(module) if isinstance(module, nn.Module) else module.state_dict()
    torch.save(payload, tmp / "state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": state.step, "cursor": state.cursor,
                                                         "history": state.history or []}) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(folder.glob("step-*"))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint %s", final)
    return final


def latest_checkpoint(folder: Path) -> Path | None:
    steps = sorted(p for p in folder.glob("step-*") if (p / "trainer_state.json").is_file())
    return steps[-1] if steps else None


def remove_checkpoints(folder: Path) -> None:
    """Remove `folder` and the checkpoints in it (a finished run's: its exported policy replaces them)."""
    if folder.is_dir():
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        shutil.rmtree(folder)
        log.info("removed the resume checkpoints %s (%.1f MB): the exported policy replaces them", folder, size / 2**20)


def load_checkpoint(path: Path, modules: dict[str, Any]) -> TrainerState:
    """Restore `modules` (as given to `save_checkpoint`) and the RNG from `path`; return the trainer state."""
    payload = torch.load(path / "state.pt", weights_only=True)
    for name, module in modules.items():
        if module is None:
            continue
        if name not in payload:
            raise ValueError(f"checkpoint {path} has no {name!r}; it was written by a run with other settings")
        if isinstance(module, nn.Module):
            _load_trainable(module, payload[name], f"{path} ({name})")
        else:
            module.load_state_dict(payload[name])
    torch.set_rng_state(payload["torch_rng"])
    meta = json.loads((path / "trainer_state.json").read_text())
    return TrainerState(meta["step"], meta["cursor"], meta["history"])
