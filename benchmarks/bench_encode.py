"""Encoding: our Encoder against plain sentence-transformers on the same model, in bulk and one query at a time.

1. Passages/s of ``Encoder(EncoderConfig(model=M)).encode_passages(texts)`` (`--model`, default the embedded
   MiniLM) and of ``SentenceTransformer(M).encode(texts, batch_size=64, normalize_embeddings=True)`` on the same
   passages, the baseline's weights at the precision ours picks (fp16 on a GPU unless `--precision` says
   otherwise; `--baseline-precision fp32` compares with sentence-transformers' own default instead). Target:
   ratio ours / sentence-transformers >= 1.0x at the same precision (no overhead from our wrapper; 0.98-1.02 is
   noise).
2. Queries/s encoding `--queries` short queries one call each (what a retrieval service pays per request of a
   lone agent): ``encode_queries([q])``, which runs one forward pass without ``encode``'s per-call
   bookkeeping, against ``SentenceTransformer.encode([q])``. Target: >= 1.0x.

Both in the same process, alternating A B A B after a warm-up, and both check that the embeddings agree.
"""

from __future__ import annotations

import numpy as np

from _common import alternate, base_parser, describe_device, device_line, load_passages, summarize, write_json


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--passages", type=int, default=256, help="passages encoded per timed run")
    parser.add_argument("--queries", type=int, default=200, help="short queries encoded one call each per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each encoder (alternating)")
    parser.add_argument("--corpus", help="corpus file to take passages from (default: runs/quickstart corpus, "
                                         "else synthetic passages)")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"],
                        help="our encoder's precision (auto = fp16 on GPU, fp32 on CPU)")
    parser.add_argument("--baseline-precision", default="same", choices=["same", "fp32", "fp16", "bf16"],
                        help="sentence-transformers' weights: same as ours, or a precision of its own")
    parser.add_argument("--model", help="encoder folder (default: the embedded MiniLM)")
    args = parser.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from agentic_retriever.base.defaults import minilm_model_dir
    from agentic_retriever.base.encoder import Encoder, EncoderConfig

    device = describe_device()
    texts, source = load_passages(args.passages, args.corpus)
    model = args.model or str(minilm_model_dir())
    ours = Encoder(EncoderConfig(model=model, precision=args.precision))
    ours_dtype = next(ours.model.parameters()).dtype
    baseline_dtype = ours_dtype if args.baseline_precision == "same" else \
        {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.baseline_precision]
    baseline = SentenceTransformer(model, model_kwargs={"dtype": baseline_dtype})
    torch_device = str(baseline.device)
    print(f"precision: ours {ours_dtype}, sentence-transformers {next(baseline.parameters()).dtype}")
    print(f"encode benchmark: {len(texts)} passages from {source}")
    print(device_line(device) + f"; torch {torch.__version__} on {torch_device}, {torch.get_num_threads()} threads")

    outputs: dict[str, np.ndarray] = {}

    def run_ours() -> None:
        outputs["ours"] = ours.encode_passages(texts)

    def run_st() -> None:
        outputs["st"] = baseline.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)

    warm = texts[:128]
    ours.encode_passages(warm)
    baseline.encode(warm, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    seconds = alternate({"ours": run_ours, "sentence_transformers": run_st}, repeats=args.repeats, warmup=0)

    reduced_precision = torch.float32 != ours_dtype or torch.float32 != next(baseline.parameters()).dtype
    atol = 2e-2 if reduced_precision else 1e-5
    st_vectors = np.asarray(outputs["st"], dtype=np.float32)
    max_diff = float(np.abs(outputs["ours"] - st_vectors).max())
    np.testing.assert_allclose(outputs["ours"], st_vectors, atol=atol, rtol=0,
                               err_msg="our embeddings differ from sentence-transformers'")

    results = {name: summarize(times, len(texts)) for name, times in seconds.items()}
    ratio_median = results["ours"]["median_per_s"] / results["sentence_transformers"]["median_per_s"]
    ratio_best = results["ours"]["best_per_s"] / results["sentence_transformers"]["best_per_s"]
    for name in ("ours", "sentence_transformers"):
        r = results[name]
        print(f"  {name:22s} median {r['median_per_s']:8.1f} passages/s   best {r['best_per_s']:8.1f} passages/s   "
              f"runs {', '.join(f'{s:.2f}s' for s in r['seconds'])}")
    print(f"  embeddings allclose: yes (max |diff| {max_diff:.2e}, atol {atol:g}, dim {st_vectors.shape[1]})")
    print(f"RATIO ours/sentence-transformers: {ratio_median:.3f}x (median), {ratio_best:.3f}x (best)  "
          f"[target >= 1.0x, 0.98-1.02 is noise]")
    single = one_query_at_a_time(ours, baseline, [" ".join(t.split()[1:7]) for t in texts][: args.queries],
                                 args.repeats, atol)
    write_json(args.json, "encode", args, device, {
        "passages": len(texts), "source": source, "torch_device": torch_device, "torch_threads": torch.get_num_threads(),
        "model": model, "ours_dtype": str(ours_dtype), "baseline_dtype": str(next(baseline.parameters()).dtype),
        **results,
        "max_abs_diff": max_diff, "ratio_median": ratio_median, "ratio_best": ratio_best, "one_query_at_a_time": single,
    })


def one_query_at_a_time(ours, baseline, queries: list[str], repeats: int, atol: float) -> dict:
    """Queries/s of one `encode` call per query, ours against sentence-transformers, and the largest difference."""
    outputs: dict[str, list] = {"ours": [], "st": []}

    def run_ours() -> None:
        outputs["ours"] = [ours.encode_queries([q])[0] for q in queries]

    def run_st() -> None:
        outputs["st"] = [baseline.encode([q], normalize_embeddings=True, show_progress_bar=False)[0] for q in queries]

    seconds = alternate({"ours": run_ours, "sentence_transformers": run_st}, repeats=repeats, warmup=1)
    max_diff = float(np.abs(np.stack(outputs["ours"]) - np.stack(outputs["st"])).max())
    np.testing.assert_allclose(np.stack(outputs["ours"]), np.stack(outputs["st"]), atol=atol, rtol=0,
                               err_msg="our query embeddings differ from sentence-transformers'")
    results = {name: summarize(times, len(queries)) for name, times in seconds.items()}
    ratio = results["ours"]["median_per_s"] / results["sentence_transformers"]["median_per_s"]
    print(f"one query per call ({len(queries)} short queries):")
    for name, r in results.items():
        print(f"  {name:22s} median {r['median_per_s']:8.1f} queries/s ({1000 / r['median_per_s']:.2f} ms each)   "
              f"best {r['best_per_s']:8.1f} queries/s")
    print(f"  embeddings allclose: yes (max |diff| {max_diff:.2e})")
    print(f"RATIO ours/sentence-transformers, one query per call: {ratio:.3f}x (median)  [target >= 1.0x]")
    return {"queries": len(queries), **results, "max_abs_diff": max_diff, "ratio_median": ratio}


if __name__ == "__main__":
    main()
