"""The processes the loop starts on named devices: a step's shards (`run_on_devices`) and the servers some steps
need (`StepServers`), such as the listwise LR scorer as a vLLM OpenAI server beside the mining shards.

With ``loop.placement: local`` placement is the user's: every process gets the ``CUDA_VISIBLE_DEVICES`` its setting
names (``"0"``, ``"4,5,6,7"``, or ``"cpu"`` for none), nothing more; with ``ray``, Ray places them (`ray_placement`).
Engines that place work themselves (torchrun, verl's Ray cluster, vLLM's tensor parallelism inside the devices it
sees) do the rest; docs/loop.md, "The GPU plan", gives the plan of the paper config on one 8-GPU node.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from agentic_retriever.base.client import API_KEY_ENV
from agentic_retriever.base.jsonl import atomic_write
from agentic_retriever.base.sessions import (command_words, log_tail, signal_handlers_kept, start_session, stop_all,
                                             stop_session)

__all__ = ["LoopSignal", "StepServerSpec", "StepServers", "check_devices", "concatenate", "device_env",
           "run_on_devices", "step_server_specs", "signals_stop_children", "threads_each", "write_section"]

_GPU_LIST = re.compile(r"^\d+(,\d+)*$")
def check_devices(devices: Sequence[str], where: str) -> None:
    """Refuse a device entry that is neither ``cpu`` nor a comma-separated list of GPU numbers."""
    for device in devices:
        if device != "cpu" and not _GPU_LIST.match(str(device)):
            raise ValueError(f"{where}: device {device!r} is neither 'cpu' nor GPU numbers such as '0' or '4,5,6,7'")


def device_env(device: str, threads: int | None = None) -> dict[str, str]:
    """The environment of a process placed on `device`: this one's, with ``CUDA_VISIBLE_DEVICES`` set (empty for
    ``cpu``, so CUDA sees no GPU) and, given `threads`, ``OMP_NUM_THREADS`` (unless the user set it)."""
    check_devices([device], "device")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "" if device == "cpu" else device}
    if threads is not None and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def threads_each(processes: int) -> int:
    """CPU threads for each of `processes` processes running at once on this machine's usable cores (at least 1):
    torch starts a thread per core in every process, so n processes on c cores would run n x c threads, which
    measured 4-5x slower for the dry run's CPU shards than one thread each on 2 cores (benchmarks/RESULTS.md,
    "With its shards and scorer placed by Ray over two nodes"). Ray gives its actors the same cap
    (``OMP_NUM_THREADS`` = their CPUs)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, processes))


def write_section(path: Path, section: str, config: Any) -> Path:
    """`config` (a settings dataclass, every path already resolved) as a one-section config file that its command
    reads with ``--config``: what a step's processes run is on disk beside their output."""
    plain = json.loads(json.dumps(asdict(config)))  # tuples as lists: the file holds YAML's plain types only
    with atomic_write(path) as handle:
        handle.write(yaml.safe_dump({section: plain}, sort_keys=False))
    return path


class LoopSignal(BaseException):
    """SIGTERM, SIGINT or SIGHUP received by the loop, raised where it ran so that every step's cleanup runs (a
    BaseException, as KeyboardInterrupt, so that no ``except Exception`` swallows it)."""

    def __init__(self, signum: int):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


@contextmanager
def signals_stop_children():
    """While inside: SIGTERM, SIGINT and SIGHUP raise `LoopSignal` (the steps' ``finally`` blocks stop their
    children); on the way out by a signal, every child still registered is stopped too. The handlers before are
    restored. In a thread other than the main one (no signal handlers there) it only does the last part."""
    def raise_signal(signum: int, frame: Any) -> None:
        raise LoopSignal(signum)

    names = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    with signal_handlers_kept(names):
        if threading.current_thread() is threading.main_thread():
            for sig in names:
                signal.signal(sig, raise_signal)
        try:
            yield
        except LoopSignal:
            stop_all()
            raise


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
    threads = threads_each(len(commands))
    try:
        for command, device, path in zip(commands, devices, logs):  # one by one: a failed start stops those started
            processes.append(start_session(command, path, device_env(device, threads) if device else None))
        codes = [process.wait() for process in processes]
    finally:
        for process in processes:  # what each left in its session (or all of it, on an error or a signal)
            stop_session(process)
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


