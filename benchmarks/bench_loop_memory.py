"""Where the co-training loop's memory goes, step by step: the loop run in this process with a sampler thread.

    python benchmarks/bench_loop_memory.py --config configs/loop_quickstart.yaml --out runs/bench_loop_memory \
        [--alone mining] [-- --iterations 1 ...]

Every half second the sampler reads this process's resident set (``/proc/self/smaps_rollup``: RSS, anonymous),
glibc's heap (``mallinfo2``: bytes in use, bytes free but kept, bytes in mmapped chunks) and its thread count;
every 20 s it also counts the live torch tensors (unique storages, bytes). Each sample is labelled with the loop
step running (`agentic_retriever.app.loop.runner._Loop.step`). The table printed at the end gives each step's peak;
``--alone`` (default: mining) then runs those steps of the last iteration again, each in a fresh process of its own
(the same inputs and settings, a scratch folder), so each peak stands beside the same step with nothing before it.
The timeline is appended to ``OUT/memory_timeline.jsonl`` (a resumed loop adds to it) and plotted as
``OUT/memory_timeline.png``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from _common import REPO_ROOT, cpu_model, usable_cores

GIB = 1024 ** 3


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    name = ctypes.util.find_library("c")
    try:
        call = ctypes.CDLL(name).mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    call.restype = _MallInfo2
    return call


def rollup() -> dict[str, int]:
    """RSS and its anonymous part, in bytes, from ``/proc/self/smaps_rollup``."""
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Anonymous"):
            out[key.lower()] = int(rest.split()[0]) * 1024
    return out


def live_tensors() -> tuple[int, int]:
    """(unique storages, their bytes) of the torch tensors reachable from Python."""
    import torch

    seen: dict[int, int] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on deprecated module attributes warns
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                    storage = obj.untyped_storage()
                    seen[storage.data_ptr()] = storage.nbytes()
            except Exception:  # noqa: BLE001 - a tensor subclass or meta tensor without a storage
                continue
    return len(seen), sum(seen.values())


class Sampler(threading.Thread):
    """Samples this process's memory into `path` (one JSON line each) until `stop`."""

    def __init__(self, path: Path, period_s: float = 0.5, census_s: float = 20.0):
        super().__init__(daemon=True)
        self.path, self.period_s, self.census_s = path, period_s, census_s
        self.label = "start"
        self.halt = threading.Event()
        self.mallinfo = _mallinfo2()

    def sample(self, census: bool) -> dict:
        row = {"t": round(time.time(), 2), "step": self.label, **rollup(),
               "threads": len(os.listdir("/proc/self/task"))}
        if self.mallinfo is not None:
            info = self.mallinfo()
            row |= {"heap_in_use": info.uordblks, "heap_free_kept": info.fordblks, "mmapped": info.hblkhd}
        if census:
            row["tensors"], row["tensor_bytes"] = live_tensors()
        return row

    def run(self) -> None:
        last_census = 0.0
        with self.path.open("a") as out:
            while not self.halt.is_set():
                census = time.monotonic() - last_census >= self.census_s
                if census:
                    last_census = time.monotonic()
                out.write(json.dumps(self.sample(census)) + "\n")
                out.flush()
                self.halt.wait(self.period_s)


def peaks(path: Path) -> dict[str, dict]:
    """Each step's peak of every sampled figure, in the order the steps first appear."""
    table: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        entry = table.setdefault(row["step"], {})
        for key, value in row.items():
            if key not in ("t", "step"):
                entry[key] = max(entry.get(key, 0), value)
    return table


def labelled_loop(sampler: Sampler) -> None:
    """Make every loop step set the sampler's label while it runs."""
    from agentic_retriever.app.loop import runner

    original = runner._Loop.step

    def step(self, iteration, name, *args, **kwargs):
        sampler.label = f"{iteration}:{name}"
        try:
            return original(self, iteration, name, *args, **kwargs)
        finally:
            sampler.label = "between steps"

    runner._Loop.step = step


def run_loop_here(config: str, out: Path, overrides: list[str]) -> Path:
    from agentic_retriever.app.cli import main

    out.mkdir(parents=True, exist_ok=True)
    timeline = out / "memory_timeline.jsonl"

    sampler = Sampler(timeline)
    labelled_loop(sampler)
    sampler.start()
    try:
        status = main(["loop", "--config", config, *overrides])
    finally:
        sampler.halt.set()
        sampler.join()
    if status:
        raise SystemExit(f"the loop exited with status {status}; the timeline so far is in {timeline}")
    return timeline


