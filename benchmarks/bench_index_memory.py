"""Peak memory of a dense index build at two corpus sizes: does it grow with the index or the corpus?

Each build runs ``agentic_retriever.index.build_index`` (Flat, chunk_size 4096) in a fresh subprocess, on a
corpus whose one-time Arrow conversion was done (and measured) in a subprocess before it, and reports its
peak RSS (VmHWM; getrusage ru_maxrss off Linux) and, sampled every 10 ms from /proc/self/status, its peak
anonymous (heap) and file-backed (memory-mapped) resident memory. A third process only imports the library
and FAISS and loads the encoder: the fixed cost. The encoder is a tiny random-weight BERT with MiniLM's
tokenizer, projected to MiniLM's 384 dimensions, so that 100k passages encode in minutes rather than hours
on a small CPU; the memory questions (corpus memory-mapped, embeddings streamed to a memmap, FAISS filled
chunk by chunk) do not depend on the weights. Ratio = (peak RSS growth between the sizes) / (Flat index
growth, rows x dim x 4 bytes).
Target: about 1x in anonymous memory (growth is the index, not the corpus).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    PeakSampler, base_parser, describe_device, device_line, fmt_bytes, load_passages, ru_maxrss_bytes, write_json,
)

MARKER = "BENCH-RESULT "


# ------------------------------------------------------------------------------------------ child side

def child(args) -> None:
    sampler = PeakSampler()
    sampler.start()
    started = time.perf_counter()
    result: dict = {}
    if args.child == "convert":
        from agentic_retriever.base.corpus import Corpus

        result["rows"] = len(Corpus.open(args.corpus))
    elif args.child == "baseline":
        import faiss  # noqa: F401  (the build imports it: part of the fixed cost)

        import agentic_retriever.index  # noqa: F401
        from agentic_retriever.base.encoder import Encoder, EncoderConfig

        result["dim"] = Encoder(EncoderConfig(model=args.model)).dim
    else:
        from agentic_retriever.base.encoder import EncoderConfig
        from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index
        from agentic_retriever.index.dense import FAISS_FILE

        manifest = build_index(IndexBuildConfig(corpus=args.corpus, out=args.out, encoder=EncoderConfig(model=args.model),
                                                dense=DenseParams(type="flat", chunk_size=args.chunk_size)))
        result.update(rows=manifest.rows, dim=manifest.dim,
                      index_file_bytes=os.path.getsize(manifest.data_folder(args.out) / FAISS_FILE))
    result["seconds"] = time.perf_counter() - started
    peaks = sampler.stop()
    result.update(max_rss=peaks.get("VmHWM") or ru_maxrss_bytes(), ru_maxrss=ru_maxrss_bytes(),
                  peak_anon=peaks.get("RssAnon"), peak_file=peaks.get("RssFile"))
    print(MARKER + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------------------ parent side

def make_tiny_model(out: Path, hidden: int, layers: int, max_tokens: int, dim: int) -> None:
    """A sentence-transformers folder: a random-weight BERT with MiniLM's tokenizer (its
    max_position_embeddings caps the tokens per passage), mean pooling, and a random linear projection
    from `hidden` to `dim` when they differ (so the vectors, hence the index, have a realistic size while
    the transformer stays cheap)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers import models as modules
    from sentence_transformers import SentenceTransformer

    from agentic_retriever.base.defaults import minilm_model_dir

    hf_dir = out.with_name(out.name + "-hf")
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_model_dir()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(1, hidden // 32), intermediate_size=hidden * 2,
                        max_position_embeddings=max_tokens)
    BertModel(config).save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    stack = [modules.Transformer(str(hf_dir)), modules.Pooling(hidden, "mean")]
    if dim != hidden:
        stack.append(modules.Dense(hidden, dim, activation_function=torch.nn.Identity()))
    SentenceTransformer(modules=stack, device="cpu").save(str(out))


def write_corpus(path: Path, texts: list[str], rows: int) -> None:
    with open(path, "w") as handle:
        for i in range(rows):
            handle.write(json.dumps({"id": str(i), "contents": texts[i]}) + "\n")


def run_child(role: str, env: dict, **options) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", role]
    for key, value in options.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode or not lines:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{role} subprocess failed (exit {done.returncode})")
    return json.loads(lines[-1][len(MARKER):])


