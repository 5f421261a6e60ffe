"""The agent trained on verl in one call (`run_verl_job`), as `agent.rl.run_rl_job` trains it on the embedded trainer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import RLConfig
from .checkpoint import start_verl_run, wait_for_checkpoint
from .console import reward_curve
from .disk import checkpoint_disk_bytes, parameter_count, save_count
from .run_folder import prepare_verl_run
from .settings import VerlSettings


def run_verl_job(settings: VerlSettings, rl: RLConfig, init_model: str, service_url: str, out: Path,
                 stand_in: Callable[[Path], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Train `init_model` with `rl`'s algorithm on verl against the retrieval service at `service_url`: write the
    run into `out` (`prepare_verl_run`), start it when ``settings.launch`` says so (else print the command and wait
    for the user's launch), and wait for its final checkpoint as a Hugging Face model folder (docs/verl.md).

    With ``settings.stand_in`` the run is written and validated by verl itself, and `stand_in` (the embedded
    trainer, given a folder) trains in its place: a dry run of a cluster config on a machine without its GPUs.
    Returns the model folder, the trainer, algorithm, steps and reward curve of the run."""
    if settings.stand_in and stand_in is None:
        raise ValueError("verl.stand_in trains with the embedded trainer in verl's place: give it (stand_in)")
    run = prepare_verl_run(out, settings, rl, service_url, init_model, rl.qa)
    if settings.stand_in:
        from .validate import validate_verl_run

        checked = validate_verl_run(run)
        print(f"verl run written to {run.out_dir} and validated by verl ({checked}); training with the embedded "
              "trainer in its place (verl.stand_in)", flush=True)
        return stand_in(out / "embedded") | {"verl_run": str(run.out_dir), "verl_validated": checked}
    print(f"verl run written to {run.out_dir}; launch it with: bash {run.launch_script}", flush=True)
    disk = _checkpoint_disk(settings, rl, init_model, run.final_step)
    print(f"verl's checkpoints will hold up to {disk / 1e9:,.1f} GB under {run.checkpoint_root} at once"
          if disk is not None else f"verl's checkpoint size is unknown ({init_model} is not a local folder)", flush=True)
    process = start_verl_run(run, settings.replace_running) if settings.launch else None
    if process is None:
        print("waiting for its checkpoint (run the command above; the checkpoint is picked up)", flush=True)
    model = wait_for_checkpoint(run, settings, process)
    return {"model": str(model), "trainer": "verl", "algorithm": rl.algorithm, "steps": run.final_step,
            "rewards": reward_curve(run.log_path)}


def _checkpoint_disk(settings: VerlSettings, rl: RLConfig, init_model: str, final_step: int) -> int | None:
    """The most disk the run's checkpoints hold at once (`checkpoint_disk_bytes`), when the initial model is a local
    folder."""
    parameters = parameter_count(init_model)
    if parameters is None:
        return None
    saves = save_count(final_step, settings.save_freq or rl.save_steps)
    return checkpoint_disk_bytes(parameters, rl.uses_critic, saves, settings.keep_checkpoints)
