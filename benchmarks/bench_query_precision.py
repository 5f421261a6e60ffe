"""Query encoding in bf16 against fp32 with the same index, in one process: agreement, retrieval, speed.

The service encodes each query with the index's encoder; where the CPU multiplies bf16 in hardware (AMX,
AVX512-BF16) bf16 queries are cheaper. This measures what they change, on one index (its passages as they were
built) opened twice, queries in fp32 and in bf16:

* agreement with fp32 queries: the share of questions with the same top-1 passage, and the mean overlap of the
  top-3 sets (what Search-R1's agent reads: 3 passages a search);
* leaf dev Recall@1 and MRR@10 of each, judged by the questions' evidence titles (evaluation labels; dev
  questions, which no training reads);
* queries/s of the encoder alone at the batch sizes a batched service forms (1, 16, 64), the two precisions in
  turn (`--repeats` rounds), the best round each, and the ratio bf16 / fp32.

    .venv/bin/python benchmarks/bench_query_precision.py --index runs/quickstart/index/minilm-flat
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from _common import alternate, base_parser, describe_device, device_line, write_json

BATCHES = (1, 16, 64)


def top_ids(index, questions, k: int) -> list[list[str]]:
    return [list(ids) for ids in index.search([q.question for q in questions], k).ids]


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--index", default="runs/quickstart/index/minilm-flat", help="a dense index folder")
    parser.add_argument("--qa", default="runs/quickstart/data/fanoutqa_leaf_dev.jsonl",
                        help="judged dev questions (evidence titles)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of each precision, in turn")
    args = parser.parse_args()

    import torch

    from agentic_retriever.base.machine import cpu_class
    from agentic_retriever.eval.retrieval import evaluate_retrieval, load_judged_questions
    from agentic_retriever.index import open_index
    from agentic_retriever.index.manifest import IndexManifest

    device = describe_device()
    print(f"{device_line(device)}; CPU class {cpu_class()}, torch CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}")
    manifest = IndexManifest.load(args.index)
    print(f"index {args.index}: {manifest.rows} passages encoded in {manifest.encoder.get('dtype', 'float32')}")
    indexes = {name: open_index(args.index, query_precision=name) for name in ("fp32", "bf16")}  # as the service does
    questions = load_judged_questions(args.qa)
    results: dict = {"passages_dtype": manifest.encoder.get("dtype", "float32"), "questions": len(questions)}

    tops = {name: top_ids(index, questions, 3) for name, index in indexes.items()}
    same_top1 = float(np.mean([a[0] == b[0] for a, b in zip(tops["fp32"], tops["bf16"])]))
    overlap3 = float(np.mean([len(set(a) & set(b)) / 3 for a, b in zip(tops["fp32"], tops["bf16"])]))
    results["agreement"] = {"same_top1": same_top1, "top3_overlap": overlap3}
    print(f"agreement with fp32 queries over {len(questions)} questions: same top-1 {same_top1:.3f}, "
          f"top-3 overlap {overlap3:.3f}")
    for name, index in indexes.items():
        metrics = evaluate_retrieval(index, questions, (1, 3, 20), 10)["metrics"]
        results[name] = {m: metrics[m] for m in ("recall@1", "recall@3", "mrr@10")}
        print(f"{name} queries: Recall@1 {metrics['recall@1']:.3f}, Recall@3 {metrics['recall@3']:.3f}, "
              f"MRR@10 {metrics['mrr@10']:.3f}")

    texts = [q.question for q in questions]
    speed = {}
    for batch in BATCHES:
        chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]
        runs = {name: (lambda encoder=index.encoder: [encoder.encode_queries(c) for c in chunks])
                for name, index in indexes.items()}
        seconds = alternate(runs, args.repeats)
        rate = {name: len(texts) / min(times) for name, times in seconds.items()}
        speed[batch] = rate | {"ratio": rate["bf16"] / rate["fp32"]}
        print(f"batches of {batch:>2}: fp32 {rate['fp32']:.1f} queries/s, bf16 {rate['bf16']:.1f} queries/s, "
              f"{speed[batch]['ratio']:.2f}x")
    results["queries_per_s"] = speed
    write_json(args.json, Path(__file__).stem, args, device, results)


if __name__ == "__main__":
    main()
