"""The GPU check: the test suite with CUDA visible and the GPU benchmarks, one command, on a host with no network.

    python benchmarks/checks/gpu_check.py bundle gpu_bundle --wheels       # here, where the project is installed
    python3 benchmarks/checks/gpu_check.py run --bundle gpu_bundle          # on the GPU host (make gpu-check)
    python benchmarks/checks/gpu_check.py run --bundle gpu_bundle --device cpu --tiny   # the dry run (the test suite's)

``bundle`` writes what a bare GPU host lacks (`gpu_bundle.write_bundle`: weightless offline defaults, the agent's
config and tokenizer, and with ``--wheels`` about 25 MB of wheels); carry it with the checkout. ``run`` installs
the wheels it finds (``pip install --no-index --no-deps``), builds the stand-ins and models of the real shapes with
random weights (`gpu_bundle.materialize`), then runs each step in a process of its own, with a time limit per step
and an overall deadline (``--deadline-s``, 480 by default: the check is sized to finish in 8 minutes on one H100):

* ``tests``: ``pytest -m "not slow"`` with CUDA visible (counts and failing tests from its JUnit XML);
* ``encode``: `bench_encode` (ours against ``SentenceTransformer.encode`` at the same precision);
* ``train``: `bench_train` (ours against sentence-transformers' trainer after a warm-up run, alternating);
* ``rollout``: `bench_rollout` (batched and one at a time, with and without the prefix cache, alternating);
* ``gac``: `bench_gac` (GAC continuations: context reuse and prefix cache against recomputing);
* ``rl``: one GRPO step of ``configs/search_r1_quickstart.yaml`` with the random-weight agent (`rl_step`);
* ``index``: a flat index built over synthetic passages with the encoder (`index_build`);
* ``decoder_train``: `bench_train --lora-only` on a decoder embedder of Qwen3-Embedding-0.6B's shape with random
  weights: full fine-tuning against LoRA r=16, in bf16 (updates/s, peak CUDA memory, trainable parameters);
* ``decoder_index``: a flat index built with that embedder in bf16 (passages/s).

It writes ``OUT/gpu_check.json`` (every step's status, seconds and figures, the device, the stand-ins used) and
``OUT/gpu_check.md`` (one table), and each benchmark's own JSON and log beside them. Every benchmark measures with a
warm-up and alternates its contenders in the same process, as `bench_*.py` always do.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common (a check runs as a script)
from _common import REPO_ROOT, describe_device, device_line, synthetic_passages
from gpu_bundle import materialize, write_bundle

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
STEPS = ("install", "tests", "encode", "train", "rollout", "gac", "rl", "index", "decoder_train", "decoder_index")
#: Per step: (sizes of the real check, sizes of the tiny dry run), as command-line arguments of its script. A
#: random-weight agent never stops early: every turn runs to its token budget, and the one-at-a-time rollouts
#: decode questions x turns x tokens steps, about 30 ms each on an H100 (32 x 4 x 128, then 8 x 2 x 64, ran past
#: the step's limit there). Each training run is a process of its own, about 35 s there with its start.
SIZES = {
    "encode": (["--passages", "2048", "--queries", "200", "--repeats", "5"],
               ["--passages", "16", "--queries", "4", "--repeats", "2"]),
    "train": (["--batch", "32", "--negatives", "7", "--max-length", "128", "--steps", "30", "--repeats", "2"],
              ["--batch", "4", "--negatives", "3", "--max-length", "32", "--steps", "2", "--repeats", "1"]),
    "rollout": (["--questions", "4", "--batch-size", "4", "--max-new-tokens", "32", "--max-turns", "2",
                 "--repeats", "2"],
                ["--questions", "2", "--batch-size", "2", "--max-new-tokens", "4", "--max-turns", "2",
                 "--repeats", "1"]),
    "gac": (["--rounds", "4", "--candidates", "10", "--max-new-tokens", "32", "--repeats", "2"],
            ["--rounds", "1", "--candidates", "2", "--max-new-tokens", "4", "--max-turns", "2", "--repeats", "1",
             "--warmup", "0", "--think-words", "8"]),
    "rl": (["--questions", "16"], ["--questions", "2", "--max-new-tokens", "4"]),
    "index": ([], []),  # the corpus the check writes: INDEX_PASSAGES
    # two processes (full, then LoRA), each loading 0.6B random weights
    "decoder_train": (["--lora-only", "--lora-rank", "16", "--lora-precision", "bf16", "--batch", "8", "--negatives",
                       "7", "--max-length", "128", "--steps", "10", "--repeats", "1"],
                      ["--lora-only", "--lora-rank", "4", "--lora-precision", "bf16", "--batch", "2", "--negatives",
                       "1", "--max-length", "32", "--steps", "2", "--repeats", "1"]),
    "decoder_index": (["--precision", "bf16"], ["--precision", "bf16"]),
}
#: Synthetic passages of the corpus every step reads (the index step builds over all of it), real and tiny.
INDEX_PASSAGES = (20_000, 64)
#: Longest each step may take (seconds), within the overall deadline.
STEP_LIMITS = {"install": 120, "tests": 240, "encode": 60, "train": 210, "rollout": 120, "gac": 90, "rl": 90,
               "index": 60, "decoder_train": 150, "decoder_index": 90}


# ------------------------------------------------------------------------------------- the steps' own workers

def rl_step(model: str, corpus: str, questions: int, max_new_tokens: int | None, json_out: str) -> None:
    """One GRPO step of ``configs/search_r1_quickstart.yaml``'s ``agent_train`` with `model`, every search answered
    with the corpus's first passages; its seconds, its phases (the trainer's metrics) and peak CUDA memory."""
    import tempfile

    import torch
    from bench_rollout import FixedPassages

    from agent.rl.config import RLConfig
    from agent.rl.trainer import RLTrainer
    from agentic_retriever.app.config_loader import build_config
    from agentic_retriever.base.qa_sources import QARow

    config = build_config(RLConfig, "agent_train", None, str(REPO_ROOT / "configs" / "search_r1_quickstart.yaml"))
    rows = [QARow(f"q{i}", f"Which river runs through city number {i}?", (f"river {i}",)) for i in range(questions)]
    with tempfile.TemporaryDirectory() as out:
        config.agent.model, config.out, config.steps, config.progress = model, out, 1, False
        config.qa, config.report_to, config.prompts_per_step = "in memory", ["none"], min(config.prompts_per_step, questions)
        if max_new_tokens:
            config.env.max_new_tokens_per_turn = max_new_tokens
        trainer = RLTrainer(config, FixedPassages(corpus), rows)
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
        metrics = [json.loads(line) for line in (Path(out) / "metrics.jsonl").open()]
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    _write(json_out, {"step_s": seconds, "metrics": metrics[-1] if metrics else {}, "peak_cuda_mib": peak,
                      "prompts": config.prompts_per_step, "samples_per_prompt": config.samples_per_prompt})


def index_build(model: str, corpus: str, json_out: str, precision: str = "auto") -> None:
    """A flat index of `corpus` built with the encoder at `model` in `precision`: seconds, passages per second of
    the build, and peak CUDA memory."""
    import tempfile

    import torch

    from agentic_retriever.base.encoder import EncoderConfig
    from agentic_retriever.index import IndexBuildConfig, build_index

    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        manifest = build_index(IndexBuildConfig(corpus=corpus, out=f"{out}/index", corpus_cache=f"{out}/cache",
                                                encoder=EncoderConfig(model=model, precision=precision)))
        seconds = time.perf_counter() - started  # with the encoder's loading; the build's own time is the manifest's
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    _write(json_out, {"passages": manifest.rows, "seconds": seconds, "build_seconds": manifest.build_seconds,
                      "passages_per_s": manifest.rows / manifest.build_seconds, "precision": precision,
                      "peak_cuda_mib": peak})


def _write(path: str, figures: dict) -> None:
    Path(path).write_text(json.dumps({"results": figures}, indent=2, default=str) + "\n")


# ------------------------------------------------------------------------------------------------ the check

class Check:
    """One run of the check: its folder, environment, deadline and the record of every step."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.deadline_s
        self.record: dict = {"device": None, "tiny": args.tiny, "stand_ins": [], "steps": {}}
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "AGENTIC_RETRIEVER_CACHE": str(self.out / "cache")}
        if args.device == "cpu":
            self.env["CUDA_VISIBLE_DEVICES"] = ""

    def remaining(self, step: str) -> float:
        return min(STEP_LIMITS[step] * (4 if self.args.device == "cpu" else 1), self.deadline - time.monotonic())

    def run(self, step: str, command: list[str], figures_file: Path | None = None) -> None:
        """Run one step's command in its own process, with its time limit; record its outcome and figures."""
        limit = self.remaining(step)
        if limit <= 0:
            self.record["steps"][step] = {"status": "not run: the deadline had passed", "seconds": 0}
            return
        log = self.out / f"{step}.log"
        started = time.perf_counter()
        try:
            with log.open("w") as handle:
                done = subprocess.run(command, cwd=REPO_ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                                      timeout=limit)
            status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f} s"
        entry = {"status": status, "seconds": round(time.perf_counter() - started, 1), "log": str(log)}
        if figures_file is not None and figures_file.is_file():
            entry["figures"] = json.loads(figures_file.read_text())["results"]
        if status != "ok":
            entry["log_tail"] = log.read_text(errors="replace").splitlines()[-25:]
        self.record["steps"][step] = entry
        print(f"{step:8s} {status} ({entry['seconds']} s)", flush=True)

    def measure(self, step: str, script: list[str], extra: list[str]) -> None:
        """Run `script` (a benchmark, or this file's worker of the step) at the step's sizes, its JSON read back."""
        figures = self.out / f"{step}.json"
        self.run(step, [sys.executable, *script, *SIZES[step][int(self.args.tiny)], *extra, "--json", str(figures)],
                 figures)


