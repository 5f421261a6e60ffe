"""Retrieval service: swapping the served index under load (``POST /admin/swap-index``), against the same load
without swaps measured just before in the same process.

The service (`create_app` with an admin token, the service's default batching) runs on 127.0.0.1 in this process
over `--index`. Before anything is measured, one-query requests record each query's top-k ids on index A, then
on index B (`--index-b`; without it A's folder again, which still measures the cost of loading and swapping
but cannot show a mixed answer), and the service swaps back to A. Then `--clients` keep-alive connections
(cheap raw HTTP/1.1 clients, `_service_load.py`) send requests of `--queries-per-request` queries back to back:
first a baseline window of `--baseline-s` seconds without swaps, then `--swaps` swaps A -> B -> A ..., each
after `--gap-s` seconds, each waited for (`swap_index`), and `--gap-s` more at the end.

Prints: requests answered during the swaps (from each swap call's start to its end), failed requests (any
non-200 or connection error: must be 0), mixed answers (some queries answered as A and others as B in one
answer: must be 0), answers whose ``X-Index-Generation`` header names the other index (must be 0), answers
matching neither index's recorded ids (float noise in a dense encoder's batched scores can reorder near ties),
p50/p95/p99 latency of the requests sent in the baseline window and of those in flight during a swap, their
ratios (the latency spike), requests/s in both, and each swap's load time (the server's ``load_s``) and call
time, with the device and load average.

    python benchmarks/bench_swap.py --smoke                          # builds two small MiniLM indexes
    python benchmarks/bench_swap.py --index runs/r1/iter_1/index --index-b runs/r1/iter_2/index --json swap.json

`--smoke` indexes `--passages` synthetic passages (default 300) twice in a temporary folder, removed at the
end, with the embedded default MiniLM encoder: index A under ids a0.., index B under ids b0.. (the same cost per
query, so the latency ratio is the swap's alone, and every answer tells its index). Only loopback traffic;
stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import tempfile
import time
from pathlib import Path

from _common import base_parser, describe_device, device_line, synthetic_passages, write_json
from _service_load import RawConnection, host_port, load_average, percentile
from bench_service import make_queries

from agentic_retriever.index import IndexBuildConfig, IndexManifest, build_index, open_index
from agentic_retriever.server import GENERATION_HEADER, ServeConfig, ServerThread, create_app, swap_index

TOKEN = "bench-swap"


def build_smoke_indexes(workdir: Path, passages: int) -> tuple[str, str]:
    """Indexes A and B: the default MiniLM encoder over the same synthetic passages, under ids a0.. and b0.. (the
    same search cost, and every answer tells which index gave it)."""
    texts = synthetic_passages(passages)
    started = time.perf_counter()
    for name in ("a", "b"):
        corpus = workdir / f"corpus_{name}.jsonl"
        corpus.write_text("".join(json.dumps({"id": f"{name}{i}", "contents": t}) + "\n" for i, t in enumerate(texts)))
        build_index(IndexBuildConfig(corpus=str(corpus), out=str(workdir / f"index_{name}")))
    print(f"built the smoke indexes (MiniLM Flat, {passages} synthetic passages, ids a0.. and b0..) in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    return str(workdir / "index_a"), str(workdir / "index_b")


async def _answers_one_by_one(url: str, queries: list[str], topk: int) -> tuple[dict[str, list[str]], int]:
    """Each query's top-k ids from one-query requests (one query cannot be answered by two indexes), and the
    generation that answered them."""
    connection = RawConnection(*host_port(url))
    answers, generations = {}, set()
    try:
        for query in queries:
            status, content = await connection.post_json("/retrieve", {"queries": [query], "topk": topk})
            if status != 200:
                raise RuntimeError(f"recording the answers failed: {status} {content[:200]!r}")
            answers[query] = [hit["id"] for hit in json.loads(content)["result"][0]]
            generations.add(int(connection.headers[GENERATION_HEADER.lower()]))
    finally:
        await connection.close()
    if len(generations) != 1:
        raise RuntimeError(f"the answers came from generations {sorted(generations)} while nothing swapped")
    return answers, generations.pop()


def _judge(queries: list[str], ids: list[list[str]], generation: int, expected: dict[str, dict[str, list[str]]],
           distinct: bool) -> str:
    """'ok', 'mixed' (some queries answered as A, others as B), 'header' (the content is the index the header
    does not name) or 'neither' (some query matches no index's recorded ids)."""
    candidates = {"A", "B"}
    for query, got in zip(queries, ids):
        matches = {name for name in ("A", "B") if expected[name][query] == got}
        if not matches:
            return "neither"
        candidates &= matches
    if not candidates:
        return "mixed"
    named = "A" if generation % 2 == 0 else "B"
    return "ok" if named in candidates or not distinct else "header"


async def run_load(url: str, folders: dict[str, str], queries: list[str], args) -> dict:
    """The baseline window, then the swaps, under `args.clients` closed-loop clients; every request recorded."""
    host, port = host_port(url)
    rng = random.Random(args.seed)
    requests: list[dict] = []
    stop = asyncio.Event()

    async def client(c: int) -> None:
        connection = RawConnection(host, port)
        local = random.Random(rng.random())
        try:
            while not stop.is_set():
                batch = [local.choice(queries) for _ in range(args.queries_per_request)]
                started = time.perf_counter()
                record = {"start": started, "queries": batch}
                try:
                    status, content = await connection.post_json("/retrieve", {"queries": batch, "topk": args.topk})
                except (OSError, asyncio.IncompleteReadError) as error:
                    record |= {"end": time.perf_counter(), "error": f"{type(error).__name__}: {error}"}
                    await connection.close()
                    connection = RawConnection(host, port)
                else:
                    record["end"] = time.perf_counter()
                    if status != 200:
                        record["error"] = f"{status}: {content[:200]!r}"
                    else:
                        record["generation"] = int(connection.headers[GENERATION_HEADER.lower()])
                        record["ids"] = [[hit["id"] for hit in hits] for hits in json.loads(content)["result"]]
                requests.append(record)
        finally:
            await connection.close()

    clients = [asyncio.create_task(client(c)) for c in range(args.clients)]
    baseline_start = time.perf_counter()
    await asyncio.sleep(args.baseline_s)
    baseline_end = time.perf_counter()
    swaps = []
    for s in range(args.swaps):
        await asyncio.sleep(args.gap_s)
        target = folders["B" if s % 2 == 0 else "A"]
        started = time.perf_counter()
        answer = await asyncio.to_thread(swap_index, url, target, TOKEN)
        swaps.append({"start": started, "end": time.perf_counter(), "load_s": answer["load_s"],
                      "generation": answer["generation"]})
    await asyncio.sleep(args.gap_s)
    stop.set()
    await asyncio.gather(*clients)
    return {"requests": requests, "baseline": (baseline_start, baseline_end), "swaps": swaps}


def summarize(load: dict, expected: dict, distinct: bool) -> dict:
    """The figures of one run: counts, latency percentiles in the baseline window and during swaps, ratios."""
    requests, (b0, b1), swaps = load["requests"], load["baseline"], load["swaps"]
    windows = [(s["start"], s["end"]) for s in swaps]
    baseline = [r for r in requests if b0 <= r["start"] < b1]
    during = [r for r in requests if any(r["start"] < end and r["end"] > start for start, end in windows)]
    served_during = [r for r in requests
                     if "error" not in r and any(start <= r["end"] <= end for start, end in windows)]
    verdicts = {"ok": 0, "mixed": 0, "header": 0, "neither": 0}
    for r in requests:
        if "error" not in r:
            verdicts[_judge(r["queries"], r["ids"], r["generation"], expected, distinct)] += 1

    def latency(rows: list[dict]) -> dict:
        ms = [(r["end"] - r["start"]) * 1000 for r in rows if "error" not in r]
        return {p: round(percentile(ms, q), 2) if ms else None for p, q in (("p50_ms", 50), ("p95_ms", 95),
                                                                              ("p99_ms", 99))}

    swap_s = sum(end - start for start, end in windows)
    figures = {
        "requests": len(requests), "failed": sum("error" in r for r in requests),
        "first_errors": [r["error"] for r in requests if "error" in r][:3],
        "served_during_swaps": len(served_during), "swap_window_s": round(swap_s, 3),
        "mixed": verdicts["mixed"], "header_disagrees": verdicts["header"], "matches_neither": verdicts["neither"],
        "generations_seen": sorted({r["generation"] for r in requests if "generation" in r}),
        "baseline": {"requests": len(baseline), "requests_per_s": round(len(baseline) / (b1 - b0), 1),
                     **latency(baseline)},
        "during_swaps": {"requests": len(during),
                         "requests_per_s": round(len(served_during) / swap_s, 1) if swap_s else None,
                         **latency(during)},
        "swaps": [{"generation": s["generation"], "load_s": s["load_s"], "call_s": round(s["end"] - s["start"], 3)}
                  for s in swaps],
    }
    figures["ratios"] = {p: round(figures["during_swaps"][p] / figures["baseline"][p], 3)
                         if figures["during_swaps"][p] and figures["baseline"][p] else None
                         for p in ("p50_ms", "p95_ms", "p99_ms")}
    return figures


def report(figures: dict, distinct: bool) -> None:
    b, d, r = figures["baseline"], figures["during_swaps"], figures["ratios"]
    print(f"requests: {figures['requests']} in all; answered during the swaps: {figures['served_during_swaps']} "
          f"(in {figures['swap_window_s']:.2f} s of swap calls); generations seen {figures['generations_seen']}")
    first = f"; first: {figures['first_errors']}" if figures["failed"] else ""
    print(f"failed requests: {figures['failed']} (must be 0){first}")
    if distinct:
        print(f"mixed answers: {figures['mixed']} (must be 0); header naming the other index: "
              f"{figures['header_disagrees']} (must be 0); matching neither index's recorded ids: "
              f"{figures['matches_neither']}")
    else:
        print("mixed answers: not measurable (A and B are the same folder: --index-b names a different index)")
    print(f"{'':<14}{'requests':>9}{'req/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}")
    for name, row in (("baseline", b), ("during swaps", d)):
        print(f"{name:<14}{row['requests']:>9}{row['requests_per_s'] or 0:>9.1f}{row['p50_ms'] or 0:>9.2f}"
              f"{row['p95_ms'] or 0:>9.2f}{row['p99_ms'] or 0:>9.2f}")
    print(f"latency during swaps / baseline: p50 {r['p50_ms']}x, p95 {r['p95_ms']}x, p99 {r['p99_ms']}x")
    for swap in figures["swaps"]:
        print(f"swap to generation {swap['generation']}: load {swap['load_s']:.3f} s (server), "
              f"call {swap['call_s']:.3f} s")


async def measure(url: str, folders: dict[str, str], queries: list[str], args) -> tuple[dict, bool]:
    """Record each index's answers, then run the measured load; returns the figures and whether A and B differ."""
    expected = {}
    expected["A"], _ = await _answers_one_by_one(url, queries, args.topk)
    await asyncio.to_thread(swap_index, url, folders["B"], TOKEN)
    expected["B"], _ = await _answers_one_by_one(url, queries, args.topk)
    await asyncio.to_thread(swap_index, url, folders["A"], TOKEN)  # generation 2: A again, even generations are A
    distinct = any(expected["A"][q] != expected["B"][q] for q in queries)
    load = await run_load(url, folders, queries, args)
    return summarize(load, expected, distinct), distinct


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__)
    parser.add_argument("--index", help="index folder A, served first (required unless --smoke)")
    parser.add_argument("--index-b", help="index folder B, swapped in and out (default: A's folder again)")
    parser.add_argument("--smoke", action="store_true", help="build two small MiniLM indexes A and B (the same "
                                                             "passages under other ids) in a temporary folder")
    parser.add_argument("--passages", type=int, default=300, help="--smoke: synthetic passages in the indexes")
    parser.add_argument("--clients", type=int, default=16, help="concurrent keep-alive clients")
    parser.add_argument("--swaps", type=int, default=3, help="swaps measured (A -> B -> A ...)")
    parser.add_argument("--baseline-s", type=float, default=10.0, help="seconds of load without swaps first")
    parser.add_argument("--gap-s", type=float, default=3.0, help="seconds of load before each swap and after the last")
    parser.add_argument("--queries-per-request", type=int, default=4)
    parser.add_argument("--queries", type=int, default=200, help="distinct queries the clients draw from")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--max-batch-queries", type=int, default=ServeConfig().max_batch_queries,
                        help="the server's batch bound (a request larger than it is searched in chunks)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.index and not args.smoke:
        parser.error("give --index DIR (and --index-b DIR), or --smoke")
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench_swap_") as tmp:
        if args.smoke and not args.index:
            args.index, args.index_b = build_smoke_indexes(Path(tmp), args.passages)
        folders = {"A": str(Path(args.index).resolve()), "B": str(Path(args.index_b or args.index).resolve())}
        index = open_index(folders["A"])
        device = describe_device() | {"load_average_at_start": load_average()}
        print(f"{device_line(device)}; load average {device['load_average_at_start']}")
        for name, folder in folders.items():
            m = IndexManifest.load(folder)
            print(f"index {name}: {m.backend}/{m.index_type}, {m.rows} passages, encoder "
                  f"{(m.encoder or {}).get('model')} ({folder})")
        queries = make_queries(index, args.queries, random.Random(args.seed))
        print(f"load: {args.clients} clients, requests of {args.queries_per_request} queries (topk {args.topk}) back "
              f"to back; baseline {args.baseline_s:g} s, then {args.swaps} swaps {args.gap_s:g} s apart; service "
              f"defaults (batching, max_batch_queries {args.max_batch_queries})", flush=True)
        app = create_app(index, max_batch_queries=args.max_batch_queries, admin_token=TOKEN)
        del index  # the service holds it; a swap must be able to free it
        with ServerThread(app) as url:
            figures, distinct = asyncio.run(measure(url, folders, queries, args))
    report(figures, distinct)
    device["load_average_at_end"] = load_average()
    print(f"load average at the end: {device['load_average_at_end']}")
    write_json(args.json, "bench_swap", args, device, figures)
    return figures


if __name__ == "__main__":
    main()
