"""Helpers shared by the benchmark scripts: device description, timing, passages, JSON output.

Not a benchmark itself (run_all.py only runs ``bench_*.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
QUICKSTART_CORPUS = REPO_ROOT / "runs" / "quickstart" / "data" / "corpus.jsonl"

if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))


# --------------------------------------------------------------------------------------------- device
from agentic_retriever.base.machine import cpu_model, usable_cores  # noqa: E402  (after the path is set)


def free_port() -> int:
    """A loopback port free at the time of asking (for a server a benchmark starts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gpu_names() -> list[str]:
    """Names of the CUDA GPUs torch sees (empty without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def describe_device() -> dict:
    return {
        "cpu": cpu_model(),
        "cpu_cores_total": os.cpu_count(),
        "cpu_cores_usable": usable_cores(),
        "gpus": gpu_names(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def device_line(device: dict) -> str:
    gpus = ", ".join(device["gpus"]) or "none"
    return (f"device: {device['cpu']} ({device['cpu_cores_usable']} usable of {device['cpu_cores_total']} cores); "
            f"GPU: {gpus}")


# --------------------------------------------------------------------------------------------- timing

def alternate(runs: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run each callable `warmup` times untimed, then `repeats` rounds of A B (C ...) in turn, so a noisy
    neighbour slows every contender alike. Returns the wall-clock seconds of each timed run, by name."""
    for _ in range(warmup):
        for fn in runs.values():
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            started = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def summarize(seconds: list[float], items: int) -> dict:
    """Best and median seconds of a list of timed runs over `items` things, with the rates."""
    best, median = min(seconds), statistics.median(seconds)
    return {"seconds": [round(s, 6) for s in seconds], "best_s": best, "median_s": median,
            "best_per_s": items / best, "median_per_s": items / median}


# --------------------------------------------------------------------------------------------- passages

_WORDS = (
    "the of and in to was is for on as by with his at from that it an were which are this be also first had "
    "has their its after new other one two three year years city state school born team film during between "
    "university national world war american series album season including known called since under later "
    "united government music population river history number century county church during league club game "
    "played public north south early member group system released company village town area party second "
    "family station career while based began located several district became title army record early single "
    "book work used time would most against many final river island king house built named founded original "
    "championship president french german english british general local published people began following"
).split()


def random_unit_vectors(rows: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """`rows` random float32 vectors of unit length: embeddings without structure (the hard case for HNSW)."""
    vectors = rng.standard_normal((rows, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def synthetic_passages(count: int, words: int = 100, seed: int = 0) -> list[str]:
    """Search-R1 style ``"Title"\\ntext`` passages of about `words` words from a common-English vocabulary."""
    rng = random.Random(seed)
    passages = []
    for _ in range(count):
        title = " ".join(w.capitalize() for w in rng.sample(_WORDS, rng.randint(1, 3)))
        sentences, total = [], 0
        while total < words:
            length = rng.randint(8, 22)
            sentence = " ".join(rng.choice(_WORDS) for _ in range(length))
            sentences.append(sentence[0].upper() + sentence[1:] + ".")
            total += length
        passages.append(f'"{title}"\n' + " ".join(sentences))
    return passages


def load_passages(count: int, corpus: str | None = None, seed: int = 0) -> tuple[list[str], str]:
    """`count` passage ``contents``: from `corpus` (default: the quickstart corpus when it exists), cycled
    if the corpus is shorter; otherwise synthetic ~100-word passages. Returns (passages, source)."""
    path = Path(corpus) if corpus else QUICKSTART_CORPUS
    if corpus is None and not path.is_file():
        return synthetic_passages(count, seed=seed), f"synthetic ~100-word passages (no {QUICKSTART_CORPUS})"
    from agentic_retriever.base.corpus import Corpus

    with tempfile.TemporaryDirectory(prefix="bench-corpus-cache-") as cache:
        opened = Corpus.open(path, cache_dir=cache)
        rows = len(opened)
        texts: list[str] = []
        for batch in opened.iter_contents(0, min(count, rows)):
            texts.extend(batch)
        del opened
    if len(texts) < count:
        texts = [texts[i % len(texts)] for i in range(count)]
        return texts, f"{path} ({rows} rows, cycled to {count})"
    return texts, f"{path} (first {count} of {rows} rows)"


# --------------------------------------------------------------------------------------------- memory

class PeakSampler(threading.Thread):
    """Polls /proc/self/status for the resident anonymous and file-backed memory, keeping the peaks."""

    def __init__(self, interval: float = 0.01):
        super().__init__(daemon=True)
        self.interval, self.stopped = interval, threading.Event()
        self.peaks = {"RssAnon": 0, "RssFile": 0, "VmHWM": 0}
        self.available = Path("/proc/self/status").is_file()

    def sample(self) -> None:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in self.peaks:
                self.peaks[key] = max(self.peaks[key], int(value.split()[0]) * 1024)

    def run(self) -> None:
        while self.available and not self.stopped.wait(self.interval):
            self.sample()

    def stop(self) -> dict:
        self.stopped.set()
        self.join()
        if self.available:
            self.sample()
        return self.peaks if self.available else {}


def ru_maxrss_bytes() -> int:
    """getrusage's peak RSS. On Linux it is at least the parent's RSS at fork time (the high-water mark
    survives exec), so the child prefers VmHWM, the peak of its own address space."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


# --------------------------------------------------------------------------------------------- output

def base_parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(description or "").strip().splitlines()[0] if description else None,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON to this file")
    return parser


def write_json(path: str | None, benchmark: str, args: argparse.Namespace, device: dict, results: dict) -> None:
    if not path:
        return
    payload = {"benchmark": benchmark, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": device,
               "args": {k: v for k, v in vars(args).items() if k != "json"}, "results": results}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"figures written to {out}")


def fmt_bytes(count: float) -> str:
    sign = "-" if count < 0 else ""
    count = abs(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{sign}{count:.1f} {unit}" if unit != "B" else f"{sign}{count:.0f} B"
        count /= 1024
    return f"{sign}{count:.1f} GiB"


# --------------------------------------------------------------------------------------------- worker processes

def start_worker(script: str, name: str, args: dict, threads: int, log: Path) -> subprocess.Popen:
    """Run ``script --worker NAME ARGS_JSON`` in its own process with `threads` torch/OpenMP threads (runs that
    must not share a process, or that run side by side), stderr to `log`; `finish_worker` reads its result."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(log, "w") as stderr:
        return subprocess.Popen([sys.executable, script, "--worker", name, json.dumps(args)], cwd=REPO_ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=stderr, text=True)


def serve_worker(worker: Callable[[str, dict], dict]) -> bool:
    """In a process `start_worker` started (``script --worker NAME ARGS_JSON``): print ``worker(NAME, ARGS)`` as
    JSON for `finish_worker` and return True; in the benchmark's own process return False."""
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], json.loads(sys.argv[3]))))
        return True
    return False