def _install(check: Check, bundle: Path) -> None:
    wheels = sorted((bundle / "wheels").glob("*.whl"))
    if not wheels:
        check.record["steps"]["install"] = {"status": "skipped: no wheels in the bundle", "seconds": 0}
        return
    check.run("install", [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                          *map(str, wheels)])


def _tests(check: Check) -> None:
    """The suite with CUDA visible, over ``--test-workers`` pytest-xdist workers where xdist is installed (the
    bundle carries it: one process runs the quick suite in about 4 minutes, past the step's limit)."""
    junit = check.out / "junit.xml"
    importlib.invalidate_caches()  # the install step may just have added xdist
    workers = ["-n", str(check.args.test_workers)] if check.args.test_workers > 1 and importlib.util.find_spec(
        "xdist") else []
    check.run("tests", [sys.executable, "-m", "pytest", *workers, *check.args.pytest_args, "-q", "-p",
                        "no:cacheprovider", "--junitxml", str(junit)])
    if junit.is_file():
        suite = ElementTree.parse(junit).getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                  if case.find("failure") is not None or case.find("error") is not None]
        total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        check.record["steps"]["tests"]["figures"] = {
            "tests": total, "failed": len(failed), "skipped": skipped, "passed": total - len(failed) - skipped,
            "failing": failed[:60]}


