"""The processes the loop starts on named devices: a step's shards (`run_on_devices`) and the services some steps
need (`StepServices`), such as the listwise LR scorer as a vLLM OpenAI server beside the mining shards.

Placement is the user's: every process gets the ``CUDA_VISIBLE_DEVICES`` its setting names (``"0"``, ``"4,5,6,7"``,
or ``"cpu"`` for none), nothing more. Engines that place work themselves (torchrun, verl's Ray cluster, vLLM's tensor
parallelism inside the devices it sees) do the rest; docs/loop.md, "The GPU plan", gives the plan of the paper
config on one 8-GPU node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from ..jsonl import atomic_write

__all__ = ["PYTHON", "ServiceSpec", "StepServices", "check_devices", "command_words", "concatenate", "device_env",
           "log_tail", "run_on_devices", "service_specs", "write_section"]

_GPU_LIST = re.compile(r"^\d+(,\d+)*$")
#: The word in a configured command (a service, the retriever launcher, verl's launcher) that stands for the loop's
#: own interpreter, so that ``{python} -m torch.distributed.run`` runs the torch of the loop's environment whatever
#: PATH holds (an unactivated venv's ``torchrun`` or ``vllm`` is another interpreter's, or none).
PYTHON = "{python}"


def command_words(command: str) -> list[str]:
    """`command` split like a shell, each `PYTHON` word replaced by this interpreter (``sys.executable``)."""
    return [sys.executable if word == PYTHON else word for word in shlex.split(command)]
#: Lines of a failed process's log quoted in the error.
_TAIL_LINES = 20


def check_devices(devices: Sequence[str], where: str) -> None:
    """Refuse a device entry that is neither ``cpu`` nor a comma-separated list of GPU numbers."""
    for device in devices:
        if device != "cpu" and not _GPU_LIST.match(str(device)):
            raise ValueError(f"{where}: device {device!r} is neither 'cpu' nor GPU numbers such as '0' or '4,5,6,7'")


def device_env(device: str) -> dict[str, str]:
    """The environment of a process placed on `device`: this one's, with ``CUDA_VISIBLE_DEVICES`` set (empty for
    ``cpu``, so CUDA sees no GPU)."""
    check_devices([device], "device")
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "" if device == "cpu" else device}


def write_section(path: Path, section: str, config: Any) -> Path:
    """`config` (a settings dataclass, every path already resolved) as a one-section config file that its command
    reads with ``--config``: what a step's processes run is on disk beside their output."""
    plain = json.loads(json.dumps(asdict(config)))  # tuples as lists: the file holds YAML's plain types only
    with atomic_write(path) as handle:
        handle.write(yaml.safe_dump({section: plain}, sort_keys=False))
    return path


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """The last `lines` lines of a process's log, for an error message."""
    if not path.exists():
        return f"(no log at {path})"
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def _stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the process's group (an engine's workers with it), SIGKILL after `grace_s`."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _start(command: Sequence[str], device: str, log_path: Path) -> subprocess.Popen:
    """`command` in its own process group (so stopping it stops its workers), on `device` ("": this process's
    devices), appending to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as handle:  # the child keeps its own descriptor
        return subprocess.Popen(list(command), env=device_env(device) if device else None, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)


def run_on_devices(commands: Sequence[Sequence[str]], devices: Sequence[str], log_dir: Path, what: str,
                   numbers: Sequence[int] | None = None) -> None:
    """Run ``commands[k]`` on ``devices[k]``, all at once, each logging to ``log_dir/WHAT-NUMBER.log`` (`numbers`:
    the shard each is, by default 0, 1, ...), and wait for all of them (a failed one does not stop the others: their
    work is resumable and kept). Raises naming every failed process, its log and the log's last lines; stops them
    all when interrupted."""
    numbers = list(range(len(commands))) if numbers is None else list(numbers)
    if not len(commands) == len(devices) == len(numbers):
        raise ValueError(f"{what}: {len(commands)} commands, {len(devices)} devices, {len(numbers)} numbers")
    logs = [log_dir / f"{what}-{number}.log" for number in numbers]
    for number, command, device, path in zip(numbers, commands, devices, logs):
        print(f"{what} {number} on {'the CPU' if device == 'cpu' else 'GPU ' + device}: {shlex.join(command)} "
              f"(log {path})", flush=True)
    processes: list[subprocess.Popen] = []
    try:
        for command, device, path in zip(commands, devices, logs):
            processes.append(_start(command, device, path))  # one by one: a failed start stops those started
        codes = [process.wait() for process in processes]
    except BaseException:
        for process in processes:
            _stop(process)
        raise
    failed = [k for k, code in enumerate(codes) if code != 0]
    if failed:
        detail = "\n".join(f"--- {what} {numbers[k]} exited with status {codes[k]} ({logs[k]}):\n"
                           f"{log_tail(logs[k])}" for k in failed)
        raise RuntimeError(f"{len(failed)} of {len(commands)} {what} processes failed; run the loop again to "
                           f"continue them\n{detail}")


def concatenate(parts: Iterable[Path], out: Path) -> int:
    """Join the JSONL `parts` into `out` in order (written whole, then renamed); the number of rows."""
    rows = 0
    with atomic_write(out) as sink:
        for part in parts:
            with open(part, encoding="utf-8") as source:
                for line in source:
                    if line.strip():
                        sink.write(line if line.endswith("\n") else line + "\n")
                        rows += 1
    return rows


@dataclass(frozen=True)
class ServiceSpec:
    """A server some steps need (``loop.services.NAME``): started before the first of its steps runs, stopped
    before a step that does not need it, so verl's agent step finds its GPUs free."""

    name: str
    command: str
    health_url: str
    steps: tuple[str, ...]
    devices: str = ""           # CUDA_VISIBLE_DEVICES of the server: GPU numbers, "cpu", or "" to inherit
    start_timeout_s: float = 1800.0

    @classmethod
    def from_mapping(cls, name: str, value: Any, steps: Sequence[str]) -> ServiceSpec:
        where = f"loop.services.{name}"
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping (command, health_url, steps, devices, start_timeout_s)")
        unknown = set(value) - {"command", "health_url", "steps", "devices", "start_timeout_s"}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} (known: command, health_url, "
                             "steps, devices, start_timeout_s)")
        for key in ("command", "health_url"):
            if not isinstance(value.get(key), str) or not value[key].strip():
                raise ValueError(f"{where}.{key}: required, a non-empty string")
        needed = value.get("steps")
        if not isinstance(needed, list) or not needed or any(s not in steps for s in needed):
            raise ValueError(f"{where}.steps: a list of the steps that need the server, each one of "
                             f"{', '.join(steps)}; got {needed!r}")
        devices = str(value.get("devices", ""))
        if devices:
            check_devices([devices], f"{where}.devices")
        timeout = float(value.get("start_timeout_s", 1800.0))
        if timeout <= 0:
            raise ValueError(f"{where}.start_timeout_s must be positive, got {timeout}")
        return cls(name, value["command"], value["health_url"], tuple(needed), devices, timeout)


