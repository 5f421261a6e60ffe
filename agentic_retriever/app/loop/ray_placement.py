"""``loop.placement: ray``: a step's shard processes and its servers (the LR scorer) placed by Ray over a running
cluster, the one verl's launch uses, instead of on the loop's node alone.

Each process is started by a Ray actor that asks for the process's GPUs (``num_gpus``), so Ray picks a node with
that many free and the process sees only those (``CUDA_VISIBLE_DEVICES`` from the ids Ray assigned; empty for
none). The actor runs the command in a session of its own (`sessions.start_session`, on the actor's node), logs
to the path the loop names (the loop's folder must be on a file system every node shares, as verl's checkpoints
must), and stops the whole session on request; the loop stops every actor of a step when the step ends, fails or
is interrupted. No scheduler of our own: Ray's placement, with its resource requests.

    connect("auto")                            # ray.init(address=...) once
    n = shard_count(0, 1.0, "mining")          # free GPUs // GPUs a shard needs
    places = run_on_ray(commands, 1.0, 1.0, log_dir, "mining")
    server = RayServer.start(command, log_path, 4, 1.0, 3600, "step server lr_scorer")  # waits for 4 free GPUs
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from agentic_retriever.base.sessions import log_tail, signal_handlers_kept, start_session, stop_session
from .processes import FORWARDED

try:
    import ray
except ImportError as error:  # the module is imported only for placement: ray
    raise ImportError("loop.placement: ray needs Ray: pip install 'agentic-retriever[ray]' (the same Ray on every "
                      "node of the cluster)") from error

__all__ = ["RayServer", "connect", "free_gpus", "node_address", "reachable_url", "run_on_ray", "shard_count"]

log = logging.getLogger(__name__)

#: Seconds an actor's `stop` may take (its session's SIGTERM grace, then SIGKILL) before the actor is killed.
_STOP_GRACE_S = 30.0


@ray.remote
class ProcessActor:
    """One process of the loop on a Ray node: started in its own session with the GPUs Ray gave this actor. Its
    methods run in threads of their own (the loop stops a process while another thread waits for it), so `start`
    and `stop` take one lock: a stop that comes first makes a later start refuse, and a start that comes first is
    stopped, never left running behind a stop that found nothing yet."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.stopped = False
        self.lock = threading.Lock()

    def start(self, command: list[str], log_path: str, cwd: str, forwarded: dict[str, str] | None = None) -> dict:
        """Start `command` with this node's environment plus `forwarded` (the driver's variables the loop's
        processes need wherever they run: `forwarded_environment`); returns where it runs (node id and address,
        the GPU ids it sees, its pid)."""
        gpus = ",".join(str(g) for g in ray.get_gpu_ids())
        env = {**os.environ, **(forwarded or {}), "CUDA_VISIBLE_DEVICES": gpus}
        with self.lock:
            if self.stopped:
                raise RuntimeError(f"stopped before it started: {shlex.join(command)}")
            self.process = start_session(command, Path(log_path), env, cwd=Path(cwd))
        return {"node": ray.get_runtime_context().get_node_id(), "address": ray.util.get_node_ip_address(),
                "gpus": gpus, "pid": self.process.pid}

    def wait(self) -> int:
        return self.process.wait()

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self, grace_s: float) -> int | None:
        """Stop the process and everything in its session (and any later `start`); its exit status."""
        with self.lock:
            self.stopped = True
            process = self.process
        if process is None:
            return None
        stop_session(process, grace_s)
        return process.returncode


def forwarded_environment(extra: Sequence[str] = ()) -> dict[str, str]:
    """This process's values of the variables the loop's processes on other nodes need too (`processes.FORWARDED`:
    the retrieval service's API key, the keys of step servers) and of `extra`, those that are set."""
    return {name: os.environ[name] for name in (*sorted(FORWARDED), *extra) if os.environ.get(name)}