#: Variables of the loop's process that the processes it starts on other nodes need too (`ray_placement`): the
#: retrieval service's API key, and each step server's ``api_key_env``.
FORWARDED: set[str] = {API_KEY_ENV}


@dataclass(frozen=True)
class StepServerSpec:
    """A server some steps need (``loop.step_servers.NAME``): started before the first of its steps runs, stopped
    before a step that does not need it, so verl's agent step finds its GPUs free."""

    name: str
    command: str
    health_url: str
    steps: tuple[str, ...]
    devices: str = ""           # CUDA_VISIBLE_DEVICES of the server: GPU numbers, "cpu", or "" to inherit
    start_timeout_s: float = 1800.0
    api_key_env: str = ""       # the variable the server and its clients read a shared key from (`StepServers`)
    max_restarts: int = 2       # how often a run of the loop restarts it after it died (`StepServers.revive`)

    @property
    def gpu_count(self) -> int:
        """The GPUs its ``devices`` name (0 for ``cpu`` or none)."""
        return 0 if self.devices in ("", "cpu") else len(self.devices.split(","))

    @classmethod
    def from_mapping(cls, name: str, value: Any, steps: Sequence[str]) -> StepServerSpec:
        where = f"loop.step_servers.{name}"
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping ({', '.join(_SERVICE_FIELDS)})")
        unknown = set(value) - set(_SERVICE_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} (known: "
                             f"{', '.join(_SERVICE_FIELDS)})")
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
        key_env = value.get("api_key_env", "")
        if not isinstance(key_env, str) or key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env):
            raise ValueError(f"{where}.api_key_env: the name of an environment variable, got {key_env!r}")
        restarts = value.get("max_restarts", 2)
        if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0:
            raise ValueError(f"{where}.max_restarts: a whole number >= 0, got {restarts!r}")
        return cls(name, value["command"], value["health_url"], tuple(needed), devices, timeout, key_env, restarts)


_SERVICE_FIELDS = ("command", "health_url", "steps", "devices", "start_timeout_s", "api_key_env", "max_restarts")


def step_server_specs(servers: dict[str, Any], steps: Sequence[str]) -> list[StepServerSpec]:
    """The parsed ``loop.step_servers`` mapping (name -> settings), each checked."""
    return [StepServerSpec.from_mapping(name, value, steps) for name, value in servers.items()]


class _LocalServer:
    """A step server started on this node (`start_session`) with the devices its spec names."""

    address = None  # its URLs are reachable as configured

    def __init__(self, spec: StepServerSpec, log_path: Path):
        self.process = start_session(command_words(spec.command), log_path,
                                     device_env(spec.devices) if spec.devices else None)

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self) -> int | None:
        stop_session(self.process)
        return self.process.returncode


