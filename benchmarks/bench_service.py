"""Retrieval service: throughput with micro-batching ON vs OFF (``--mode throughput``, the default), and
fairness to small requests while a big one is searched (``--mode fairness``), measured in the same run. (Over
400 lines: both modes share the server, client and report harness of this one file.)

Baseline: the same server with ``batching=False``, which serves requests strictly one at a time, one
index call per request. Load: `--clients` concurrent clients (default 64) each sending `--requests` one-query
requests (default 20) back to back over loopback HTTP to a real uvicorn server on 127.0.0.1. The
clients are asyncio tasks on plain keep-alive HTTP/1.1 connections (``--client raw``, cheap, like wrk)
or httpx.AsyncClient (``--client httpx``); they run in this process, next to the server.
The two modes alternate for --repeats rounds (other load on a shared machine then hits both alike).
Prints requests/s, p50/p95/p99 latency, index calls and mean batch size per round and mode, the
medians, their ratios (target: batched >= 3x requests/s with p95 no worse) and the device.

    python benchmarks/bench_service.py                         # builds a small MiniLM index itself
    python benchmarks/bench_service.py --index runs/quickstart/index --json bench_service.json
    python benchmarks/bench_service.py --mode fairness --big-queries 10000

Fairness mode: `--probe-clients` clients (default 4) send one-query requests back to back: `--probes` each
alone (default 25), then for as long as ONE request of `--big-queries` queries (default 10,000, the
server's default cap) is unanswered, and (``--compare-unchunked``, default on) for as long as that request
is searched as ONE batch by a second server with max_batch_queries = --big-queries, which is how every
server searched a big request before chunking; the modes alternate for --repeats rounds. Prints the probes'
p50/p95/max latency in each mode, the ratios with/without the big request, and the most index calls (batches)
and queries a probe waited for (the calls that ended while it waited: the server searches a big request in
chunks of --max-batch-queries, one chunk per batch, and a probe joins the next batch, so it waits for the
batch in flight and its own: 2), and
the answer to one query of 1 MB (a 413). The big request's answer (about 20 MB for 10,000 queries) is read
but not parsed: the clients share the server's process.

Without --index it indexes the first --passages passages of ``runs/quickstart/data/corpus.jsonl`` (the
embedded default corpus, written by `agentic-retriever data prepare`) when that file exists,
else a synthetic corpus of --passages passages, with the embedded default MiniLM encoder, in a temporary
folder removed at the end. Only loopback traffic; a fixed number of requests; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from _common import base_parser, describe_device, device_line, load_passages, write_json

from agentic_retriever.index import IndexBuildConfig, SearchIndex, build_index, open_index
from agentic_retriever.server import DEFAULT_MAX_QUERIES_PER_REQUEST, ServerThread, create_app

def _load_average() -> list[float] | None:
    """1/5/15-minute load averages: other work on a shared machine shows up here (and in the figures)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def build_bench_index(workdir: Path, passages: int) -> tuple[SearchIndex, str]:
    """A MiniLM Flat index over `passages` passages of the quickstart corpus (synthetic without it)."""
    texts, origin = load_passages(passages)
    corpus = workdir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": t}) + "\n" for i, t in enumerate(texts)))
    cache = str(workdir / "cache")
    started = time.perf_counter()
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(workdir / "index"), corpus_cache=cache))
    print(f"built the benchmark index in {time.perf_counter() - started:.1f} s from {origin}", flush=True)
    return open_index(workdir / "index", corpus_cache=cache), origin


def make_queries(index: SearchIndex, count: int, rng: random.Random) -> list[str]:
    """Short queries cut from random passages (3 to 8 words), deterministic for a seed."""
    rows = [rng.randrange(len(index)) for _ in range(count)]
    queries = []
    for passage in index.corpus.passages_at(rows):
        words = passage.text.split()
        size = rng.randint(3, 8)
        start = rng.randrange(max(1, len(words) - size))
        queries.append(" ".join(words[start:start + size]) or passage.title)
    return queries


# ---------------------------------------------------------------------------------------------- load