def _headline(step: str, figures: dict | None) -> str:
    """The step's main figures, one line for the table."""
    if not figures:
        return ""
    if step == "tests":
        return f"{figures['passed']} passed, {figures['failed']} failed, {figures['skipped']} skipped"
    if step == "encode":
        return (f"ours / sentence-transformers {figures['ratio_median']:.2f}x ({figures['ours_dtype']} both); one "
                f"query per call {figures['one_query_at_a_time']['ratio_median']:.2f}x")
    if step == "train":
        return f"ours / sentence-transformers trainer {figures['ratio']:.2f}x"
    if step in ("rollout", "gac"):
        return "; ".join(f"{label} {value:.2f}x" for label, value in figures.get("ratios", {}).items())
    if step == "rl":
        peak = f", peak {figures['peak_cuda_mib']:.0f} MiB" if figures.get("peak_cuda_mib") else ""
        return f"one step {figures['step_s']:.1f} s{peak}"
    if step in ("index", "decoder_index"):
        return f"{figures['passages_per_s']:.0f} passages/s ({figures['passages']} passages, {figures['precision']})"
    if step == "decoder_train":
        full, lora = (max(runs, key=lambda r: r["updates_per_s"]) for runs in figures["lora"]["runs"].values())
        memory = ", ".join(f"{name} {run['peak_cuda_mib']:.0f} MiB" for name, run in (("full", full), ("LoRA", lora))
                           if run.get("peak_cuda_mib"))
        return (f"full {full['updates_per_s']:.2f}, LoRA {lora['updates_per_s']:.2f} updates/s "
                f"({figures['lora']['speedup']:.2f}x){'; peak ' + memory if memory else ''}")
    return ""