def finish_worker(proc: subprocess.Popen, name: str, log: Path) -> dict:
    """Wait for a `start_worker` process and return the JSON it printed last; RuntimeError naming its log."""
    stdout, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"run {name} failed (exit {proc.returncode}): see {log}")
    return json.loads(stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------- RL runs

def start_rl_bench(args: argparse.Namespace, warm_start: Callable[[argparse.Namespace], str]) -> tuple[dict, Path, str]:
    """What every RL benchmark does first: print the device, make its work folder, warm-start the agent (timed).
    Returns (device, work folder, warm-started model)."""
    print(device_line(device := describe_device()))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model = warm_start(args)
    print(f"warm start: {model} ({time.perf_counter() - started:.0f} s)")
    return device, work, model


def threads_per_run(runs, one_at_a_time: bool, threads: int | None = None) -> int:
    """Torch threads of each of `runs`: `threads` when given (a run beside other work), else every usable core when
    they run one after the other, a share side by side."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        return threads
    return max(1, (os.cpu_count() or 1) // (1 if one_at_a_time else len(runs)))


def run_workers(script: str, names, args_of, threads: int, work: Path, one_at_a_time: bool = False) -> dict:
    """Run ``script --worker NAME ARGS`` for each of `names` (ARGS: ``args_of(name)``) with `threads` threads each,
    side by side (or one after the other), each from an empty ``work/NAME`` (removed first), stderr to
    ``work/NAME.log``; returns each worker's result by name."""
    for name in names:
        shutil.rmtree(work / name, ignore_errors=True)

    def start(name: str) -> subprocess.Popen:
        return start_worker(script, name, args_of(name), threads, work / f"{name}.log")
    if one_at_a_time:
        return {name: finish_worker(start(name), name, work / f"{name}.log") for name in names}
    procs = {name: start(name) for name in names}
    return {name: finish_worker(proc, name, work / f"{name}.log") for name, proc in procs.items()}


def add_rl_bench_arguments(parser: argparse.ArgumentParser, *, name: str, config: str, heldout: str, runs,
                           eval_samples: int, actor_lr: float) -> None:
    """The arguments of the RL benchmarks that warm-start the agent, train side-by-side runs on the train leaves
    the warm start held out and evaluate on held-out questions (`name`: the folder under runs/quickstart)."""
    data = REPO_ROOT / "runs" / "quickstart" / "data"
    parser.add_argument("--config", default=config)
    parser.add_argument("--sft-config", default="configs/quickstart.yaml", help="config of the warm start")
    parser.add_argument("--index", default="runs/quickstart/index/minilm-flat")
    parser.add_argument("--train", default=str(data / "fanoutqa_leaf_train_mining.jsonl"),
                        help="RL questions (default: the train leaves the warm start held out)")
    parser.add_argument("--heldout", default=str(data / heldout), help="held-out questions (evaluation only)")
    parser.add_argument("--eval-samples", type=int, default=eval_samples)
    parser.add_argument("--actor-lr", type=float, default=actor_lr,
                        help="policy learning rate of every run (a handful of CPU steps must move the policy)")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--runs", nargs="+", default=list(runs), choices=list(runs))
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="run the runs one after the other with every core (half the peak memory)")
    parser.add_argument("--threads", type=int, help="torch threads per run (default: the cores shared among the runs)")
    parser.add_argument("--work", default=str(REPO_ROOT / "runs" / "quickstart" / name))
    parser.add_argument("--figures", default=str(REPO_ROOT / "benchmarks" / "figures"))