class _RawConnection:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: a load generator that costs the server's
    process far less CPU than httpx (whose per-request overhead would otherwise dominate both modes)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def post_json(self, path: str, body: dict) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        payload = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next((int(line.split(b":", 1)[1]) for line in lines[1:] if line.lower().startswith(b"content-length:")),
                      None)
        if length is None:
            raise RuntimeError(f"response without Content-Length: {head[:200]!r}")
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def _load(url: str, queries: list[str], clients: int, per_client: int, topk: int, client_kind: str) -> dict:
    latencies: list[float] = []
    answers: dict[int, list[str]] = {}
    errors: list[str] = []
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as http:
        async def client(c: int) -> None:
            raw = _RawConnection(host, int(port)) if client_kind == "raw" else None
            try:
                for r in range(per_client):
                    number = c * per_client + r
                    body = {"queries": [queries[number % len(queries)]], "topk": topk, "return_scores": True}
                    started = time.perf_counter()
                    if raw is not None:
                        status, content = await raw.post_json("/retrieve", body)
                    else:
                        response = await http.post("/retrieve", json=body)
                        status, content = response.status_code, response.content
                    latencies.append(time.perf_counter() - started)
                    if status != 200:
                        errors.append(f"{status}: {content[:200]!r}")
                        continue
                    answers[number] = [hit["document"]["id"] for hit in json.loads(content)["result"][0]]
            finally:
                if raw is not None:
                    await raw.close()

        before = (await http.get("/health")).json()["stats"]
        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        wall = time.perf_counter() - started
        after = (await http.get("/health")).json()["stats"]
    calls = after["index_calls"] - before["index_calls"]
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000

    return {"requests": len(latencies), "errors": len(errors), "first_errors": errors[:3],
            "wall_s": round(wall, 3), "requests_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(pct(50), 1), "p95_ms": round(pct(95), 1), "p99_ms": round(pct(99), 1),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 1),
            "index_calls": calls, "mean_batch_requests": round(len(latencies) / calls, 2) if calls else 0.0,
            "largest_batch_queries": after["largest_batch_queries"], "answers": answers}


def run_mode(index: SearchIndex, batching: bool, queries: list[str], args) -> dict:
    app = create_app(index, max_batch_queries=args.max_batch_queries, max_wait_ms=args.max_wait_ms, batching=batching)
    with ServerThread(app) as url:
        with httpx.Client(base_url=url, timeout=60) as http:  # warm-up, not measured
            for query in queries[: args.warmup]:
                http.post("/retrieve", json={"queries": [query], "topk": args.topk}).raise_for_status()
        return asyncio.run(_load(url, queries, args.clients, args.requests, args.topk, args.client))


# ---------------------------------------------------------------------------------------------- fairness


class _CallLog:
    """Wraps ``index.retrieve`` in this process: when each index call ran and how many queries it searched."""

    def __init__(self, index: SearchIndex):
        self.index, self.original = index, index.retrieve
        self.calls: list[list] = []  # [started, ended (inf while it runs), queries]

    def __call__(self, queries, k, questions=None, histories=None):
        call = [time.perf_counter(), math.inf, len(queries)]
        self.calls.append(call)
        try:
            return self.original(queries, k, questions, histories)
        finally:
            call[1] = time.perf_counter()

    def __enter__(self) -> _CallLog:
        self.index.retrieve = self
        return self

    def __exit__(self, *exc) -> None:
        del self.index.retrieve  # the class's method again

    def waited(self, sent: float, answered: float) -> tuple[int, int]:
        """For a request sent at `sent` and answered at `answered`: the index calls it waited for, those that
        ended in between (the one in flight when it was sent, its own, and any it missed), and their queries."""
        waited = [size for _, end, size in self.calls if sent < end <= answered]
        return len(waited), sum(waited)


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def _probes(host: str, port: int, queries: list[str], clients: int, per_client: int, topk: int,
                  big: asyncio.Future | None) -> tuple[list[tuple[float, float]], list[str]]:
    """One-query requests back to back from `clients` connections: `per_client` each, or with `big`, as many
    as each client can send while `big` is unanswered (at least one). Returns ((sent, answered) times, errors)."""
    times, errors = [], []

    async def client(c: int) -> None:
        connection = _RawConnection(host, port)
        try:
            r = 0
            while (r < per_client) if big is None else (r == 0 or not big.done()):
                body = {"queries": [queries[(c * per_client + r) % len(queries)]], "topk": topk, "return_scores": True}
                sent = time.perf_counter()
                status, content = await connection.post_json("/retrieve", body)
                times.append((sent, time.perf_counter()))
                if status != 200:
                    errors.append(f"{status}: {content[:200]!r}")
                r += 1
        finally:
            await connection.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return times, errors


