"""Does the decoder-embedder path learn on the demo's data? A causal LM as the retriever, trained with LoRA on the
demo's mined rows (issue 67: larger retriever backbones, Agentic-R's stated limitation).

    .venv/bin/python benchmarks/experiments/decoder_embedder/decoder_embedder_experiment.py --work runs/decoder_embedder

It needs `make demo` first (its corpus, splits and mined rows: ``--quickstart runs/quickstart``). Each step reuses
its artifact when it is there:

1. `retriever init`: the embedded SmolLM2-135M-Instruct as a decoder embedder (last-token pooling over the appended
   end token, Qwen3-Embedding's query instruction); it has had no contrastive training, so it is a weak base;
2. a Flat index with it (bf16 on a CPU that computes bf16: `precision: native`) of a part of the demo's corpus
   (``--corpus-passages``: a 135M decoder encodes about 15 passages/s on 2 cores, so the whole 10,033 would take
   11 min an index): every evidence page of the leaf dev questions and of the held-out train slice (evaluation and
   model selection: this reads their evidence titles; training reads the whole corpus and never this choice), then
   passages drawn at random (seeded) up to the size;
3. `retriever train` on the demo's mined rows (``mining/retriever_train.jsonl``: questions and gold answers made them,
   never evidence titles) with LoRA of rank ``--lora-rank`` (0: full fine-tuning), the query composed as
   ``Q [SEP] q`` inside the instruction, the base or an epoch kept on the held-out train slice (model selection:
   it reads that slice's evidence titles, never dev's); the GradCache loss over mini-batches of 8 texts and gradient
   checkpointing (a plain update of 8 queries x 16 passages of 256 tokens ran out of 24 GB: OOM-killed);
4. a Flat index with the trained encoder (its export merged: a plain folder);
5. both on the leaf dev questions (evaluation: reads their evidence titles), bare and composed with the parent
   question, trained minus base with paired-bootstrap 95% confidence intervals.

Writes ``results.json`` and ``results.md`` into the work folder.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _common (an experiment runs as a script)
from _common import describe_device  # noqa: E402

from agentic_retriever.base.corpus import split_contents  # noqa: E402
from agentic_retriever.base.decoder_embedder import DecoderEmbedderConfig, build_decoder_embedder  # noqa: E402
from agentic_retriever.base.encoder import EncoderConfig  # noqa: E402
from agentic_retriever.base.jsonl import write_jsonl  # noqa: E402
from agentic_retriever.eval.bootstrap import compare_reports  # noqa: E402
from agentic_retriever.eval.report import render_table  # noqa: E402
from agentic_retriever.eval.retrieval import (composition_questions, evaluate_retrieval,  # noqa: E402
                                              load_judged_questions)
from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index, open_index  # noqa: E402
from agentic_retriever.training.config import LoraSettings, RetrieverTrainConfig  # noqa: E402
from agentic_retriever.training.trainer import train_retriever  # noqa: E402

METRICS = ("recall@1", "recall@5", "recall@20", "mrr@10")
MODES = {"bare": "none", "composed": "parent"}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/decoder_embedder", help="folder of every artifact")
    parser.add_argument("--quickstart", default="runs/quickstart", help="the demo's work folder (data, mined rows)")
    parser.add_argument("--backbone", default="default", help="causal LM (default: the embedded SmolLM2-135M)")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per text, the end token included")
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank (0: full fine-tuning)")
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--batch-size", type=int, default=8, help="queries per update")
    parser.add_argument("--corpus-passages", type=int, default=3000,
                        help="passages indexed: the evidence of dev and held-out questions, then random ones (0: all)")
    return parser.parse_args(argv)


def _evaluation_corpus(corpus: Path, data: Path, size: int, out: Path) -> Path:
    """`size` passages of `corpus` (all with 0): those titled as an evidence page of the leaf dev questions or of the
    held-out train slice (reads evidence labels: evaluation and model selection only), then seeded random others."""
    if not size:
        return corpus
    if out.is_file():
        return out
    titles = {title for name in ("fanoutqa_leaf_dev.jsonl", "fanoutqa_leaf_train_heldout.jsonl")
              for row in map(json.loads, (data / name).open()) for title in row.get("supporting_titles", [])}
    rows = [json.loads(line) for line in corpus.open()]
    is_evidence = [split_contents(row["contents"])[0] in titles for row in rows]
    evidence = [row for row, hit in zip(rows, is_evidence) if hit]
    others = [row for row, hit in zip(rows, is_evidence) if not hit]
    write_jsonl(out, evidence + random.Random(0).sample(others, max(0, size - len(evidence))))
    return out


def _flat_index(corpus: Path, out: Path, model: str, max_length: int) -> str:
    if not (out / "manifest.json").is_file():
        build_index(IndexBuildConfig(corpus=str(corpus), out=str(out), backend="dense",
                                     encoder=EncoderConfig(model=model, precision="native", max_length=max_length),
                                     dense=DenseParams(type="flat")))
    return str(out)


def _leaf_reports(index_dir: str, data: Path) -> dict[str, dict]:
    index = open_index(index_dir)  # queries in fp32 (the evaluation's), passages as the index holds them
    questions = load_judged_questions(str(data / "fanoutqa_leaf_dev.jsonl"))
    return {mode: evaluate_retrieval(index, questions, (1, 5, 20), 10, 10, search_questions=composition_questions(
        questions, compose_with, str(data / "fanoutqa_multihop_dev.jsonl")))
            for mode, compose_with in MODES.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    work, quickstart = Path(args.work), Path(args.quickstart)
    data, rows = quickstart / "data", quickstart / "mining" / "retriever_train.jsonl"
    for needed in (data / "corpus.jsonl", rows):
        if not needed.is_file():
            raise SystemExit(f"{needed} is missing: run `make demo` first (or give --quickstart)")
    embedder = work / "embedder"
    if not (embedder / "modules.json").is_file():
        build_decoder_embedder(DecoderEmbedderConfig(backbone=args.backbone, out=str(embedder),
                                                     max_length=args.max_length))
    indexed = _evaluation_corpus(data / "corpus.jsonl", data, args.corpus_passages, work / "corpus.jsonl")
    base_index = _flat_index(indexed, work / "index" / "base", str(embedder), args.max_length)
    trained = train_retriever(RetrieverTrainConfig(
        data=str(rows), corpus=str(data / "corpus.jsonl"), out=str(work / "retriever"),
        encoder=EncoderConfig(model=str(embedder), composition="question_sep_query", max_length=args.max_length),
        lora=LoraSettings(rank=args.lora_rank), learning_rate=args.learning_rate, temperature=args.temperature,
        epochs=args.epochs, per_device_batch_size=args.batch_size, precision="native", logging_steps=1,
        cached=True, mini_batch_size=8, gradient_checkpointing=True,  # 8 x 16 texts of 256 tokens: over 24 GB without
        select_on=str(data / "fanoutqa_leaf_train_heldout.jsonl"), select_index=base_index,
        select_compose_with=["none", "parent"], select_parents=str(data / "fanoutqa_multihop_train_heldout.jsonl")))
    trained_index = _flat_index(indexed, work / "index" / "trained", str(trained), args.max_length)

    base, other = _leaf_reports(base_index, data), _leaf_reports(trained_index, data)
    manifest = json.loads((trained / "train_manifest.json").read_text())
    results = {
        "device": describe_device(), "args": vars(args), "rows": manifest["data"], "updates": manifest["updates"],
        "parameters": manifest["parameters"], "selection": manifest["selection"],
        "table": {f"{name} ({mode})": {m: report[mode]["metrics"][m] for m in METRICS}
                  for name, report in (("base", base), ("trained", other)) for mode in MODES},
        "vs_base": {mode: compare_reports(base[mode], other[mode], METRICS) for mode in MODES},
        "questions": base["bare"]["questions_evaluated"],
    }
    (work / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    lines = [f"SmolLM2-135M as a decoder embedder, {'LoRA rank ' + str(args.lora_rank) if args.lora_rank else 'full'}"
             f" on {manifest['data'].get('examples')} mined examples ({manifest['updates']} updates); "
             f"{results['questions']} FanOutQA leaf dev questions, {sum(1 for _ in indexed.open()):,} passages "
             "indexed", "", render_table(results["table"]), "",
             "Trained minus base, paired bootstrap 95% CI:"]
    for mode, comparison in results["vs_base"].items():
        lines.append(f"- {mode}: " + "; ".join(f"{m} {c['diff']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"
                                               for m, c in comparison.items()))
    selection = manifest["selection"] or {}
    lines += ["", f"Model selection kept {selection.get('kept')} ({selection.get('per_checkpoint')})."]
    (work / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
