"""Start a prepared verl run (`start_verl_run`) and pick up its final checkpoint (`wait_for_checkpoint`).

``checkpoint.save_contents`` includes ``hf_model``, so every save holds a Hugging Face folder at
``checkpoints/global_step_N/actor/huggingface`` (no model-merger step; it costs one extra copy of the weights per
save). verl saves on the last step whenever ``save_freq > 0`` and writes
``checkpoints/latest_checkpointed_iteration.txt`` after the save; `wait_for_checkpoint` waits for that file to name
the final step and for the folder to hold a config and weights.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from ..processes import log_tail
from .settings import VerlRun, VerlSettings


def start_verl_run(run: VerlRun) -> subprocess.Popen:
    """Start ``run.launch_script`` in its own process group, stdout and stderr appended to ``run.log_path``."""
    with open(run.log_path, "ab") as log:
        return subprocess.Popen(["bash", str(run.launch_script)], cwd=run.out_dir, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def finished_checkpoint(run: VerlRun) -> Path | None:
    """The Hugging Face folder of the final step's checkpoint when verl has finished writing it, else None."""
    marker = run.checkpoint_root / "latest_checkpointed_iteration.txt"
    try:
        step = int(marker.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    folder = run.checkpoint_root / f"global_step_{step}" / "actor" / "huggingface"
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    if step < run.final_step or not (folder / "config.json").is_file() or not has_weights:
        return None
    return folder


def wait_for_checkpoint(run: VerlRun, settings: VerlSettings, process: subprocess.Popen | None = None) -> Path:
    """Wait until verl's final checkpoint is complete and return its Hugging Face model folder.

    Complete: ``checkpoints/latest_checkpointed_iteration.txt`` names a step >= ``run.final_step`` (verl writes it
    after the save) and ``global_step_N/actor/huggingface`` holds ``config.json`` and weights (``hf_model`` is in
    ``checkpoint.save_contents``), which `agentic_retriever.llm` loads as ``LLMConfig(model=folder)``. With the
    `process` of `start_verl_run`, a non-zero exit fails at once with the log's tail; an exit 0 without the
    checkpoint fails too. Polls every ``settings.poll_seconds``; TimeoutError after ``settings.timeout_seconds``.
    """
    deadline = time.monotonic() + settings.timeout_seconds
    while (folder := finished_checkpoint(run)) is None:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"verl exited with status {process.returncode} before writing the final checkpoint "
                               f"(step {run.final_step}) under {run.checkpoint_root}; last lines of "
                               f"{run.log_path}:\n{log_tail(run.log_path, 40)}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no complete verl checkpoint of step {run.final_step} under {run.checkpoint_root} "
                               f"after {settings.timeout_seconds:g} s (expected global_step_{run.final_step}/actor/"
                               f"huggingface and latest_checkpointed_iteration.txt); run: bash {run.launch_script}")
        time.sleep(min(settings.poll_seconds, max(deadline - time.monotonic(), 0.0)))
    return folder
