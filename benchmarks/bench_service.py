"""Retrieval service throughput: dynamic micro-batching ON vs OFF, measured in the same run.

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

Without --index it indexes the first --passages passages of ``runs/quickstart/data/corpus.jsonl`` (the
embedded default corpus, written by `agentic-retriever data prepare`) when that file exists,
else a synthetic corpus of --passages passages, with the embedded default MiniLM encoder, in a temporary
folder removed at the end. Only loopback traffic; a fixed number of requests; stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from _common import base_parser, describe_device, device_line, load_passages, write_json

from agentic_retriever.index import IndexBuildConfig, SearchIndex, build_index, open_index
from agentic_retriever.server import ServerThread, create_app

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


def _median_round(runs: list[dict]) -> dict:
    """Per figure, the median over the rounds (robust to a round disturbed by other load on the machine)."""
    keys = ("requests_per_s", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "mean_batch_requests")
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in keys} | {
        "requests_per_round": runs[0]["requests"], "index_calls": [r["index_calls"] for r in runs]}


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__)
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="bench_service_") as tmp:
        if args.index:
            index, origin = open_index(args.index), args.index
        else:
            index, origin = build_bench_index(Path(tmp), args.passages)
        queries = make_queries(index, args.clients * args.requests, rng)
        device = describe_device() | {"load_average_at_start": _load_average()}
        m = index.manifest
        print(f"{device_line(device)}; load average {device['load_average_at_start']}")
        print(f"index: {m.backend}/{m.index_type}, {len(index)} passages ({origin}), "
              f"encoder {(m.encoder or {}).get('model')}, dim {m.dim}")
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
