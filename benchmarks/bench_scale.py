"""How cost grows with the corpus: Flat, HNSW and IVF-PQ over random e5-sized embeddings, projected to wiki-18.

A user moving from the 10k-passage default to wiki-18 (21,015,324 passages, e5-base's 768 dimensions, the corpus of
Search-R1 and Agentic-R) needs to know where memory and latency end up before building anything. This benchmark
measures each cost at a few sizes (`--sizes`, default 100k, 1M and 5M rows), fits a power law ``cost = a * N**b``
to each curve (least squares in log-log) and projects it to 21M with the fit's standard error of prediction
(a factor: with three sizes, one degree of freedom, so take it as a rough bar). Per size and index type, in a fresh
subprocess so that each peak RSS is its own:

* **build**: ``agentic_retriever.index.dense.fill_faiss_index`` (what every dense build runs once its embeddings are
  written) with the library's defaults for that type (`DenseParams`: HNSW64 with efConstruction 200 and efSearch
  128; IVF4096,PQ64x8 trained on 262,144 rows, nprobe 64) over N unit-norm random float32 vectors of `--dim`
  dimensions, seeded and written once to a memory-mapped ``.npy`` in the work folder (no encoder runs: this
  measures the index). Seconds, index bytes (what FAISS writes, counted: `serialized_bytes`), peak RSS (VmHWM,
  which counts the memory-mapped embeddings' pages read, reclaimable, beside the index) above the process's RSS
  before the build;
* **search**: ``index.search`` of random unit queries, one at a time (`--queries` calls) and 64 per call: ms per call;
* **the service**: `create_app` serving a `SearchIndex` that searches that same FAISS index, with the encoder
  replaced by a fixed cost (`--encoder-ms FIXED PER_QUERY`: a sleep of FIXED + PER_QUERY x queries per index
  call; the default, 2 + 4 ms, is MiniLM's on 2 CPU cores, about 240 queries/s), over a synthetic corpus of N
  rows; closed loops of one-query requests at 1 and 64 clients (`_service_load.closed_loop`; the clients share
  the server's process): requests/s and p50;
* **the row store** (once per size, up to `--corpus-max-rows`): N passages of about 100 words (wiki-18's
  length) in a JSONL file, converted to Arrow by ``Corpus.open`` (seconds, peak RSS), opened again from its cache
  (seconds, RSS) and read back 64 random rows at a time (``passages_at``, ms).

A (size, type) whose index, by its known bytes per row, would not fit in 80% of the memory available when the
benchmark starts is skipped and said so, as is one whose worker is killed (the out-of-memory killer: the other runs' figures are still written), as are
HNSW sizes above `--hnsw-max-rows` (HNSW's build on random 768-d vectors took 22 min at 300k rows on 2 cores; its
curve is projected from the sizes below). Physical limits:
the machine's read bandwidth, measured as a BLAS matrix-vector product over a 1 GiB float32 block (all threads),
against the bytes a Flat query scans (N x dim x 4): the Flat batch-1 search at each size is reported as a
multiple of that lower bound.

The ratio lines (`make bench`'s summary) are the Flat one-query search time over that bound at each size.
Outputs: a table per cost, the fits and the 21M projection on stdout; ``scale.json`` and ``scale.png`` (the
curves, log-log, with each fit extended to 21M) in `--out`. The embeddings and corpora are removed at the end
unless `--keep`.

    python benchmarks/bench_scale.py --out runs/bench_scale                      # 100k, 1M, 5M (memory allowing)
    python benchmarks/bench_scale.py --sizes 100000 300000 1000000 --types flat ivfpq --out runs/bench_scale
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np

from _common import (
    PeakSampler, base_parser, describe_device, device_line, finish_worker, fmt_bytes, random_unit_vectors, serve_worker,
    start_worker, usable_cores,
)

from agentic_retriever.base.jsonl import atomic_write, write_json
from agentic_retriever.index.dense import DenseParams, fill_faiss_index, set_search_knobs

WIKI18_ROWS = 21_015_324
E5_DIM = 768
TYPES = ("flat", "hnsw", "ivfpq")
_VOCABULARY = ("the of and in to was is for on as by with his at from that it an were which are this be also first "
               "had has their its after new other one two three year years city state school born team film during "
               "between university national world war american series album season including known called since "
               "under later united government music population river history number century county church league "
               "club game played public north south early member group system released company village town area "
               "party second family station career while based began located several district became title army "
               "record single book work used time would most against many final island king house built named "
               "founded original championship president french german english british general local published "
               "people following").split()


# ------------------------------------------------------------------------------------------ fits

def fit_power_law(sizes, values) -> dict:
    """Least-squares fit of ``log(value) = log(a) + b log(N)``: {"a", "b", "points", "residual_sd"} (the residual
    standard deviation in natural-log units; None with two points, which the line passes through exactly)."""
    x, y = np.log(np.asarray(sizes, dtype=float)), np.log(np.asarray(values, dtype=float))
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError(f"a power-law fit needs at least two distinct sizes, got {list(sizes)}")
    b, log_a = np.polyfit(x, y, 1)
    residuals = y - (log_a + b * x)
    sd = float(math.sqrt(float(residuals @ residuals) / (len(x) - 2))) if len(x) > 2 else None
    return {"a": float(math.exp(log_a)), "b": float(b), "points": len(x), "residual_sd": sd,
            "sizes": [int(s) for s in sizes]}


def project(fit: dict, rows: int) -> dict:
    """The fit's value at `rows` and its error factor: exp of the standard error of a new prediction in log space
    (``sd * sqrt(1 + 1/n + (x0 - mean x)^2 / Sxx)``); None when the fit has no residual degree of freedom."""
    value = fit["a"] * rows ** fit["b"]
    factor = None
    if fit["residual_sd"] is not None:
        x = np.log(np.asarray(fit["sizes"], dtype=float))
        spread = (x - x.mean()) ** 2
        se = fit["residual_sd"] * math.sqrt(1 + 1 / len(x) + (math.log(rows) - x.mean()) ** 2 / spread.sum())
        factor = math.exp(se)
    return {"rows": rows, "value": value, "error_factor": factor}


# ------------------------------------------------------------------------------------------ data

def random_embeddings(path: Path, rows: int, dim: int, seed: int = 0, chunk: int = 65_536) -> np.ndarray:
    """`rows` unit-norm random float32 vectors in a ``.npy`` memmap at `path` (written once; reused when its shape
    matches): what an encoder's output looks like to FAISS, without running one."""
    if path.is_file():
        existing = np.load(path, mmap_mode="r")
        if existing.shape == (rows, dim):
            return existing
    tmp = path.with_name(path.name + ".partial.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, dim))
    rng = np.random.default_rng(seed)
    for start in range(0, rows, chunk):
        block = rng.standard_normal((min(chunk, rows - start), dim), dtype=np.float32)
        out[start:start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    out.flush()
    del out
    os.replace(tmp, path)
    return np.load(path, mmap_mode="r")


def write_synthetic_corpus(path: Path, rows: int, words: int = 100, seed: int = 0, chunk: int = 50_000) -> None:
    """`rows` passages of `words` common-English words as the library's JSONL corpus (``id``, ``contents`` =
    ``"Title"\\ntext``), written once (kept when it is there)."""
    if path.is_file():
        return
    vocabulary = np.asarray(_VOCABULARY)
    rng = np.random.default_rng(seed)
    with atomic_write(path) as handle:
        for start in range(0, rows, chunk):
            count = min(chunk, rows - start)
            picks = vocabulary[rng.integers(0, len(vocabulary), size=(count, words + 2))]
            for offset, row in enumerate(picks):
                title = f"{row[0].capitalize()} {row[1].capitalize()}"
                handle.write(json.dumps({"id": str(start + offset), "contents": f'"{title}"\n' + " ".join(row[2:])})
                             + "\n")


def index_bytes_per_row(index_type: str, dim: int, hnsw_m: int, pq_m: int) -> float:
    """Resident bytes per indexed row: the vectors for Flat and HNSW (plus HNSW's level-0 links, 2M int32), PQ codes
    plus the stored id for IVF-PQ."""
    return {"flat": dim * 4, "hnsw": dim * 4 + 2 * hnsw_m * 4 * 1.1, "ivfpq": pq_m + 8}[index_type]


def serialized_bytes(index) -> int:
    """The bytes FAISS writes for `index` (its file size), counted as they are written: `faiss.serialize_index`
    would hold a copy of the whole index (at 5M rows of 768 dimensions, 15 GiB more: the first 5M Flat run was
    killed for it)."""
    import faiss

    count = 0

    def write(chunk: bytes) -> int:
        nonlocal count
        count += len(chunk)
        return len(chunk)

    writer = faiss.PyCallbackIOWriter(write)
    faiss.write_index(index, writer)
    del writer  # flushes its buffer into `write`
    return count


class WorkerKilled(RuntimeError):
    """A worker ended by a signal: at these sizes, the kernel's out-of-memory killer."""


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (bytes); total physical memory elsewhere."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def read_bandwidth(gib: float, repeats: int = 5) -> float:
    """Bytes/s a BLAS matrix-vector product reads from a `gib` GiB float32 block (all threads; the best of
    `repeats`): the rate at which a Flat index can at best be scanned for one query."""
    rows = int(gib * (1 << 30)) // (E5_DIM * 4)
    block = np.random.default_rng(1).standard_normal((rows, E5_DIM), dtype=np.float32)
    vector = np.ones(E5_DIM, dtype=np.float32)
    block @ vector  # first touch
    best = min(_timed(lambda: block @ vector) for _ in range(repeats))
    return block.nbytes / best


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------------ worker side

def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def build_and_search(args: dict) -> dict:
    """One (size, type): build the index from the embeddings, time its searches and the service over it."""
    embeddings = np.load(args["embeddings"], mmap_mode="r")
    params = DenseParams(type=args["type"], **args.get("params", {}))
    before = _rss()
    sampler = PeakSampler()
    sampler.start()
    started = time.perf_counter()
    index = fill_faiss_index(params, embeddings, chunk=65_536)
    build_s = time.perf_counter() - started
    peak = sampler.stop().get("VmHWM", 0)
    del embeddings
    set_search_knobs(index, params)
    result = {"build_s": build_s, "index_bytes": serialized_bytes(index),
              "build_peak_rss_above_start": max(0, peak - before), "rss_after_build": _rss()}
    rng = np.random.default_rng(7)
    queries = random_unit_vectors(max(args["queries"], 64), index.d, rng)
    index.search(queries[:1], args["topk"])  # first touch
    one = [_timed(lambda q=q: index.search(q[None], args["topk"])) for q in queries[:args["queries"]]]
    batch = [_timed(lambda: index.search(queries[:64], args["topk"])) for _ in range(max(1, args["queries"] // 16))]
    result.update(search_batch1_ms=1000 * float(np.median(one)), search_batch64_ms=1000 * float(np.median(batch)))
    if args.get("corpus"):
        result.update(service_over(index, args))
    return result


def service_over(index, args: dict) -> dict:
    """Requests/s and p50 of `create_app` over `index` (queries: random vectors; encoder: a fixed sleep) at 1 and
    64 clients sending one-query requests."""
    from _service_load import closed_loop

    from agentic_retriever.base.corpus import Corpus
    from agentic_retriever.index.base import SearchIndex
    from agentic_retriever.index.manifest import IndexManifest
    from agentic_retriever.server import ServerThread, create_app

    fixed_s, per_query_s = (ms / 1000 for ms in args["encoder_ms"])

    class FixedCostEncoderIndex(SearchIndex):
        """The FAISS index searched for random unit queries after a sleep standing in for the encoder."""

        def __init__(self, corpus: Corpus):
            manifest = IndexManifest(backend="dense", index_type=args["type"], rows=index.ntotal,
                                     corpus_path=str(corpus.source), corpus_sha256=corpus.sha256, dim=index.d)
            super().__init__(manifest, corpus)
            self.rng = np.random.default_rng(3)

        def search_rows(self, queries, k, questions=None, histories=None):
            time.sleep(fixed_s + per_query_s * len(queries))
            vectors = self.rng.standard_normal((len(queries), index.d), dtype=np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            return index.search(vectors, k)

    corpus = Corpus.open(args["corpus"], cache_dir=args["corpus_cache"])
    texts = [f"query {i}" for i in range(256)]
    figures = {}
    with ServerThread(create_app(FixedCostEncoderIndex(corpus))) as url:
        for clients in (1, 64):
            per_client = max(5, args["service_requests"] // clients)
            run = asyncio.run(closed_loop(url, texts, clients, per_client, args["topk"]))
            if run["errors"]:
                raise RuntimeError(f"the service answered {run['errors']} requests with errors: {run['first_errors']}")
            figures[f"service_{clients}_rps"] = run["requests_per_s"]
            figures[f"service_{clients}_p50_ms"] = run["p50_ms"]
    return figures


def row_store(args: dict) -> dict:
    """Convert the synthetic JSONL corpus to Arrow, open it again, and read random rows."""
    from agentic_retriever.base.corpus import Corpus

    sampler = PeakSampler()
    sampler.start()
    started = time.perf_counter()
    rows = len(Corpus.open(args["corpus"], cache_dir=args["corpus_cache"]))
    convert_s = time.perf_counter() - started
    convert_peak = sampler.stop().get("VmHWM", 0)
    before = _rss()
    started = time.perf_counter()
    corpus = Corpus.open(args["corpus"], cache_dir=args["corpus_cache"])
    open_s = time.perf_counter() - started
    rng = np.random.default_rng(5)
    reads = [_timed(lambda: corpus.passages_at(np.sort(rng.integers(0, rows, 64)))) for _ in range(50)]
    return {"rows": rows, "corpus_bytes": os.path.getsize(args["corpus"]), "convert_s": convert_s,
            "convert_peak_rss": convert_peak, "open_s": open_s, "open_rss_growth": max(0, _rss() - before),
            "read64_ms": 1000 * float(np.median(reads))}


def worker(name: str, args: dict) -> dict:
    return row_store(args) if name.startswith("row-store") else build_and_search(args)


# ------------------------------------------------------------------------------------------ parent side

#: (figure key, label, unit) of the curves fitted and plotted, per index type; the row store's apart.
INDEX_FIGURES = (("build_s", "build", "s"), ("index_bytes", "index size", "bytes"),
                 ("build_peak_rss_above_start", "build peak RSS", "bytes"),
                 ("search_batch1_ms", "search, 1 query", "ms"), ("search_batch64_ms", "search, 64 queries", "ms"),
                 ("service_1_rps", "service, 1 client", "req/s"), ("service_64_rps", "service, 64 clients", "req/s"))
ROW_STORE_FIGURES = (("convert_s", "corpus to Arrow", "s"), ("convert_peak_rss", "conversion peak RSS", "bytes"),
                     ("open_s", "corpus open", "s"), ("open_rss_growth", "RSS after open", "bytes"),
                     ("read64_ms", "64 random rows", "ms"))


def run_worker(name: str, args: dict, work: Path, threads: int) -> dict:
    """The figures of worker `name`; `WorkerKilled` when a signal ended it, RuntimeError when it failed."""
    log = work / f"{name}.log"
    process = start_worker(__file__, name, args, threads, log)
    try:
        return finish_worker(process, name, log)
    except RuntimeError as error:
        if process.returncode is not None and process.returncode < 0:
            raise WorkerKilled(f"killed by signal {-process.returncode} (out of memory?)") from error
        raise


def measure(cli, work: Path) -> dict:
    """Every (size, type) and row store the memory allows; returns {"runs": [...], "skipped": [...]}."""
    params = {"hnsw": {}, "ivfpq": {}, "flat": {}}
    if cli.dim % 64:
        params["ivfpq"] = {"pq_m": next(m for m in (32, 16, 8, 4, 2, 1) if cli.dim % m == 0)}
    memory = available_memory()
    runs, skipped = [], []
    threads = usable_cores()
    for rows in cli.sizes:
        embeddings = random_embeddings(work / f"embeddings-{rows}x{cli.dim}.npy", rows, cli.dim)
        del embeddings
        corpus = None
        if rows <= cli.corpus_max_rows:
            corpus = work / f"corpus-{rows}.jsonl"
            write_synthetic_corpus(corpus, rows)
            figures = run_worker(f"row-store-{rows}", {"corpus": str(corpus), "corpus_cache": str(work / "cache")},
                                 work, threads)
            runs.append({"rows": rows, "type": "row store", **figures})
            print(f"row store {rows:>10,}: " + _line(figures, ROW_STORE_FIGURES), flush=True)
        for index_type in cli.types:
            built = DenseParams(type=index_type, **params[index_type])
            bytes_needed = rows * index_bytes_per_row(index_type, cli.dim, built.hnsw_m, built.pq_m)
            if index_type == "hnsw" and rows > cli.hnsw_max_rows:
                skipped.append(f"{rows:,} rows, hnsw: above --hnsw-max-rows {cli.hnsw_max_rows:,}")
                continue
            if bytes_needed > 0.8 * memory:
                skipped.append(f"{rows:,} rows, {index_type}: needs about {fmt_bytes(bytes_needed)}, 80% of available "
                               f"memory is {fmt_bytes(0.8 * memory)}")
                continue
            args = {"embeddings": str(work / f"embeddings-{rows}x{cli.dim}.npy"), "type": index_type,
                    "params": params[index_type], "queries": cli.queries, "topk": cli.topk,
                    "encoder_ms": cli.encoder_ms, "service_requests": cli.service_requests,
                    "corpus": str(corpus) if corpus else None, "corpus_cache": str(work / "cache")}
            try:
                figures = run_worker(f"{index_type}-{rows}", args, work, threads)
            except WorkerKilled as killed:  # the figures of the other sizes and types still count
                skipped.append(f"{rows:,} rows, {index_type}: {killed}")
                print(f"{index_type:>9} {rows:>10,}: {killed}", flush=True)
                continue
            runs.append({"rows": rows, "type": index_type, **figures})
            print(f"{index_type:>9} {rows:>10,}: " + _line(figures, INDEX_FIGURES), flush=True)
        if not cli.keep:
            (work / f"embeddings-{rows}x{cli.dim}.npy").unlink(missing_ok=True)
    return {"runs": runs, "skipped": skipped}


def _fmt(value: float, unit: str) -> str:
    return fmt_bytes(value) if unit == "bytes" else f"{value:,.4g} {unit}"


def _line(figures: dict, keys) -> str:
    return ", ".join(f"{label} {_fmt(figures[key], unit)}" for key, label, unit in keys if key in figures)


def fits_and_projections(runs: list[dict], target: int) -> list[dict]:
    """A power-law fit of every figure of every type over its sizes (two or more), projected to `target` rows."""
    out = []
    for kind, keys in [(t, INDEX_FIGURES) for t in TYPES] + [("row store", ROW_STORE_FIGURES)]:
        for key, label, unit in keys:
            points = [(run["rows"], run[key]) for run in runs if run["type"] == kind and run.get(key)]
            if len({rows for rows, _ in points}) < 2:
                continue
            fit = fit_power_law(*zip(*points))
            out.append({"type": kind, "figure": key, "label": label, "unit": unit, "fit": fit,
                        "projection": project(fit, target)})
    return out


def plot(runs: list[dict], fits: list[dict], target: int, path: Path) -> None:
    """One log-log panel per figure: the measured points per type and each fit extended to `target` rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(key, label, unit) for key, label, unit in INDEX_FIGURES + ROW_STORE_FIGURES
              if any(key in run for run in runs)]
    columns = 4
    lines = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.4 * lines), squeeze=False)
    for axis, (key, label, unit) in zip(axes.flat, panels):
        for kind in TYPES + ("row store",):
            points = sorted((run["rows"], run[key]) for run in runs if run["type"] == kind and run.get(key))
            if not points:
                continue
            line, = axis.plot(*zip(*points), "o", label=kind)
            fit = next((f for f in fits if f["type"] == kind and f["figure"] == key), None)
            if fit:
                xs = np.geomspace(points[0][0], target, 32)
                axis.plot(xs, fit["fit"]["a"] * xs ** fit["fit"]["b"], "--", color=line.get_color(), linewidth=1)
        axis.axvline(target, color="grey", linewidth=0.8, linestyle=":")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(label, fontsize=10)
        axis.set_xlabel("rows")
        axis.set_ylabel(unit)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    fig.suptitle(f"cost against corpus size; dashed: power-law fits to {target:,} rows (dotted line)", fontsize=11)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".partial.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--out", default="runs/bench_scale", help="work folder: data, logs, scale.json, scale.png")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    parser.add_argument("--types", nargs="+", choices=TYPES, default=list(TYPES))
    parser.add_argument("--dim", type=int, default=E5_DIM, help="embedding dimensions (e5-base: 768)")
    parser.add_argument("--hnsw-max-rows", type=int, default=1_000_000, help="largest size HNSW is built at")
    parser.add_argument("--corpus-max-rows", type=int, default=1_000_000,
                        help="largest size the row store (and so the service) is measured at")
    parser.add_argument("--queries", type=int, default=64, help="one-query searches timed per size and type")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--encoder-ms", type=float, nargs=2, default=[2.0, 4.0], metavar=("FIXED", "PER_QUERY"),
                        help="the service's stand-in encoder cost per index call")
    parser.add_argument("--service-requests", type=int, default=640, help="requests per client count")
    parser.add_argument("--target", type=int, default=WIKI18_ROWS, help="rows the fits are projected to")
    parser.add_argument("--bandwidth-gib", type=float, default=1.0,
                        help="size of the block the read bandwidth is timed on")
    parser.add_argument("--keep", action="store_true", help="keep the embeddings and corpora")
    cli = parser.parse_args()
    print(device_line(device := describe_device()), flush=True)
    work = Path(cli.out)
    work.mkdir(parents=True, exist_ok=True)
    bandwidth = read_bandwidth(cli.bandwidth_gib)
    print(f"read bandwidth (BLAS matrix-vector product over {cli.bandwidth_gib:g} GiB): {bandwidth / 1e9:.2f} GB/s",
          flush=True)
    measured = measure(cli, work)
    for run in measured["runs"]:
        if run["type"] == "flat":
            run["flat_scan_bound_ms"] = 1000 * run["rows"] * cli.dim * 4 / bandwidth
            run["search_batch1_vs_bound"] = run["search_batch1_ms"] / run["flat_scan_bound_ms"]
    fits = fits_and_projections(measured["runs"], cli.target)
    for reason in measured["skipped"]:
        print(f"skipped: {reason}")
    print(f"\nprojected to {cli.target:,} rows (power law a * N^b; error factor: one standard error of prediction)")
    for item in fits:
        projection, fit = item["projection"], item["fit"]
        bar = f"x/÷ {projection['error_factor']:.2f}" if projection["error_factor"] else "(2 sizes: no error estimate)"
        print(f"  {item['type']:>9} {item['label']:<22} b = {fit['b']:.2f}  ->  "
              f"{_fmt(projection['value'], item['unit'])} {bar}")
    for run in measured["runs"]:
        if "search_batch1_vs_bound" in run:
            print(f"ratio Flat one-query search / read-bandwidth bound at {run['rows']:,} rows: "
                  f"{run['search_batch1_vs_bound']:.2f}x ({run['search_batch1_ms']:.2f} ms against "
                  f"{run['flat_scan_bound_ms']:.2f} ms to read {fmt_bytes(run['rows'] * cli.dim * 4)})")
    plot(measured["runs"], fits, cli.target, work / "scale.png")
    payload = {"benchmark": "bench_scale", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": device,
               "args": {k: v for k, v in vars(cli).items() if k != "json"}, "read_bandwidth_bytes_per_s": bandwidth,
               **measured, "fits": fits}
    for path in filter(None, (work / "scale.json", cli.json)):
        write_json(path, payload)
    if not cli.keep:
        for path in list(work.glob("corpus-*.jsonl")) + [work / "cache"]:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    print(f"figures: {work / 'scale.json'}, plot: {work / 'scale.png'}")


if __name__ == "__main__":
    if not serve_worker(worker):
        main()
