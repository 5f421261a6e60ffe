"""Start a prepared verl run (`start_verl_run`) and pick up its final checkpoint (`wait_for_checkpoint`).

``checkpoint.save_contents`` includes ``hf_model``, so every save holds a Hugging Face folder at
``checkpoints/global_step_N/actor/huggingface`` (no model-merger step; it costs one extra copy of the weights per
save). verl saves on the last step whenever ``save_freq > 0`` and writes
``checkpoints/latest_checkpointed_iteration.txt`` after the save; `wait_for_checkpoint` waits for that file to name
the final step and for the folder to hold a config and weights.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

from agentic_retriever.base.jsonl import atomic_write
from agentic_retriever.base.sessions import kill_session, log_tail, session_members, start_session, stop_session
from .settings import VerlRun, VerlSettings

log = logging.getLogger(__name__)

#: Seconds verl gets to exit on its own after its final checkpoint (Ray, vLLM and the workers shut down), and to
#: stop after a SIGTERM before every process of the run is killed.
EXIT_GRACE_SECONDS = 300.0
TIMED_OUT = 124  # coreutils timeout's status: launch.sh's wall-clock limit stopped verl
#: Seconds verl gets between the wall-clock limit's SIGTERM and launch.sh's SIGKILL (coreutils timeout's -k).
KILL_GRACE_SECONDS = 120


PID_FILE = "verl.pid"  # the session of the run's launch.sh, written by start_verl_run


def running_launch(run: VerlRun) -> int | None:
    """The session id of a ``launch.sh`` of this run folder still running (from an earlier `start_verl_run`, e.g. of
    a loop that was killed), else None."""
    try:
        session = int((run.out_dir / PID_FILE).read_text().strip())
        command = Path(f"/proc/{session}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None
    return session if str(run.launch_script).encode() in command and session_members(session) else None


#: The signals ``launch.sh`` passes on to verl (`run_folder.launch_script`).
TRAPPED_SIGNALS = ("INT", "TERM", "HUP")


def start_verl_run(run: VerlRun, replace_running: bool = False) -> subprocess.Popen:
    """Start ``run.launch_script`` in a session of its own, stdout and stderr appended to ``run.log_path``, its
    session id in ``verl.pid``. A launch of this run still running from before is refused (two verls on one
    checkpoint folder and on the same GPUs), or with `replace_running` stopped first."""
    session = running_launch(run)
    if session is not None and not replace_running:
        raise RuntimeError(f"verl is still running this run from before (session {session}, {run.launch_script}); "
                           f"stop it (kill -TERM -- -{session}) or set loop.verl.replace_running: true")
    if session is not None:
        log.warning("stopping the verl still running this run from before (session %s)", session)
        kill_session(session, EXIT_GRACE_SECONDS)
    # A shell cannot trap a signal ignored when it started (POSIX), and a parent started in the background of a
    # script ignores SIGINT: coreutils' env gives the script the default handling back
    process = start_session(["env", f"--default-signal={','.join(TRAPPED_SIGNALS)}", "bash", str(run.launch_script)],
                            run.log_path, cwd=run.out_dir)
    with atomic_write(run.out_dir / PID_FILE) as handle:
        handle.write(f"{process.pid}\n")
    return process


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


def wait_for_checkpoint(run: VerlRun, settings: VerlSettings, process: subprocess.Popen | None = None,
                        exit_grace_s: float = EXIT_GRACE_SECONDS) -> Path:
    """Wait until verl's final checkpoint is complete and return its Hugging Face model folder.

    Complete: ``checkpoints/latest_checkpointed_iteration.txt`` names a step >= ``run.final_step`` (verl writes it
    after the save) and ``global_step_N/actor/huggingface`` holds ``config.json`` and weights (``hf_model`` is in
    ``checkpoint.save_contents``), which `agentic_retriever.base.llm` loads as ``LLMConfig(model=folder)``. Polls every
    ``settings.poll_seconds``; TimeoutError after ``settings.timeout_seconds``.

    With the `process` of `start_verl_run`: a non-zero exit fails at once with the log's tail (status 124: the
    launch's wall-clock limit stopped it); an exit 0 without the checkpoint fails too; after the checkpoint, verl
    gets `exit_grace_s` to exit (the next step needs its devices); and however the wait ends (an error, an
    interrupt), `stop_session` leaves no process of the run behind (its session: Ray, vLLM and the workers).
    """
    # a launched run stops itself at its limit (launch.sh): its exit, with the log, is the better error to give
    deadline = time.monotonic() + settings.timeout_seconds + (KILL_GRACE_SECONDS + 60 if process is not None else 0)
    try:
        while (folder := finished_checkpoint(run)) is None:
            if process is not None and process.poll() is not None:
                reason = (f"reached its wall-clock limit of {settings.timeout_seconds:g} s (VerlSettings."
                          "timeout_seconds) and was stopped" if process.returncode == TIMED_OUT
                          else f"exited with status {process.returncode}")
                raise RuntimeError(f"verl {reason} before writing the final checkpoint (step {run.final_step}) under "
                                   f"{run.checkpoint_root}; last lines of {run.log_path}:\n{log_tail(run.log_path, 40)}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no complete verl checkpoint of step {run.final_step} under {run.checkpoint_root} "
                                   f"after {settings.timeout_seconds:g} s (expected global_step_{run.final_step}/actor/"
                                   f"huggingface and latest_checkpointed_iteration.txt); run: bash {run.launch_script}")
            time.sleep(min(settings.poll_seconds, max(deadline - time.monotonic(), 0.0)))
        if process is not None:
            try:
                process.wait(timeout=exit_grace_s)
            except subprocess.TimeoutExpired:
                log.warning("verl wrote its final checkpoint but had not exited %g s later: stopping it", exit_grace_s)
            if process.returncode:
                log.warning("verl exited with status %s after writing its final checkpoint %s (log: %s)",
                            process.returncode, folder, run.log_path)
    finally:
        if process is not None:
            stop_session(process, exit_grace_s)
    return folder