def print_table(title: str, table: dict[str, dict]) -> None:
    print(f"\n{title}")
    print("| step | peak RSS GiB | peak anonymous GiB | heap in use GiB | heap free, kept GiB | mmapped GiB | "
          "live tensors GiB | threads |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for step, e in table.items():
        print(f"| {step} | {e.get('rss', 0) / GIB:.2f} | {e.get('anonymous', 0) / GIB:.2f} | "
              f"{e.get('heap_in_use', 0) / GIB:.2f} | {e.get('heap_free_kept', 0) / GIB:.2f} | "
              f"{e.get('mmapped', 0) / GIB:.2f} | {e.get('tensor_bytes', 0) / GIB:.2f} | {e.get('threads', 0)} |")


def plot(timeline: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in timeline.read_text().splitlines()]
    if not rows:
        return
    t0 = rows[0]["t"]
    minutes = [(r["t"] - t0) / 60 for r in rows]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for key, name in (("rss", "RSS"), ("heap_in_use", "heap in use"),
                      ("heap_free_kept", "heap free (held by glibc, resident or not)")):
        ax.plot(minutes, [r.get(key, 0) / GIB for r in rows], label=name, linewidth=1)
    census = [(m, r["tensor_bytes"] / GIB) for m, r in zip(minutes, rows) if "tensor_bytes" in r]
    if census:
        ax.plot(*zip(*census), "k.", markersize=3, label="live tensors")
    start = None
    for m, r in zip(minutes, rows):
        if r["step"] != start:
            start = r["step"]
            ax.axvline(m, color="grey", linewidth=0.4)
            ax.text(m, ax.get_ylim()[1] * 0.98, start, rotation=90, va="top", fontsize=6)
    ax.set_xlabel("minutes")
    ax.set_ylabel("GiB")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"loop memory by step ({cpu_model()}, {usable_cores()} cores)")
    fig.tight_layout()
    fig.savefig(timeline.with_suffix(".png"), dpi=130)


def alone_commands(config: str, loop_folder: Path, scratch: Path) -> dict[str, list[str]]:
    """The commands that run a step of the loop's last iteration alone, on the inputs the loop gave it (read from
    ``loop.json``): mining (``mine run`` on the iteration's trajectories with its agent, searching the base index
    in its own process, as `mine run` runs by hand)."""
    from agentic_retriever.app.loop import LoopManifest

    manifest = LoopManifest.load(loop_folder)
    last = max(int(name.split("/")[0]) for name in manifest.steps)
    agent, rollouts = manifest.get(last, "agent"), manifest.get(last, "trajectories")
    cli = [sys.executable, "-m", "agentic_retriever.app.cli"]
    commands = {}
    if agent and rollouts and agent.status == rollouts.status == "done":
        commands["mining"] = [*cli, "mine", "run", "--config", config, "--trajectories",
                              rollouts.summary["trajectories"], "--agent.model", agent.summary["model"],
                              "--out", str(scratch / "mining")]
    return commands


def peak_alone(command: list[str], log: Path) -> float:
    """The peak RSS (GiB) of `command` run in a fresh process (its ``ru_maxrss``, from ``wait4``)."""
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise RuntimeError(f"{' '.join(command)} failed (status {status}); see {log}")
    return usage.ru_maxrss / 2 ** 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "loop_quickstart.yaml"))
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "bench_loop_memory")
    parser.add_argument("--alone", default="mining", help="steps to run again alone, comma-separated ('' for none)")
    parser.add_argument("--loop-folder", type=Path, default=REPO_ROOT / "runs" / "quickstart" / "loop")
    parser.add_argument("overrides", nargs="*", help="flags for `agentic-retriever loop` (after --)")
    args = parser.parse_args()
    print(f"device: {cpu_model()}, {usable_cores()} cores", flush=True)
    timeline = run_loop_here(args.config, args.out, args.overrides)
    table = peaks(timeline)
    print_table("the loop, one process (peak per step)", table)
    plot(timeline)
    commands = alone_commands(args.config, args.loop_folder, args.out / "alone")
    for step in filter(None, args.alone.split(",")):
        if step not in commands:
            print(f"{step}: no command to run it alone (known: {', '.join(commands) or 'none yet'})")
            continue
        in_loop = max((e["rss"] for name, e in table.items() if name.endswith(f":{step}")), default=0) / GIB
        alone = peak_alone(commands[step], args.out / f"alone-{step}.log")
        print(f"{step}: peak RSS {in_loop:.2f} GiB in the loop's process, {alone:.2f} GiB alone "
              f"({in_loop / alone:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