def connect(address: str) -> None:
    """Join the Ray cluster at `address` (``auto``: the one this node belongs to, or ``$RAY_ADDRESS``), once. The
    loop keeps its own signal handling (`processes.signals_stop_children`): ray.init's SIGTERM handler is undone."""
    if not ray.is_initialized():
        with signal_handlers_kept():
            ray.init(address=address, log_to_driver=False)


def free_gpus() -> float:
    """GPUs free in the whole cluster now."""
    return float(ray.available_resources().get("GPU", 0.0))


def shard_count(configured: int, gpus_per_shard: float, what: str) -> int:
    """`configured`, or (0) as many shards as the cluster's free GPUs hold at `gpus_per_shard` each."""
    if configured:
        return configured
    if gpus_per_shard <= 0:
        raise ValueError(f"loop.ray: {what} shards of 0 GPUs cannot be counted from the cluster's GPUs; give "
                         f"loop.ray.{what}_shards")
    count = int(free_gpus() // gpus_per_shard)
    if count < 1:
        raise RuntimeError(f"loop.ray: the cluster has {free_gpus():g} free GPUs, fewer than one {what} shard needs "
                           f"({gpus_per_shard:g}); free some, or give loop.ray.{what}_shards")
    return count


#: Seconds one wait on Ray blocks at most: the loop's signal handlers (`processes.signals_stop_children`) run only
#: between Python bytecodes, so a wait that blocked until its shards end would hold a SIGTERM until then.
_WAIT_SLICE_S = 1.0


def _next_ready(refs: list):
    """The first of `refs` ready within one wait slice, or None. A signal handler that raises while Ray's wait runs
    (`processes.LoopSignal`, KeyboardInterrupt) reaches Ray's compiled wait, which wraps it in a SystemError: the
    signal's exception is raised again as itself."""
    try:
        ready, _ = ray.wait(refs, num_returns=1, timeout=_WAIT_SLICE_S)
    except SystemError as error:
        cause = error.__cause__ or error.__context__
        if isinstance(cause, BaseException) and not isinstance(cause, Exception):
            raise cause from None
        raise
    return ready[0] if ready else None


def _get(ref, timeout_s: float):
    """`ray.get(ref)` within `timeout_s`, waiting in slices (signals stay served); GetTimeoutError past it."""
    deadline = time.monotonic() + timeout_s
    while _next_ready([ref]) is None:
        if time.monotonic() > deadline:
            raise ray.exceptions.GetTimeoutError(f"not ready within {timeout_s:.0f} s")
    return ray.get(ref)


def _actor(gpus: float, cpus: float):
    return ProcessActor.options(num_gpus=gpus, num_cpus=cpus, max_concurrency=4).remote()


def _stop(actors: Sequence) -> list[int | None]:
    """Stop each actor's process session, then the actor (whatever state it is in: one already gone has nothing
    left to stop); the processes' exit statuses (None where unknown)."""
    pending = {actor: actor.stop.remote(_STOP_GRACE_S) for actor in actors}
    statuses: list[int | None] = []
    for actor, stopped in pending.items():
        statuses.append(None)
        try:
            statuses[-1] = ray.get(stopped, timeout=_STOP_GRACE_S + 30)
        except ray.exceptions.RayActorError:
            pass  # the actor (or its node) is gone, and its session with it
        except ray.exceptions.GetTimeoutError:
            log.warning("a Ray actor of the loop did not stop its process within %.0f s; killing the actor",
                        _STOP_GRACE_S + 30)
        ray.kill(actor)
    return statuses


def run_on_ray(commands: Sequence[Sequence[str]], gpus: float, cpus: float, log_dir: Path, what: str,
               numbers: Sequence[int] | None = None) -> list[dict]:
    """Run every command as a Ray actor asking for `gpus` GPUs and `cpus` CPUs, each logging to
    ``log_dir/WHAT-NUMBER.log``, and wait for all; returns where each ran. Those the cluster has no room for yet
    start as earlier ones finish (a finished process's actor is killed at once, giving its GPUs back). As
    `processes.run_on_devices`: raises naming every failed process (or lost actor) and its log; stops them all
    when a start fails or on a signal."""
    numbers = list(range(len(commands))) if numbers is None else list(numbers)
    logs = [Path(log_dir) / f"{what}-{number}.log" for number in numbers]
    for path in logs:
        path.parent.mkdir(parents=True, exist_ok=True)
    actors = [_actor(gpus, cpus) for _ in commands]
    starts = {actor.start.remote(list(map(str, command)), str(path), os.getcwd(), forwarded_environment()): k
              for k, (actor, command, path) in enumerate(zip(actors, commands, logs))}
    waits: dict = {}
    places: list[dict] = [{} for _ in commands]
    outcomes: list[int | str] = [0 for _ in commands]
    try:
        while starts or waits:
            ready = _next_ready([*starts, *waits])
            if ready is None:
                continue
            if ready in starts:
                k = starts.pop(ready)
                places[k] = place = ray.get(ready)
                print(f"{what} {numbers[k]} on node {place['address']} ({place['node'][:8]}), GPUs "
                      f"{place['gpus'] or 'none'}: {shlex.join(map(str, commands[k]))} (log {logs[k]})", flush=True)
                waits[actors[k].wait.remote()] = k
                continue
            k = waits.pop(ready)
            try:
                outcomes[k] = ray.get(ready)
            except ray.exceptions.RayActorError as error:
                outcomes[k] = f"lost its Ray actor ({type(error).__name__}: {str(error).splitlines()[0]})"
            ray.kill(actors[k])  # its GPUs go back to the cluster
    finally:
        _stop(actors)
    failed = [k for k, outcome in enumerate(outcomes) if outcome != 0]
    if failed:
        detail = "\n".join(f"--- {what} {numbers[k]} " + (f"exited with status {outcomes[k]}"
                                                          if isinstance(outcomes[k], int) else outcomes[k])
                           + f" ({logs[k]}):\n{log_tail(logs[k])}" for k in failed)
        raise RuntimeError(f"{len(failed)} of {len(commands)} {what} processes failed; run the loop again to "
                           f"continue them\n{detail}")
    return places


@dataclass
class RayServer:
    """A step server (``loop.step_servers.NAME``) run by a Ray actor on whichever node has its GPUs free."""

    actor: object
    place: dict

    @classmethod
    def start(cls, command: Sequence[str], log_path: Path, gpus: float, cpus: float, timeout_s: float,
              what: str, forward: Sequence[str] = ()) -> RayServer:
        """Wait (up to `timeout_s`) for Ray to place the server's actor, then start the server there, with this
        process's values of the variables `forward` names (its API key) and of `processes.FORWARDED`."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        actor = _actor(gpus, cpus)
        try:
            place = _get(actor.start.remote(list(map(str, command)), str(log_path), os.getcwd(),
                                            forwarded_environment(forward)), timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            raise TimeoutError(f"{what}: no node of the Ray cluster had {gpus:g} free GPUs and {cpus:g} CPUs within "
                               f"{timeout_s:.0f} s (free now: {free_gpus():g} GPUs in the cluster)") from None
        except BaseException:
            _stop([actor])
            raise
        return cls(actor, place)

    @property
    def address(self) -> str:
        """The node it runs on."""
        return self.place["address"]

    def poll(self) -> int | None:
        try:
            return ray.get(self.actor.poll.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            return -1

    def stop(self) -> int | None:
        return _stop([self.actor])[0]


_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0", ""}


def reachable_url(url: str, address: str) -> str:
    """`url` with a loopback (or wildcard) host replaced by `address`, the node the server runs on."""
    parts = urlsplit(url)
    if parts.hostname not in _LOOPBACK:
        return url
    netloc = address + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def node_address() -> str:
    """This node's address as the cluster sees it (Ray's node IP when connected, else the host's own)."""
    if ray.is_initialized():
        return ray.util.get_node_ip_address()
    return socket.gethostbyname(socket.gethostname())
