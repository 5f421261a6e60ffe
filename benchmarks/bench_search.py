"""Dense search speed and accuracy: FAISS HNSW against exact Flat inner product on the same vectors.

Measures queries/s of a batch search and of one-query-at-a-time search for Flat and for HNSW (built with
the library's DenseParams defaults: M=64, efConstruction=200) at several efSearch values, and HNSW's
recall@k against Flat's exact top-k. Vectors are seeded random unit vectors (the hard case for HNSW: no
cluster structure) or, with --index / --vectors, real embeddings, with held-out rows as queries.
Ratio = HNSW qps / Flat qps. Target: HNSW faster than Flat (ratio > 1x) at recall@10 >= 0.9 for
efSearch >= 64 on real embeddings.
"""

from __future__ import annotations

import time

import numpy as np

from _common import alternate, base_parser, describe_device, device_line, random_unit_vectors, summarize, write_json


def real_vectors(args, faiss) -> tuple[np.ndarray, str]:
    if args.index:
        from agentic_retriever.index.dense import FAISS_FILE
        from agentic_retriever.index.manifest import IndexManifest

        path = IndexManifest.load(args.index).data_folder(args.index) / FAISS_FILE  # the generation it names
        index = faiss.read_index(str(path))
        if not isinstance(index, (faiss.IndexFlat, faiss.IndexHNSWFlat)):
            raise SystemExit(f"{path}: need a flat or hnsw index to read the vectors back, got {type(index).__name__}")
        return index.reconstruct_n(0, index.ntotal), str(path)
    return np.load(args.vectors, mmap_mode="r"), str(args.vectors)


