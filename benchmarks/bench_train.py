"""Retriever training: our trainer against a plain sentence-transformers run, and the cached (GradCache) loss.

1. Throughput: `train_retriever` (our data reading, Eq. 5 loss with the in-batch accuracy, curves, export)
   against a plain `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` with the same model, data,
   batch, temperature and number of updates. Each run is its own process (so its peak memory is its own),
   after one short unmeasured warm-up run, alternating ours / plain (the order reversed every round). Reported:
   queries/s of the training loop (the trainer's own ``train_runtime``), peak RSS and peak CUDA memory. Target:
   ours / plain >= 0.95x. `--profile` adds one run of each under `torch.profiler`: where the time goes, operator
   by operator.
2. Memory of one update at growing global batches with and without the cached loss: the largest batch under
   ``--budget-mib`` of peak RSS growth for each.
3. With ``--lora-rank R``: full fine-tuning against LoRA of rank R (`retriever_train.lora`) on one decoder
   backbone (``--lora-model``; default: the embedded SmolLM2-135M written as a decoder embedder by `retriever init`),
   each run its own process, alternating: updates/s, peak RSS (and CUDA memory), trainable parameters.

Rows are built from the quickstart corpus: the query is a passage's first words, its positive the passage,
its negatives random other passages.
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO_ROOT, base_parser, describe_device, device_line, load_passages, write_json


def _rows(path: Path, queries: int, negatives: int, corpus: str | None) -> None:
    passages, _ = load_passages(queries * 4, corpus)
    rng = random.Random(0)
    with path.open("w") as handle:
        for i in range(queries):
            others = rng.sample([p for j, p in enumerate(passages) if j != i], negatives)
            handle.write(json.dumps({"query": " ".join(passages[i].split()[:12]), "pos": [passages[i]], "neg": others})
                         + "\n")


def _worker(kind: str, data: str, batch: int, steps: int, negatives: int, max_length: int, cached: bool,
            model_dir: str, profile: bool, lora_rank: int = 0, lora_dropout: float = 0.05,
            lora_targets: str = "all-linear", precision: str = "auto") -> dict:
    """One training run in this process; returns its loop time and peak memory (and, with `profile`, the top
    operators of the whole run by self time, from `torch.profiler`)."""
    import contextlib

    import torch

    from agentic_retriever.base.encoder import EncoderConfig

    torch.manual_seed(0)
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                          if torch.cuda.is_available() else [])
    profiler = torch.profiler.profile(activities=activities) if profile else contextlib.nullcontext()
    with tempfile.TemporaryDirectory() as tmp, profiler:
        if kind == "ours":
            from agentic_retriever.training.config import LoraSettings, RetrieverTrainConfig
            from agentic_retriever.training.trainer import train_retriever

            out = train_retriever(RetrieverTrainConfig(
                data=data, out=f"{tmp}/model",
                encoder=EncoderConfig(model=model_dir, max_length=max_length, composition="query"),
                per_device_batch_size=batch, max_steps=steps, cached=cached, precision=precision,
                mini_batch_size=8, save_steps=10_000, logging_steps=1, progress=False,
                lora=LoraSettings(rank=lora_rank, dropout=lora_dropout, target_modules=lora_targets.split(","),
                                  merge=False)))
            history = [json.loads(line) for line in (out / "metrics.jsonl").open()]
            parameters = json.loads((out / "train_manifest.json").read_text())["parameters"]
        else:
            from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
            from sentence_transformers import SentenceTransformerTrainingArguments
            from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

            from agentic_retriever.training.data import read_training_examples
            from agentic_retriever.training.trainer import examples_dataset

            model = SentenceTransformer(model_dir, device="cpu" if not torch.cuda.is_available() else None)
            model.max_seq_length = max_length
            examples, _ = read_training_examples(data, None, lambda q, *_: q, lambda t: t)
            args = SentenceTransformerTrainingArguments(
                output_dir=f"{tmp}/ckpt", per_device_train_batch_size=batch, max_steps=steps, learning_rate=2e-5,
                warmup_steps=0.1, weight_decay=0.01, logging_steps=1, save_steps=10_000, report_to=[],
                disable_tqdm=True, seed=0, data_seed=0, use_cpu=not torch.cuda.is_available(),
                fp16=torch.cuda.is_available())
            trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=examples_dataset(examples),
                                                 loss=MultipleNegativesRankingLoss(model, scale=100.0))
            trainer.train()
            history = trainer.state.log_history
            parameters = {"trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                          "parameters": sum(p.numel() for p in model.parameters())}
    runtime = next(h["train_runtime"] for h in history if "train_runtime" in h)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"queries_per_s": batch * steps / runtime, "updates_per_s": steps / runtime, "train_runtime": runtime,
              "peak_rss_mib": peak_mib, "rss_growth_mib": peak_mib - start_rss / 1024, **parameters}
    if torch.cuda.is_available():
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if profile:  # by host time (Python, launches, waits on the GPU), and on a GPU by kernel time too
        averages = profiler.key_averages()
        result["profile"] = averages.table(sort_by="self_cpu_time_total", row_limit=25)
        if torch.cuda.is_available():
            result["profile"] += "\n" + averages.table(sort_by="self_cuda_time_total", row_limit=15)
    return result


def _spawn(*args: str) -> dict:
    """One `_worker` run in a process of its own (its arguments as strings, in `_worker`'s order)."""
    done = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True,
                          cwd=str(REPO_ROOT / "benchmarks"))
    if done.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, data, batch, steps, negatives, max_length, cached, model_dir, profile, *lora = sys.argv[2:15]
        lora_settings = (int(lora[0]), float(lora[1]), lora[2], lora[3]) if lora else ()
        print(json.dumps(_worker(kind, data, int(batch), int(steps), int(negatives), int(max_length), cached == "1",
                                 model_dir, profile == "1", *lora_settings)))
        return
    parser = base_parser(__doc__)
    parser.add_argument("--batch", type=int, default=16, help="queries per step")
    parser.add_argument("--steps", type=int, default=8, help="updates per run")
    parser.add_argument("--negatives", type=int, default=7, help="negatives per query (N - 1)")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per text")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each trainer, alternating")
    parser.add_argument("--memory-batches", type=int, nargs="*", default=[8, 16, 32, 64],
                        help="global batches for the cached-loss memory sweep (empty: skip it)")
    parser.add_argument("--budget-mib", type=float, default=1024.0, help="memory budget of the sweep")
    parser.add_argument("--corpus", help="corpus to build rows from (default: the quickstart corpus)")
    parser.add_argument("--model", help="encoder folder both trainers start from (default: the embedded MiniLM)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="also compare full fine-tuning with LoRA of this rank on --lora-model (0: skip)")
    parser.add_argument("--lora-model", help="decoder embedder both runs start from (default: the embedded SmolLM2 "
                                             "written by `retriever init` into a temporary folder)")
    parser.add_argument("--lora-dropout", type=float, default=0.05, help="LoRA dropout (lora.dropout)")
    parser.add_argument("--lora-targets", default="all-linear",
                        help="comma-separated layers that get an adapter (lora.target_modules)")
    parser.add_argument("--lora-precision", default="auto", choices=["auto", "native", "fp32", "fp16", "bf16"],
                        help="training precision of part 3's runs (retriever_train.precision)")
    parser.add_argument("--lora-only", action="store_true", help="run part 3 alone (with --lora-rank)")
    parser.add_argument("--profile", action="store_true",
                        help="one more run of each trainer under torch.profiler: the top operators by self time")
    args = parser.parse_args()
    if args.lora_only and not args.lora_rank:
        parser.error("--lora-only needs --lora-rank")
    from agentic_retriever.base.defaults import minilm_model_dir

    model_dir = args.model or str(minilm_model_dir())

    device = describe_device()
    print(device_line(device))
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rows.jsonl"
        _rows(data, args.batch * args.steps, args.negatives, args.corpus)
        common = (str(data), str(args.batch), str(args.steps), str(args.negatives), str(args.max_length))
        if args.lora_only:
            write_json(args.json, "train", args, device, {"lora": _full_against_lora(args, Path(tmp), data, common)})
            return
        runs: dict[str, list[dict]] = {"ours": [], "sentence-transformers": []}
        # not measured: the first training process on a machine runs its loop at half speed on an H100 (86.7 q/s
        # against 200 after it, whichever trainer; benchmarks/RESULTS.md, "The GPU check")
        warm_up = _spawn("ours", str(data), str(args.batch), str(min(args.steps, 3)), *common[3:], "0", model_dir, "0")
        print(f"  warm-up (not measured): {warm_up['queries_per_s']:.1f} q/s", flush=True)
        for round_ in range(args.repeats):  # alternating, the order reversed every round
            order = (("ours", "ours"), ("sentence-transformers", "st"))
            for name, kind in order if round_ % 2 == 0 else order[::-1]:
                runs[name].append(_spawn(kind, *common, "0", model_dir, "0"))
                print(f"  {name}: {runs[name][-1]['queries_per_s']:.1f} q/s", flush=True)  # a timed-out run shows these
        profiles = {name: _spawn(kind, *common, "0", model_dir, "1")["profile"]
                    for name, kind in (("ours", "ours"), ("sentence-transformers", "st"))} if args.profile else {}
        for name, table in profiles.items():
            print(f"profile of {name} (top operators by self time, whole run):\n{table}")
        best = {name: max(r["queries_per_s"] for r in results) for name, results in runs.items()}
        peak = {name: max(r["peak_rss_mib"] for r in results) for name, results in runs.items()}
        ratio = best["ours"] / best["sentence-transformers"]
        print(f"throughput, {args.batch} queries x {1 + args.negatives} passages per step, {args.steps} steps: "
              f"ours {best['ours']:.2f} q/s, sentence-transformers {best['sentence-transformers']:.2f} q/s "
              f"-> ratio {ratio:.3f}x (target >= 0.95x); peak RSS ours {peak['ours']:.0f} MiB, "
              f"sentence-transformers {peak['sentence-transformers']:.0f} MiB")
        sweep: dict[str, dict[int, float]] = {"plain": {}, "cached": {}}
        for batch in args.memory_batches:
            _rows(data, batch, args.negatives, args.corpus)
            for name, flag in (("plain", "0"), ("cached", "1")):
                started = time.perf_counter()
                result = _spawn("ours", str(data), str(batch), "1", str(args.negatives), str(args.max_length), flag,
                                model_dir, "0")
                sweep[name][batch] = result["rss_growth_mib"]
                print(f"  one update, global batch {batch:4d}, {name:6s}: peak RSS growth "
                      f"{result['rss_growth_mib']:.0f} MiB ({time.perf_counter() - started:.0f} s)")
        largest = {name: max([b for b, mib in values.items() if mib <= args.budget_mib], default=0)
                   for name, values in sweep.items()}
        if args.memory_batches:
            print(f"largest global batch under {args.budget_mib:.0f} MiB: plain {largest['plain']}, "
                  f"cached {largest['cached']}")
        lora = _full_against_lora(args, Path(tmp), data, common) if args.lora_rank else {}
    write_json(args.json, "train", args, device, {"runs": runs, "ratio": ratio, "peak_rss_mib": peak,
                                                   "memory_sweep_mib": sweep, "largest_batch_under_budget": largest,
                                                   "model": model_dir, "profiles": profiles, "lora": lora})


def _full_against_lora(args, tmp: Path, data: Path, common: tuple[str, ...]) -> dict:
    """Part 3: full fine-tuning and LoRA of rank ``--lora-rank`` on one decoder backbone, alternating, each run its
    own process; the best updates/s of each, their peak memory and trainable parameters."""
    model = args.lora_model
    if not model:
        from agentic_retriever.base.decoder_embedder import DecoderEmbedderConfig, build_decoder_embedder

        model = str(build_decoder_embedder(DecoderEmbedderConfig(backbone="default", out=str(tmp / "embedder"),
                                                                 max_length=args.max_length)))
    _rows(data, args.batch * args.steps, args.negatives, args.corpus)
    runs: dict[str, list[dict]] = {"full": [], f"lora r={args.lora_rank}": []}  # dropout and targets: LoRA's alone
    for round_ in range(args.repeats):
        order = (("full", "0"), (f"lora r={args.lora_rank}", str(args.lora_rank)))
        for name, rank in order if round_ % 2 == 0 else order[::-1]:
            runs[name].append(_spawn("ours", *common, "0", model, "0", rank, str(args.lora_dropout), args.lora_targets,
                                     args.lora_precision))
            run = runs[name][-1]
            cuda = f", peak CUDA {run['peak_cuda_mib']:.0f} MiB" if "peak_cuda_mib" in run else ""
            print(f"  {name}: {run['updates_per_s']:.3f} updates/s, peak RSS {run['peak_rss_mib']:.0f} MiB{cuda}, "
                  f"{run['trainable_parameters']:,} of {run['parameters']:,} parameters train", flush=True)
    best = {name: max(results, key=lambda r: r["updates_per_s"]) for name, results in runs.items()}
    full, lora = best.values()
    print(f"full vs LoRA on {model}: {full['updates_per_s']:.3f} against {lora['updates_per_s']:.3f} updates/s "
          f"(LoRA {lora['updates_per_s'] / full['updates_per_s']:.2f}x); peak RSS {full['peak_rss_mib']:.0f} against "
          f"{lora['peak_rss_mib']:.0f} MiB; trainable {full['trainable_parameters']:,} against "
          f"{lora['trainable_parameters']:,}")
    return {"model": model, "precision": args.lora_precision, "runs": runs,
            "speedup": lora["updates_per_s"] / full["updates_per_s"]}


if __name__ == "__main__":
    main()
