"""Where the shards of a step run, under either ``loop.placement``: ``local``, one process per entry of
``loop.rollout_devices`` / ``loop.mining_devices`` on this node (`processes.run_on_devices`); ``ray``, as many Ray
actors as ``loop.ray`` gives or the cluster's free GPUs hold, placed by Ray (`ray_placement`).

    n = shard_count(job.loop, "mining", out)       # 0: the step runs in the loop's process
    run_shards(job.loop, "mining", commands, numbers, out / "logs", "mining")
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from agentic_retriever.base.jsonl import atomic_write
from .config import LoopConfig
from .processes import run_on_devices

__all__ = ["connect_cluster", "run_shards", "shard_count"]

Kind = Literal["rollout", "mining"]


def _devices(loop: LoopConfig, kind: Kind) -> list[str]:
    return loop.rollout_devices if kind == "rollout" else loop.mining_devices


def connect_cluster(loop: LoopConfig) -> None:
    """Join the Ray cluster of ``loop.ray.address`` when the placement is ``ray`` (once); nothing otherwise."""
    if loop.placement == "ray":
        from . import ray_placement

        ray_placement.connect(loop.ray.address)


def shard_count(loop: LoopConfig, kind: Kind, folder: Path, label: str | None = None) -> int:
    """How many processes run the `kind` shards of the step writing `folder` (0: none, the loop's process does the
    work). Under Ray a count taken from the cluster is written to ``folder/LABEL.shards.json`` the first time, so a
    rerun continues the same shards whatever the cluster has free then."""
    if loop.placement == "local":
        return len(_devices(loop, kind))
    from . import ray_placement

    connect_cluster(loop)
    record = Path(folder) / f"{label or kind}.shards.json"
    if record.is_file():
        return int(json.loads(record.read_text())["shards"])
    configured = loop.ray.rollout_shards if kind == "rollout" else loop.ray.mining_shards
    count = ray_placement.shard_count(configured, loop.ray.gpus_per_shard, kind)
    record.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(record) as handle:
        handle.write(json.dumps({"shards": count, "gpus_per_shard": loop.ray.gpus_per_shard}) + "\n")
    return count


def run_shards(loop: LoopConfig, kind: Kind, commands: Sequence[Sequence[str]], numbers: Sequence[int],
               log_dir: Path, what: str) -> None:
    """Run the shards `numbers` (their `commands`) at once and wait for them all (errors as `run_on_devices`)."""
    if loop.placement == "local":
        devices = _devices(loop, kind)
        run_on_devices(commands, [devices[i] for i in numbers], log_dir, what, numbers=numbers)
        return
    from . import ray_placement

    connect_cluster(loop)
    ray_placement.run_on_ray(commands, loop.ray.gpus_per_shard, loop.ray.cpus_per_process, log_dir, what, numbers)