def write_report(check: Check) -> None:
    (check.out / "gpu_check.json").write_text(json.dumps(check.record, indent=2, default=str) + "\n")
    device = check.record["device"]
    lines = [f"# GPU check ({device_line(device)})", "",
             f"Stand-ins (random or zeroed weights of the real shapes): {', '.join(check.record['stand_ins']) or 'none'}"
             f"{'; tiny sizes (a dry run)' if check.record['tiny'] else ''}.", "",
             "| step | status | seconds | figures |", "|---|---|---:|---|"]
    for step, entry in check.record["steps"].items():
        lines.append(f"| {step} | {entry['status']} | {entry['seconds']} | {_headline(step, entry.get('figures'))} |")
    (check.out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run(args: argparse.Namespace) -> int:
    check = Check(args)
    bundle = Path(args.bundle).resolve()
    check.record["device"] = describe_device()
    print(device_line(check.record["device"]), flush=True)
    if "install" in args.steps:
        _install(check, bundle)
    models = materialize(bundle, check.out / "site", tiny=args.tiny, stand_ins=args.stand_ins,
                         decoder=any(step.startswith("decoder") for step in args.steps))
    check.record["stand_ins"] = models["stand_ins"]
    check.env["PYTHONPATH"] = os.pathsep.join([models["site"], str(REPO_ROOT), check.env.get("PYTHONPATH", "")])
    corpus, qa = check.out / "corpus.jsonl", check.out / "qa.jsonl"
    passages = synthetic_passages(INDEX_PASSAGES[int(args.tiny)])
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": p}) + "\n" for i, p in enumerate(passages)))
    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Which river runs through city number {i}?",
                                      "golden_answers": [f"river {i}"]}) + "\n" for i in range(64)))
    for step in args.steps:
        if step == "tests":
            _tests(check)
        elif step == "encode":
            check.measure("encode", [str(BENCHMARKS / "bench_encode.py")], ["--model", models["encoder"], "--corpus", str(corpus)])
        elif step == "train":  # no profile (two more runs of 35 s): bench_train.py --profile where the ratio misses
            check.measure("train", [str(BENCHMARKS / "bench_train.py")], ["--model", models["encoder"], "--corpus", str(corpus),
                                                     "--memory-batches"])
        elif step == "rollout":
            check.measure("rollout", [str(BENCHMARKS / "bench_rollout.py")], ["--model", models["lm"], "--fixed-passages", str(corpus),
                                                         "--qa", str(qa)])
        elif step == "gac":
            check.measure("gac", [str(BENCHMARKS / "bench_gac.py")], ["--model", models["lm"], "--corpus", str(corpus),
                                                 "--index", str(check.out / "no-index")])
        elif step == "rl":
            check.measure("rl", [str(HERE / "gpu_check.py"), "_rl"], ["--model", models["lm"], "--corpus", str(corpus)])
        elif step == "index":
            check.measure("index", [str(HERE / "gpu_check.py"), "_index"], ["--model", models["encoder"],
                                                                         "--corpus", str(corpus)])
        elif step == "decoder_train":
            check.measure("decoder_train", [str(BENCHMARKS / "bench_train.py")],
                          ["--lora-model", models["decoder"], "--corpus", str(corpus)])
        elif step == "decoder_index":
            check.measure("decoder_index", [str(HERE / "gpu_check.py"), "_index"],
                          ["--model", models["decoder"], "--corpus", str(corpus)])
    write_report(check)
    return 0 if all(entry["status"] == "ok" or entry["status"].startswith("skipped")
                    for entry in check.record["steps"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bundle = commands.add_parser("bundle", help="write what a bare GPU host lacks into a folder")
    bundle.add_argument("out", help="the bundle folder (replaced)")
    bundle.add_argument("--wheels", action="store_true", help="also download the host's missing wheels (~25 MB)")
    check = commands.add_parser("run", help="run the check")
    check.add_argument("--bundle", default="gpu_bundle", help="the folder `bundle` wrote")
    check.add_argument("--out", default="runs/gpu_check", help="where the report and each step's output go")
    check.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: hide the GPUs (a dry run)")
    check.add_argument("--tiny", action="store_true", help="tiny sizes and a 2-layer agent (a dry run)")
    check.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS), help="the steps to run, in order")
    check.add_argument("--deadline-s", type=float, default=480.0, help="stop starting steps after this long")
    check.add_argument("--stand-ins", choices=["missing", "always"], default="missing",
                       help="stand-ins for the offline default packages this Python lacks, or for all of them")
    check.add_argument("--pytest-args", type=shlex.split, default=["-m", "not slow", "tests"],
                       help="what the tests step passes to pytest, one string: "
                            "--pytest-args \"-m 'not slow' tests/base/llm\"")
    check.add_argument("--test-workers", type=int, default=8,
                       help="pytest-xdist workers of the tests step (where xdist is installed; 1: one process)")
    for name in ("rl", "index"):  # the steps' own workers, run by `run` in processes of their own
        worker = commands.add_parser(f"_{name}")
        worker.add_argument("--model", required=True)
        worker.add_argument("--corpus", required=True)
        worker.add_argument("--json", required=True)
        if name == "rl":
            worker.add_argument("--questions", type=int, default=16)
            worker.add_argument("--max-new-tokens", type=int)
        else:
            worker.add_argument("--precision", default="auto", help="the encoder's (encoder.precision)")
    args = parser.parse_args(argv)
    if args.command == "bundle":
        sizes = write_bundle(Path(args.out), args.wheels)
        print(f"bundle written to {args.out}: " + ", ".join(f"{name} {mib} MiB" for name, mib in sizes.items()))
        return 0
    if args.command == "_rl":
        rl_step(args.model, args.corpus, args.questions, args.max_new_tokens, args.json)
        return 0
    if args.command == "_index":
        index_build(args.model, args.corpus, args.json, args.precision)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