def arrow_bytes(cache: Path, stem: str) -> int:
    return sum(p.stat().st_size for p in (cache / "corpus").glob(f"{stem}-*") if p.is_file())


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs=2, default=[10_000, 100_000], metavar=("SMALL", "LARGE"),
                        help="corpus sizes (passages) of the two builds")
    parser.add_argument("--hidden", type=int, default=64, help="tiny model hidden size")
    parser.add_argument("--dim", type=int, default=384, help="embedding dimension (a linear projection from --hidden; "
                                                          "384 = MiniLM's)")
    parser.add_argument("--layers", type=int, default=2, help="tiny model layers")
    parser.add_argument("--max-tokens", type=int, default=256, help="tiny model max tokens per passage (MiniLM: 256)")
    parser.add_argument("--chunk-size", type=int, default=4096, help="DenseParams.chunk_size")
    parser.add_argument("--corpus", help="corpus whose passages are repeated (default: runs/quickstart corpus, "
                                         "else synthetic passages)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and print its path")
    parser.add_argument("--child", choices=["baseline", "convert", "build"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    small, large = sorted(args.sizes)
    device = describe_device()
    tmp = Path(tempfile.mkdtemp(prefix="bench-index-memory-"))
    try:
        env = os.environ | {"AGENTIC_RETRIEVER_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1",
                            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        model = tmp / "tiny-bert"
        make_tiny_model(model, args.hidden, args.layers, args.max_tokens, args.dim)
        texts, source = load_passages(large, args.corpus)
        print(f"index memory benchmark: dense Flat builds of {small:,} and {large:,} passages, chunk_size {args.chunk_size}")
        print(f"  encoder: tiny random-weight BERT ({args.layers} layers, hidden {args.hidden}, MiniLM tokenizer, max "
              f"{args.max_tokens} tokens, mean pooling, random projection to {args.dim}-d vectors), NOT MiniLM: MiniLM is far too slow for 100k passages "
              f"on a small CPU, and the weights do not change the memory questions")
        print(f"  passages: {source}, unique ids; temp dir {tmp} (AGENTIC_RETRIEVER_CACHE={tmp / 'cache'})")
        print(device_line(device))

        baseline = run_child("baseline", env, model=model)
        convert, build = {}, {}
        for rows in (small, large):
            corpus = tmp / f"corpus-{rows}.jsonl"
            write_corpus(corpus, texts, rows)
            convert[rows] = run_child("convert", env, corpus=corpus)
            convert[rows].update(corpus_jsonl_bytes=corpus.stat().st_size,
                                 corpus_arrow_bytes=arrow_bytes(tmp / "cache", corpus.stem))
            build[rows] = run_child("build", env, model=model, corpus=corpus, out=tmp / f"index-{rows}",
                                    chunk_size=args.chunk_size)
        del texts

        dim = build[large]["dim"]
        keys = ("max_rss", "peak_anon", "peak_file")
        build_growth = {k: build[large][k] - build[small][k] for k in (*keys, "index_file_bytes") if build[small][k] is not None}
        convert_growth = {k: convert[large][k] - convert[small][k] for k in (*keys, "corpus_jsonl_bytes", "corpus_arrow_bytes")
                          if convert[small][k] is not None}
        expected_index = (large - small) * dim * 4
        ratio = build_growth["max_rss"] / expected_index
        ratio_anon = build_growth["peak_anon"] / expected_index if "peak_anon" in build_growth else None

        def row(label: str, r: dict, extra: str = "") -> None:
            cells = [fmt_bytes(r[k]) if r.get(k) is not None else "n/a" for k in keys]
            time_cell = f"{r['seconds']:8.1f}s" if "seconds" in r else " " * 9
            print(f"  {label:42s} {cells[0]:>11s} {cells[1]:>11s} {cells[2]:>11s} {time_cell}  {extra}")

        print(f"  {'process (each a fresh subprocess)':42s} {'peak RSS':>11s} {'peak anon':>11s} {'peak file':>11s} {'time':>9s}")
        row("baseline: import library+faiss, load encoder", baseline)
        for rows in (small, large):
            row(f"corpus conversion to Arrow, {rows:,} rows", convert[rows],
                f"JSONL {fmt_bytes(convert[rows]['corpus_jsonl_bytes'])}, Arrow {fmt_bytes(convert[rows]['corpus_arrow_bytes'])}")
        for rows in (small, large):
            row(f"index build (Flat), {rows:,} passages", build[rows], f"index.faiss {fmt_bytes(build[rows]['index_file_bytes'])}")
        row(f"growth of the build, {large:,} - {small:,}", build_growth)
        row(f"growth of the conversion, {large:,} - {small:,}", convert_growth)
        print(f"  fixed cost: baseline peak RSS {fmt_bytes(baseline['max_rss'])}; the {small:,}-passage build adds "
              f"{fmt_bytes(build[small]['max_rss'] - baseline['max_rss'])} to it")
        print(f"  expected Flat index growth: {large - small:,} rows x {dim} dims x 4 B = {fmt_bytes(expected_index)} "
              f"(index.faiss grew {fmt_bytes(build_growth['index_file_bytes'])}); the build's embeddings memmap "
              f"(file-backed) grows by the same amount")
        print(f"  corpus growth, for comparison: JSONL {fmt_bytes(convert_growth['corpus_jsonl_bytes'])}, "
              f"Arrow cache (memory-mapped) {fmt_bytes(convert_growth['corpus_arrow_bytes'])}")
        print("  (peak anon / peak file: highest RssAnon / RssFile seen in /proc/self/status, sampled every 10 ms; "
              "they need not peak together)")
        anon_text = f"; anonymous memory only: {ratio_anon:.2f}x" if ratio_anon is not None else ""
        print(f"RATIO build peak-RSS growth / Flat index growth: {ratio:.2f}x{anon_text}  "
              f"[target: about 1x in anonymous memory]")
        write_json(args.json, "index_memory", args, device, {
            "sizes": [small, large], "dim": dim, "source": source,
            "encoder": f"tiny random-weight BERT, {args.layers} layers, hidden {args.hidden}, max {args.max_tokens} tokens, "
                       f"projected to {args.dim}-d",
            "baseline": baseline, "convert": {str(k): v for k, v in convert.items()},
            "build": {str(k): v for k, v in build.items()}, "build_growth": build_growth, "convert_growth": convert_growth,
            "expected_index_growth_bytes": expected_index, "ratio": ratio, "ratio_anon": ratio_anon,
        })
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
