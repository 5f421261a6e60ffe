"""Exact search in batches: where FAISS's BLAS path overtakes its sequential kernel, against the threshold the
library sets (`agentic_retriever.index.dense.tune_blas_threshold`).

FAISS (1.15) searches a Flat index (and IVF's coarse quantizer) with its sequential SIMD kernel while the batch's
nq x d is below ``faiss.cvar.distance_compute_blas_threshold`` (its default 128,000, tuned on many-core servers)
and with a BLAS matrix product from there on. For each (dimensions, rows) and each batch size this times the same
search both ways, alternating (`_common.alternate`), on seeded random unit vectors, and prints milliseconds per
query, the ratio sequential / BLAS (> 1: BLAS is faster), the smallest nq x d from which BLAS wins at every larger
batch, and which path the library's threshold takes. Target: the library's threshold sends every batch to the
faster path, or to one within 15% of it (the paths cross there).

    python benchmarks/bench_blas_threshold.py
    python benchmarks/bench_blas_threshold.py --shapes 768x1000000 --batches 1 2 4 8 64
"""

from __future__ import annotations

import statistics

import numpy as np

from _common import alternate, base_parser, describe_device, device_line, random_unit_vectors, write_json
from agentic_retriever.index.dense import FAISS_DEFAULT_BLAS_THRESHOLD, import_faiss

NEVER = 2**31 - 1  # a threshold no batch reaches (FAISS holds it in an int): the sequential kernel always
TOLERANCE = 1.15


def shape(text: str) -> tuple[int, int]:
    dim, _, rows = text.partition("x")
    return int(dim), int(rows)


def sweep(faiss, dim: int, rows: int, batches: list[int], repeats: int, tuned: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    database = random_unit_vectors(rows, dim, rng)
    queries = random_unit_vectors(max(batches), dim, rng)
    index = faiss.IndexFlatIP(dim)
    index.add(database)
    lines = []
    for nq in batches:
        batch = queries[:nq]

        def search_with(threshold: int):
            def run():
                faiss.cvar.distance_compute_blas_threshold = threshold
                index.search(batch, 3)
            return run

        seconds = alternate({"blas": search_with(0), "sequential": search_with(NEVER)}, repeats)
        blas, sequential = (statistics.median(seconds[k]) * 1000 / nq for k in ("blas", "sequential"))
        takes = "blas" if nq * dim >= tuned else "sequential"
        chosen, best = (blas if takes == "blas" else sequential), min(blas, sequential)
        lines.append({"dim": dim, "rows": rows, "nq": nq, "nq_x_d": nq * dim, "blas_ms_per_query": round(blas, 4),
                      "sequential_ms_per_query": round(sequential, 4), "sequential_over_blas": round(sequential / blas, 3),
                      "library_takes": takes, "within_tolerance": chosen <= TOLERANCE * best})
        print(f"  d {dim:>4}  rows {rows:>9,}  nq {nq:>4}  nq x d {nq * dim:>7,}  BLAS {blas:9.3f} ms/query  "
              f"sequential {sequential:9.3f}  sequential/BLAS {sequential / blas:5.2f}  library: {takes}", flush=True)
    faiss.cvar.distance_compute_blas_threshold = tuned
    return lines


def crossover(lines: list[dict]) -> int | None:
    """The smallest nq x d from which BLAS is faster at this and every larger batch (None: never)."""
    found = None
    for line in sorted(lines, key=lambda x: x["nq"], reverse=True):
        if line["sequential_over_blas"] <= 1.0:
            break
        found = line["nq_x_d"]
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__)
    parser.add_argument("--shapes", nargs="+", type=shape, default=[(384, 10_000), (768, 100_000)],
                        metavar="DIMxROWS", help="database shapes (dimensions x rows)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    faiss = import_faiss()
    tuned = faiss.cvar.distance_compute_blas_threshold
    device = describe_device()
    print(device_line(device) + f"; faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads; "
          f"threshold: FAISS's default {FAISS_DEFAULT_BLAS_THRESHOLD:,}, the library's {tuned:,} (nq x d)")
    results = {"threshold": tuned, "faiss_default": FAISS_DEFAULT_BLAS_THRESHOLD, "shapes": {}}
    for dim, rows in args.shapes:
        lines = sweep(faiss, dim, rows, sorted(args.batches), args.repeats, tuned, args.seed)
        results["shapes"][f"{dim}x{rows}"] = {"lines": lines, "blas_wins_from_nq_x_d": crossover(lines)}
        print(f"  d {dim} x {rows:,} rows: BLAS faster from nq x d = {crossover(lines)}; at FAISS's default the "
              f"largest batch here ({max(args.batches)}) stays sequential: "
              f"{max(args.batches) * dim < FAISS_DEFAULT_BLAS_THRESHOLD}")
    every = [line for shape_ in results["shapes"].values() for line in shape_["lines"]]
    results["target_met"] = all(line["within_tolerance"] for line in every)
    print(f"target: the library's threshold takes the faster path (or one within {TOLERANCE - 1:.0%}) at every batch: "
          f"{'met' if results['target_met'] else 'NOT MET'}")
    write_json(args.json, "blas_threshold", args, device, results)
    return results


if __name__ == "__main__":
    main()