async def _fairness_round(url: str, calls: _CallLog, probe_queries: list[str], big_queries: list[str], args,
                          with_big: bool) -> dict:
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    port = int(port)
    big = None
    if with_big:
        async def send_big() -> tuple[int, float, int]:
            connection = _RawConnection(host, port)
            started = time.perf_counter()
            try:  # the answer is read, not parsed: parsing megabytes here would stall the server's thread too
                status, content = await connection.post_json("/retrieve", {"queries": big_queries, "topk": args.topk})
            finally:
                await connection.close()
            return status, time.perf_counter() - started, len(content)

        first = len(calls.calls)
        big = asyncio.ensure_future(send_big())
        while len(calls.calls) == first and not big.done():  # its first chunk is being searched: start the probes
            await asyncio.sleep(0.002)
    times, errors = await _probes(host, port, probe_queries, args.probe_clients, args.probes, args.topk, big)
    latencies = [answered - sent for sent, answered in times]
    result = {"probes": len(latencies), "errors": len(errors), "first_errors": errors[:3],
              "p50_ms": round(_percentile(latencies, 50) * 1000, 1),
              "p95_ms": round(_percentile(latencies, 95) * 1000, 1),
              "max_ms": round(max(latencies) * 1000, 1)}
    if big is not None:
        status, seconds, size = await big
        waited = [calls.waited(sent, answered) for sent, answered in times]
        result |= {"big_status": status, "big_s": round(seconds, 3), "big_response_bytes": size,
                   "probe_index_calls_waited_p95": _percentile([w[0] for w in waited], 95),
                   "probe_index_calls_waited_max": max(w[0] for w in waited),
                   "probe_queries_waited_p95": _percentile([w[1] for w in waited], 95),
                   "probe_queries_waited_max": max(w[1] for w in waited)}
    return result


def run_fairness(index: SearchIndex, rng: random.Random, args) -> dict:
    probe_queries = make_queries(index, args.probe_clients * args.probes, rng)
    big_queries = make_queries(index, args.big_queries, rng)

    def app(max_batch_queries: int):
        return create_app(index, max_batch_queries=max_batch_queries, max_wait_ms=args.max_wait_ms,
                          max_queries_per_request=max(args.big_queries, DEFAULT_MAX_QUERIES_PER_REQUEST),
                          request_timeout_s=args.request_timeout_s)

    print(f"fairness: {args.probe_clients} probe clients sending requests of 1 query (topk {args.topk}) back to back: "
          f"{args.probes} each alone, and for as long as one request of {args.big_queries} queries is unanswered; "
          f"batches of at most {args.max_batch_queries} queries, {args.max_wait_ms} ms"
          + (f"; and, as before chunking, with the big request in ONE batch (max_batch_queries {args.big_queries})"
             if args.compare_unchunked else ""), flush=True)
    modes = [("alone", False, "chunked"), ("with big", True, "chunked")]
    if args.compare_unchunked:
        modes.append(("with big, unchunked", True, "unchunked"))
    rounds: dict[str, list[dict]] = {name: [] for name, _, _ in modes}
    with _CallLog(index) as calls, ServerThread(app(args.max_batch_queries)) as chunked, \
            ServerThread(app(max(args.big_queries, args.max_batch_queries))) as unchunked:
        urls = {"chunked": chunked, "unchunked": unchunked}
        for url in urls.values():
            with httpx.Client(base_url=url, timeout=60) as http:  # warm-up, not measured
                for query in probe_queries[: args.warmup]:
                    http.post("/retrieve", json={"queries": [query], "topk": args.topk}).raise_for_status()
        with httpx.Client(base_url=chunked, timeout=60) as http:
            started = time.perf_counter()
            huge = http.post("/retrieve", json={"queries": ["a" * 1_000_000], "topk": args.topk})
            huge_ms = (time.perf_counter() - started) * 1000
        print(f"  one query of 1 MB: HTTP {huge.status_code} in {huge_ms:.1f} ms: {huge.json().get('detail', '')[:120]}")
        for round_no in range(1, args.repeats + 1):
            for name, with_big, server in modes:
                r = asyncio.run(_fairness_round(urls[server], calls, probe_queries, big_queries, args, with_big))
                rounds[name].append(r)
                line = (f"  round {round_no}  {name:<19} {r['probes']:>4} probes  p50 {r['p50_ms']:>8.1f} ms  "
                        f"p95 {r['p95_ms']:>8.1f} ms  max {r['max_ms']:>8.1f} ms  errors {r['errors']}")
                if with_big:
                    line += (f"  | big: HTTP {r['big_status']} in {r['big_s']:.2f} s; a probe waited for <= "
                             f"{r['probe_index_calls_waited_max']} index calls, <= {r['probe_queries_waited_max']} "
                             f"queries")
                print(line, flush=True)
    keys = ("p50_ms", "p95_ms", "max_ms", "big_s", "probe_index_calls_waited_max", "probe_queries_waited_max")
    median = {name: {k: round(statistics.median(r[k] for r in runs), 3) for k in keys if k in runs[0]}
              for name, runs in rounds.items()}
    alone, loaded = median["alone"], median["with big"]
    p50_ratio, p95_ratio = loaded["p50_ms"] / alone["p50_ms"], loaded["p95_ms"] / alone["p95_ms"]
    print(f"median of {args.repeats} round(s):")
    for name, m in median.items():
        print(f"  {name:<19} probes p50 {m['p50_ms']:>8.1f} ms  p95 {m['p95_ms']:>8.1f} ms  max {m['max_ms']:>8.1f} ms"
              + (f"  | big request {m['big_s']:.2f} s; a probe waited for <= {m['probe_index_calls_waited_max']:g} "
                 f"index calls, <= {m['probe_queries_waited_max']:g} queries" if "big_s" in m else ""))
    print(f"ratio with/without the big request (chunked; medians): p50 x{p50_ratio:.2f}, p95 x{p95_ratio:.2f}")
    figures = {}
    if args.compare_unchunked:
        before = median["with big, unchunked"]
        figures = {"unchunked_p50_ratio": round(before["p50_ms"] / alone["p50_ms"], 3),
                   "unchunked_p95_ratio": round(before["p95_ms"] / alone["p95_ms"], 3)}
        print(f"ratio with/without the big request searched in one batch (as before chunking): "
              f"p50 x{figures['unchunked_p50_ratio']:.2f}, p95 x{figures['unchunked_p95_ratio']:.2f}")
    errors = sum(r["errors"] for runs in rounds.values() for r in runs)
    statuses = sorted({r["big_status"] for runs in rounds.values() for r in runs if "big_status" in r})
    print(f"errors: {errors}; big request statuses: {statuses}")
    return {"load": {"probe_clients": args.probe_clients, "probes_per_client_alone": args.probes, "topk": args.topk,
                     "big_queries": args.big_queries, "max_batch_queries": args.max_batch_queries,
                     "max_wait_ms": args.max_wait_ms, "request_timeout_s": args.request_timeout_s},
            "repeats": args.repeats, "median": median, "p50_ratio": round(p50_ratio, 3), "p95_ratio": round(p95_ratio, 3),
            **figures, "one_mb_query": {"status": huge.status_code, "ms": round(huge_ms, 1)},
            "errors": errors, "big_statuses": statuses, "rounds": rounds}