class StepServers:
    """The servers of ``loop.step_servers`` brought up and down around the steps: `before(step)` stops every running
    server that `step` does not name and starts (and waits for the health URL of) every one it does; leaving the
    context stops them all. A server with ``api_key_env`` finds a key in that variable (a fresh random one unless
    the user set it), which the loop's own processes inherit and Ray's are handed: vLLM's OpenAI server reads
    ``VLLM_API_KEY`` and the ``openai`` scorer backend sends the variable its ``api_key_env`` names. A server that
    died is started again (`revive`), at most ``max_restarts`` times in a run. Each server logs to
    ``log_dir/NAME.log``. With `ray` (``loop.ray`` under
    ``loop.placement: ray``) each runs as a Ray actor asking for as many GPUs as its ``devices`` list names, on
    whichever node has them free (`ray_placement.RayServer`), and its loopback URLs point at that node
    (`reachable`)."""

    def __init__(self, specs: Sequence[StepServerSpec], log_dir: Path, ray: Any = None):
        self.specs, self.log_dir, self.ray = list(specs), Path(log_dir), ray
        self.running: dict[str, Any] = {}
        self.restarts: dict[str, int] = {}  # restarts of each server in this run
        self._made_keys: set[str] = set()  # keys put in the environment here, removed when the servers go

    def __enter__(self) -> StepServers:
        return self

    def __exit__(self, *exc) -> None:
        for name in list(self.running):
            self._stop(name)
        for variable in self._made_keys:
            os.environ.pop(variable, None)
        self._made_keys.clear()

    def before(self, step: str) -> None:
        for name in [n for n in self.running if step not in self._spec(n).steps]:
            self._stop(name)
        self.revive(step)  # one that died since the last step
        for spec in self.specs:
            if step in spec.steps and spec.name not in self.running:
                self._start(spec)

    def revive(self, step: str) -> list[str]:
        """Start again every server of `step` that died (its process exited): the names started. Each is started
        at most its ``max_restarts`` times in a run; past that a RuntimeError names it, its log and the log's last
        lines. The loop calls this when a step failed, and runs the step again (it resumes from its stores) when a
        server came back."""
        dead = [(name, status) for name, server in self.running.items()
                if step in self._spec(name).steps and (status := server.poll()) is not None]
        for name, status in dead:
            spec, log_path = self._spec(name), self.log_dir / f"{name}.log"
            self._stop(name)  # what its session left
            death = f"step server {name} died with status {status} during {step} ({log_path}):\n{log_tail(log_path)}"
            if self.restarts.get(name, 0) >= spec.max_restarts:
                raise RuntimeError(f"{death}\nit was restarted {spec.max_restarts} time(s) in this run "
                                   f"(loop.step_servers.{name}.max_restarts); fix the server, then run the loop again: "
                                   f"the step continues from what it stored")
            self.restarts[name] = self.restarts.get(name, 0) + 1
            print(f"{death}\nrestarting it ({self.restarts[name]} of {spec.max_restarts})", flush=True)
            self._start(spec)
        return [name for name, _ in dead]

    def reachable(self, url: str) -> str:
        """`url` as the loop's processes reach it: a loopback URL on the port of a server Ray placed on another
        node points at that node; any other URL as it is."""
        for name, server in self.running.items():
            if server.address and urlsplit(url).port == urlsplit(self._spec(name).health_url).port:
                from .ray_placement import reachable_url

                return reachable_url(url, server.address)
        return url

    def _spec(self, name: str) -> StepServerSpec:
        return next(spec for spec in self.specs if spec.name == name)

    def _start(self, spec: StepServerSpec) -> None:
        log_path = self.log_dir / f"{spec.name}.log"
        print(f"starting step server {spec.name} for {', '.join(spec.steps)}: {spec.command} (log {log_path})",
              flush=True)
        started = time.monotonic()
        if spec.api_key_env:  # the server and every client read it there, on this node and the others
            if not os.environ.get(spec.api_key_env):
                os.environ[spec.api_key_env] = secrets.token_urlsafe(32)
                self._made_keys.add(spec.api_key_env)
            FORWARDED.add(spec.api_key_env)
        if self.ray is None:
            server = _LocalServer(spec, log_path)
        else:
            from .ray_placement import RayServer

            server = RayServer.start(command_words(spec.command), log_path, spec.gpu_count, self.ray.cpus_per_process,
                                     spec.start_timeout_s, f"step server {spec.name}",
                                     forward=[spec.api_key_env] if spec.api_key_env else [])
            print(f"step server {spec.name} placed by Ray on node {server.address}, GPUs "
                  f"{server.place['gpus'] or 'none'}",
                  flush=True)
        self.running[spec.name] = server
        health_url = self.reachable(spec.health_url)
        while True:
            if (status := server.poll()) is not None:
                self._stop(spec.name)  # its workers may live on in their own groups
                raise RuntimeError(f"step server {spec.name} exited with status {status} before "
                                   f"{health_url} answered ({log_path}):\n{log_tail(log_path)}")
            try:
                if httpx.get(health_url, timeout=5.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > spec.start_timeout_s:
                self._stop(spec.name)
                raise TimeoutError(f"step server {spec.name}: {health_url} did not answer 200 within "
                                   f"{spec.start_timeout_s:.0f} s ({log_path}):\n{log_tail(log_path)}")
            time.sleep(1.0)
        print(f"step server {spec.name} is up ({health_url}, {time.monotonic() - started:.0f} s)", flush=True)

    def _stop(self, name: str) -> None:
        status = self.running.pop(name).stop()
        print(f"stopped step server {name} (status {status})", flush=True)