def check_parser(doc: str, out: str, steps: dict, default_steps: str, steps_help: str,
                 agent_help: str) -> argparse.ArgumentParser:
    """The arguments every check script takes: ``--out``, ``--step`` (one step in this process, internal),
    ``--steps`` and ``--agent``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", default=out)
    parser.add_argument("--step", choices=sorted(steps), help="run one step in this process (internal)")
    parser.add_argument("--steps", default=default_steps, help=steps_help)
    parser.add_argument("--agent", default="", help=agent_help)
    return parser


def enter_check(args: argparse.Namespace, agent_env: str, functions: dict) -> Path | None:
    """A check's output folder (made), or None when this process was asked for one step (``--step NAME``): that
    step, ``functions["step_NAME"]``, has then run here and its result is in ``OUT/step_NAME.json``, which the parent
    reads (`run_check_step`). ``--agent`` reaches the step processes through the environment variable `agent_env`."""
    if args.agent:
        os.environ[agent_env] = str(Path(args.agent).resolve())  # the step processes inherit it
    out = Path(args.out).resolve()
    if args.step:
        result = functions[f"step_{args.step}"](out)
        (out / f"step_{args.step}.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
        return None
    out.mkdir(parents=True, exist_ok=True)
    return out


def earlier_steps(out: Path) -> dict:
    """The step results of an earlier run in `out` (``results.json``), so that ``--steps`` redoes only some."""
    earlier = out / "results.json"
    return json.loads(earlier.read_text())["steps"] if earlier.is_file() else {}


def run_check_steps(script: str, names, steps: dict[str, float], out: Path, results: dict,
                    markdown: Callable[[dict], str]) -> dict:
    """Run each step of `names` in its own process (`run_check_step`, `steps` giving each one's timeout), keep its
    result in ``results["steps"]``, then write ``results.json`` and ``results.md`` to `out` and print the table."""
    for name in names:
        print(f"step {name} ...", flush=True)
        results["steps"][name] = run_check_step(script, name, out, steps[name])
        print(json.dumps(results["steps"][name]), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    table = markdown(results)
    (out / "results.md").write_text(table, encoding="utf-8")
    print(table)
    return results


def run_check_step(script: str, name: str, out: Path, timeout_s: float) -> dict:
    """Step `name` of a check script (`vllm_check.py`, `verl_check.py`) in its own process, run as
    ``python SCRIPT --out OUT --step NAME``, which writes ``OUT/step_NAME.json``; a hung step is killed at
    `timeout_s`. Its output goes to ``OUT/step_NAME.log``; a failure comes back as ``{"ok": False, "error": ...}``
    with the last lines, and every result with its ``seconds``."""
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, script, "--out", str(out), "--step", name], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout_s} s", "seconds": timeout_s}
    (out / f"step_{name}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    seconds = round(time.perf_counter() - started, 1)
    result_file = out / f"step_{name}.json"
    if done.returncode != 0 or not result_file.is_file():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        return {"ok": False, "error": f"exit {done.returncode}: {tail}", "seconds": seconds}
    return json.loads(result_file.read_text()) | {"seconds": seconds}