def service_specs(services: dict[str, Any], steps: Sequence[str]) -> list[ServiceSpec]:
    """The parsed ``loop.services`` mapping (name -> settings), each checked."""
    return [ServiceSpec.from_mapping(name, value, steps) for name, value in services.items()]


class StepServices:
    """The servers of ``loop.services`` brought up and down around the steps: `before(step)` stops every running
    server that `step` does not name and starts (and waits for the health URL of) every one it does; leaving the
    context stops them all. Each server logs to ``log_dir/NAME.log``."""

    def __init__(self, specs: Sequence[ServiceSpec], log_dir: Path):
        self.specs, self.log_dir = list(specs), Path(log_dir)
        self.running: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> StepServices:
        return self

    def __exit__(self, *exc) -> None:
        for name in list(self.running):
            self._stop(name)

    def before(self, step: str) -> None:
        for name in [n for n in self.running if step not in self._spec(n).steps]:
            self._stop(name)
        for spec in self.specs:
            if step in spec.steps and spec.name not in self.running:
                self._start(spec)

    def _spec(self, name: str) -> ServiceSpec:
        return next(spec for spec in self.specs if spec.name == name)

    def _start(self, spec: ServiceSpec) -> None:
        log_path = self.log_dir / f"{spec.name}.log"
        print(f"starting service {spec.name} for {', '.join(spec.steps)}: {spec.command} (log {log_path})",
              flush=True)
        command = command_words(spec.command)
        process = _start(command, spec.devices, log_path)
        self.running[spec.name] = process
        started = time.monotonic()
        while True:
            if process.poll() is not None:
                del self.running[spec.name]
                raise RuntimeError(f"service {spec.name} exited with status {process.returncode} before "
                                   f"{spec.health_url} answered ({log_path}):\n{log_tail(log_path)}")
            try:
                if httpx.get(spec.health_url, timeout=5.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > spec.start_timeout_s:
                self._stop(spec.name)
                raise TimeoutError(f"service {spec.name}: {spec.health_url} did not answer 200 within "
                                   f"{spec.start_timeout_s:.0f} s ({log_path}):\n{log_tail(log_path)}")
            time.sleep(1.0)
        print(f"service {spec.name} is up ({spec.health_url}, {time.monotonic() - started:.0f} s)", flush=True)

    def _stop(self, name: str) -> None:
        process = self.running.pop(name)
        _stop(process)
        print(f"stopped service {name} (status {process.returncode})", flush=True)