def load_data(args, faiss) -> tuple[np.ndarray, np.ndarray, str]:
    """(database, queries, description)."""
    rng = np.random.default_rng(args.seed)
    if not (args.index or args.vectors):
        database = random_unit_vectors(args.rows, args.dim, rng)
        queries = random_unit_vectors(args.queries, args.dim, rng)
        return database, queries, f"random unit vectors, seed {args.seed}"
    vectors, source = real_vectors(args, faiss)
    if len(vectors) <= args.queries:
        raise SystemExit(f"{source} has {len(vectors)} vectors: need more than --queries {args.queries}")
    order = rng.permutation(len(vectors))
    queries = np.ascontiguousarray(vectors[np.sort(order[:args.queries])], dtype=np.float32)
    kept = np.sort(order[args.queries:args.queries + args.rows])
    database = np.ascontiguousarray(vectors[kept], dtype=np.float32)
    return database, queries, f"{source} ({len(vectors)} vectors; {args.queries} random rows held out as queries)"


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    hits = sum(len(np.intersect1d(f[f >= 0], e[e >= 0])) for f, e in zip(found, exact))
    return hits / exact.size


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--rows", type=int, default=100_000, help="database vectors (a cap for real vectors)")
    parser.add_argument("--dim", type=int, default=384, help="dimension of random vectors (384 = MiniLM)")
    parser.add_argument("--queries", type=int, default=1000, help="queries in the batch search")
    parser.add_argument("--single-queries", type=int, default=200, help="queries searched one at a time")
    parser.add_argument("--k", type=int, default=10, help="hits per query (recall@k)")
    parser.add_argument("--ef-search", type=int, nargs="+", default=[16, 64, 128], help="HNSW efSearch values")
    parser.add_argument("--hnsw-m", type=int, default=None, help="HNSW M (default: DenseParams.hnsw_m)")
    parser.add_argument("--ef-construction", type=int, default=None, help="HNSW efConstruction (default: DenseParams)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each contender (alternating)")
    parser.add_argument("--seed", type=int, default=0)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--index", metavar="DIR", help="a flat or hnsw index folder built by agentic_retriever")
    source.add_argument("--vectors", metavar="NPY", help="a .npy file of embeddings (e.g. kept passage embeddings)")
    args = parser.parse_args()

    from agentic_retriever.index.dense import DenseParams, import_faiss

    faiss = import_faiss()
    defaults = DenseParams()
    m = args.hnsw_m or defaults.hnsw_m
    ef_construction = args.ef_construction or defaults.ef_construction
    device = describe_device()
    database, queries, source_text = load_data(args, faiss)
    rows, dim = database.shape
    k = args.k
    print(f"search benchmark: {rows} x {dim} database, {len(queries)} queries, k={k}; {source_text}")
    print(device_line(device) + f"; faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads")

    started = time.perf_counter()
    flat = faiss.IndexFlatIP(dim)
    flat.add(database)
    flat_build = time.perf_counter() - started
    started = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = ef_construction
    hnsw.add(database)
    hnsw_build = time.perf_counter() - started
    print(f"  build: Flat {flat_build:.2f}s, HNSW(M={m}, efConstruction={ef_construction}) {hnsw_build:.1f}s")

    _, exact = flat.search(queries, k)
    found: dict[int, np.ndarray] = {}
    single = queries[:args.single_queries]

    def batch_run(ef: int | None):
        if ef is None:
            return lambda: flat.search(queries, k)

        def run():
            hnsw.hnsw.efSearch = ef
            found[ef] = hnsw.search(queries, k)[1]
        return run

    def single_run(ef: int | None):
        index = flat if ef is None else hnsw

        def run():
            if ef is not None:
                hnsw.hnsw.efSearch = ef
            for i in range(len(single)):
                index.search(single[i:i + 1], k)
        return run

    contenders = [None, *args.ef_search]
    name = {ef: "flat" if ef is None else f"hnsw_ef{ef}" for ef in contenders}
    batch = alternate({name[ef]: batch_run(ef) for ef in contenders}, repeats=args.repeats)
    one = alternate({name[ef]: single_run(ef) for ef in contenders}, repeats=args.repeats)
    results = {"rows": rows, "dim": dim, "queries": len(queries), "single_queries": len(single), "k": k,
               "source": source_text, "hnsw_m": m, "ef_construction": ef_construction,
               "flat_build_s": flat_build, "hnsw_build_s": hnsw_build, "faiss": faiss.__version__,
               "omp_threads": faiss.omp_get_max_threads(), "contenders": {}}
    for ef in contenders:
        entry = {"batch": summarize(batch[name[ef]], len(queries)), "single": summarize(one[name[ef]], len(single))}
        if ef is not None:
            entry["recall_at_k"] = recall_at_k(found[ef], exact)
            entry["ratio_batch"] = entry["batch"]["median_per_s"] / results["contenders"]["flat"]["batch"]["median_per_s"]
            entry["ratio_single"] = entry["single"]["median_per_s"] / results["contenders"]["flat"]["single"]["median_per_s"]
        results["contenders"][name[ef]] = entry

    print(f"  {'index':12s} {'batch q/s':>11s} {'single q/s':>11s} {f'recall@{k}':>13s} "
          f"{'ratio batch':>12s} {'ratio single':>13s}   (median of {args.repeats}; ratio = HNSW / Flat)")
    for ef in contenders:
        e = results["contenders"][name[ef]]
        recall = "1.000 (exact)" if ef is None else f"{e['recall_at_k']:.3f}"
        ratios = "" if ef is None else f"{e['ratio_batch']:11.2f}x {e['ratio_single']:12.2f}x"
        print(f"  {name[ef]:12s} {e['batch']['median_per_s']:11.1f} {e['single']['median_per_s']:11.1f} {recall:>13s} {ratios}")
    summary = ", ".join(f"ef{ef}: {results['contenders'][name[ef]]['ratio_batch']:.2f}x batch / "
                        f"{results['contenders'][name[ef]]['ratio_single']:.2f}x single at recall@{k} "
                        f"{results['contenders'][name[ef]]['recall_at_k']:.3f}" for ef in args.ef_search)
    if not (args.index or args.vectors):
        print("  note: uniform random vectors have no structure, HNSW's worst case; recall on real embeddings is "
              "far higher at the same efSearch (try --index DIR)")
    print(f"RATIO HNSW/Flat qps: {summary}")
    write_json(args.json, "search", args, device, results)


if __name__ == "__main__":
    main()