def _median_round(runs: list[dict]) -> dict:
    """Per figure, the median over the rounds (robust to a round disturbed by other load on the machine)."""
    keys = ("requests_per_s", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "mean_batch_requests")
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in keys} | {
        "requests_per_round": runs[0]["requests"], "index_calls": [r["index_calls"] for r in runs]}


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__)
    parser.add_argument("--mode", choices=("throughput", "fairness"), default="throughput",
                        help="batching on vs off under many small requests, or small probes with vs without a big request")
    parser.add_argument("--index", help="a built index folder (default: build a small MiniLM index in a temp folder)")
    parser.add_argument("--passages", type=int, default=2000, help="passages in the index built without --index")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=20, help="one-query requests per client")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--max-batch-queries", type=int, default=256)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--warmup", type=int, default=8, help="unmeasured requests before each mode")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="load generator: raw asyncio HTTP/1.1 keep-alive connections, or httpx.AsyncClient "
                             "(heavier: its own CPU cost then dominates both modes on a small CPU)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of (off, on); the medians are compared")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--big-queries", type=int, default=DEFAULT_MAX_QUERIES_PER_REQUEST,
                        help="fairness mode: queries in the big request")
    parser.add_argument("--probe-clients", type=int, default=4, help="fairness mode: concurrent probe clients")
    parser.add_argument("--probes", type=int, default=25, help="fairness mode: one-query requests per probe client")
    parser.add_argument("--request-timeout-s", type=float, default=600.0,
                        help="fairness mode: the server's request time limit (the big request must finish)")
    parser.add_argument("--compare-unchunked", action=argparse.BooleanOptionalAction, default=True,
                        help="fairness mode: also measure the probes against the big request searched in ONE batch "
                             "(max_batch_queries = --big-queries: the behaviour before chunking)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="bench_service_") as tmp:
        if args.index:
            index, origin = open_index(args.index), args.index
        else:
            index, origin = build_bench_index(Path(tmp), args.passages)
        device = describe_device() | {"load_average_at_start": _load_average()}
        m = index.manifest
        print(f"{device_line(device)}; load average {device['load_average_at_start']}")
        print(f"index: {m.backend}/{m.index_type}, {len(index)} passages ({origin}), "
              f"encoder {(m.encoder or {}).get('model')}, dim {m.dim}")
        if args.mode == "fairness":
            figures = run_fairness(index, rng, args)
            device["load_average_at_end"] = _load_average()
            print(f"load average at the end: {device['load_average_at_end']}")
            figures["index"] = {"backend": m.backend, "type": m.index_type, "passages": len(index), "origin": origin,
                                "encoder": (m.encoder or {}).get("model")}
            write_json(args.json, "bench_service_fairness", args, device, figures)
            return figures
        queries = make_queries(index, args.clients * args.requests, rng)
        print(f"load: {args.clients} concurrent clients ({args.client}) x {args.requests} requests of 1 query, topk {args.topk}; "
              f"server on 127.0.0.1 (uvicorn, same process); batching: max {args.max_batch_queries} queries, "
              f"{args.max_wait_ms} ms", flush=True)

        rounds: dict[str, list[dict]] = {"batching off": [], "batching on": []}
        for round_no in range(1, args.repeats + 1):  # alternate the modes: drifting load hits both alike
            for name, batching in (("batching off", False), ("batching on", True)):
                r = run_mode(index, batching, queries, args)
                rounds[name].append(r)
                print(f"  round {round_no}  {name:<13} {r['requests_per_s']:>8.1f} req/s  p50 {r['p50_ms']:>7.1f} ms  "
                      f"p95 {r['p95_ms']:>7.1f} ms  p99 {r['p99_ms']:>7.1f} ms  index calls {r['index_calls']:>5}  "
                      f"mean batch {r['mean_batch_requests']:>6.2f} req  errors {r['errors']}", flush=True)

    summary = {name: _median_round(runs) for name, runs in rounds.items()}
    off, on = summary["batching off"], summary["batching on"]
    print(f"median of {args.repeats} round(s):")
    for name, r in summary.items():
        print(f"  {name:<13} {r['requests_per_s']:>8.1f} req/s  p50 {r['p50_ms']:>7.1f} ms  p95 {r['p95_ms']:>7.1f} ms  "
              f"p99 {r['p99_ms']:>7.1f} ms")
    answers_off, answers_on = rounds["batching off"][0]["answers"], rounds["batching on"][0]["answers"]
    same = sum(answers_off.get(i) == answers_on.get(i) for i in answers_off)
    errors = sum(r["errors"] for runs in rounds.values() for r in runs)
    throughput_ratio = on["requests_per_s"] / off["requests_per_s"]
    p95_ratio = on["p95_ms"] / off["p95_ms"]
    print(f"ratio batched/unbatched (medians): throughput x{throughput_ratio:.2f} (target >= 3), "
          f"p95 latency x{p95_ratio:.2f} (target <= 1), p50 latency x{on['p50_ms'] / off['p50_ms']:.2f}")
    print(f"answers identical in both modes: {same} of {len(answers_off)} requests; errors: {errors}")
    verdict = throughput_ratio >= 3 and p95_ratio <= 1 and not errors
    print("target met" if verdict else "TARGET NOT MET")
    device["load_average_at_end"] = _load_average()
    print(f"load average at the end: {device['load_average_at_end']}")

    figures = {
        "index": {"backend": m.backend, "type": m.index_type,
                                                                 "passages": len(index), "origin": origin,
                                                                 "encoder": (m.encoder or {}).get("model")},
        "load": {"clients": args.clients, "client": args.client, "requests_per_client": args.requests, "queries_per_request": 1,
                 "topk": args.topk, "max_batch_queries": args.max_batch_queries, "max_wait_ms": args.max_wait_ms},
        "repeats": args.repeats, "baseline": off, "batched": on,
        "rounds": {name: [{k: v for k, v in r.items() if k != "answers"} for r in runs] for name, runs in rounds.items()},
        "throughput_ratio": round(throughput_ratio, 3), "p95_ratio": round(p95_ratio, 3),
        "identical_answers": same, "errors": errors, "target_met": verdict,
    }
    write_json(args.json, "bench_service", args, device, figures)
    return figures


if __name__ == "__main__":
    main()
