"""Retrieval service: our service against a peer at 1, 16 and 64 concurrent clients (``--mode throughput``,
the default), and fairness to small requests while a big one is searched (``--mode fairness``).

Throughput mode. Contenders, all over the same index (same FAISS file, corpus and encoder weights), each a real
uvicorn server on 127.0.0.1, unless a URL is given. With ``--servers process`` (the default) each runs in a process
of its own, as users run them (ours: ``agentic-retriever index serve``; the reference peer: ``_reference_server.py``),
and the report adds each server's CPU time per request; ``--servers thread`` runs them in threads of this process,
beside the clients (cheaper to start, but the clients and servers then share one interpreter):

* ``peer``: the baseline. By default a per-request server in the design of Search-R1's own (`_reference_server.py`:
  a synchronous FastAPI endpoint, a plain transformers encoder and one FAISS search per request); with
  ``--peer-script PATH`` Search-R1's own ``search_r1/search/retrieval_server.py`` from a checkout of it, run
  unmodified in a process of its own over the same index folder (`_search_r1_server.py`: on a machine without a GPU
  its ``.cuda()``/``.half()`` calls keep the model on the CPU in fp32); with ``--peer-url URL`` any running server
  that speaks Search-R1's ``POST /retrieve`` (FlashRAG's, yours), which should serve the same corpus for the
  answer-agreement line to mean anything;
* ``ours``: `create_app` with the service's default settings (`ServeConfig`);
* ``ours, batching off``: one index call per request, strictly one after the other.

Load: for each `--clients` count (default 1, 16, 64), that many keep-alive connections send one-query requests
(topk `--topk`) back to back, `--total-requests` in all (at least 5 per client), cheap raw HTTP/1.1 clients on
asyncio streams in this process (`_service_load.py`). The contenders alternate for `--repeats` rounds at each
count (drifting load on a shared machine hits them alike) and the medians are compared. Then the batched limit:
`--limit-clients` (16) clients sending requests of `--limit-queries-per-request` (16) queries, ours and the peer in
turn, which fills the encoder's batches whatever the server does. Prints requests/s, queries/s and p50/p95/p99
latency per contender and load, the ratios ours/peer (targets: at 1 client throughput >= 1.0x and p50 latency <=
1.0x the peer's; at every larger count throughput >= 4x), the share of its batched limit each server reaches with
one-query requests at the largest count (target for ours: >= 90%), how often ours and the peer return the same
top-k ids, and the device and load average. For ours it also prints, from its ``/health`` counters, the queries per
index call, the index's milliseconds a query (encoder and search) and its busy share of each round, and at the end
the index alone in this process at the batch sizes the two loads formed: where a share below the limit goes.

    python benchmarks/bench_service.py                                   # builds a small MiniLM index itself
    python benchmarks/bench_service.py --index runs/quickstart/index/minilm-flat --json bench_service.json
    python benchmarks/bench_service.py --index DIR --peer-script Search-R1/search_r1/search/retrieval_server.py
    python benchmarks/bench_service.py --index DIR --peer-url http://127.0.0.1:8000   # against your own server
    python benchmarks/bench_service.py --mode fairness --big-queries 10000

Overhead mode (``--mode overhead``): the service's own CPU per request, which RL rollouts' many one-query
requests take from the encoder on the same cores: ``index serve``'s app over the index's corpus with a search that
costs nothing (`agentic_retriever.standins.instant_index`), in a process of its own, one-query requests from each `--clients` count for
`--repeats` rounds; prints the median server CPU ms per request (user + system time of its process, counted in
clock ticks of 10 ms: give it thousands of requests, `--total-requests 4000`).

Fairness mode: `--probe-clients` clients (default 4) send one-query requests back to back: `--probes` each
alone (default 25), then for as long as ONE request of `--big-queries` queries (default 10,000, the
server's default cap) is unanswered, and (``--compare-unchunked``, default on) for as long as that request
is searched as ONE batch by a second server with max_batch_queries = --big-queries, which is how every
server searched a big request before chunking; the modes alternate for --repeats rounds. Prints the probes'
p50/p95/max latency in each mode (target: max <= 500 ms with the big request), the ratios with/without the big
request, and (``--servers thread`` only: it reads the index calls in this process) the most index calls (batches)
and queries a probe waited for (the calls that ended while it waited: the server searches a big request in
chunks of --max-batch-queries, one chunk per batch, and a probe joins the next batch, so it waits for the
batch in flight and its own: 2), and the answer to one query of 1 MB (a 413). The big request's answer (about
20 MB for 10,000 queries) is read but not parsed: the clients share the server's process.

Without --index it indexes the first --passages passages of ``runs/quickstart/data/corpus.jsonl`` (the
embedded default corpus, written by `agentic-retriever data prepare`) when that file exists,
else a synthetic corpus of --passages passages, with the embedded default MiniLM encoder, in a temporary
folder removed at the end. Only loopback traffic (or the --peer-url the user names); a fixed number of
requests; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from _common import alternate, base_parser, describe_device, device_line, free_port, load_passages, write_json
from _reference_server import create_reference_app
from _service_load import RawConnection, closed_loop, host_port, load_average, percentile

from agentic_retriever.index import IndexBuildConfig, SearchIndex, build_index, open_index
from agentic_retriever.server import DEFAULT_MAX_QUERIES_PER_REQUEST, ServeConfig, ServerThread, create_app


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


class ServerProcess:
    """A contender served by a process of its own on a free loopback port: `url` once it answers HTTP (``GET
    /health``, with any status: Search-R1's server has no such route), the CPU seconds it has used (`cpu_seconds`),
    stopped (SIGTERM, then SIGKILL) on exit. Its stderr goes to an anonymous temporary file, not a pipe: Search-R1's
    server draws a progress bar on every request, and a pipe nobody reads would block it once full."""

    def __init__(self, command: list[str], name: str, ready_s: float = 300.0):
        self.port = free_port()
        self.command, self.name, self.ready_s = [*command, "--port", str(self.port)], name, ready_s
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.stderr = None

    def __enter__(self) -> ServerProcess:
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def launch(self) -> None:
        """Start the process (once); `wait_ready` waits for it. Launching several before waiting for any lets their
        start-ups (imports, model and index loads) overlap."""
        if self.process is None:
            self.stderr = tempfile.TemporaryFile("w+")
            self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=self.stderr, text=True)

    def wait_ready(self) -> None:
        """Return once the launched process answers HTTP; RuntimeError with its stderr if it exits first."""
        deadline = time.monotonic() + self.ready_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stderr.seek(0)
                raise RuntimeError(f"the {self.name} server exited ({self.process.returncode}): "
                                   f"{self.stderr.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{self.url}/health", timeout=2)
                return
            time.sleep(0.25)
        raise TimeoutError(f"the {self.name} server did not answer /health within {self.ready_s:.0f} s")

    def cpu_seconds(self) -> float:
        import psutil

        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system + times.children_user + times.children_system

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.stderr is not None:
            self.stderr.close()


def our_server(index_dir: str, **settings) -> list[str]:
    """The command of ``agentic-retriever index serve`` over `index_dir` with `settings` as flags."""
    flags = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        flags += ([flag] if value is True else [f"--no-{flag[2:]}"] if value is False else [flag, str(value)])
    return [sys.executable, "-m", "agentic_retriever.app.cli", "index", "serve", "--index", index_dir, *flags]


# ---------------------------------------------------------------------------------------------- throughput


def _our_app(index: SearchIndex, batching: bool):
    defaults = ServeConfig()
    return create_app(index, max_batch_queries=defaults.max_batch_queries, max_wait_ms=defaults.max_wait_ms,
                      batching=batching)


def _contenders(index: SearchIndex, index_dir: str, args) -> dict[str, object]:
    """name -> an app to serve in a thread of this process, a `ServerProcess` (``--servers process``), or the URL
    of a running server."""
    peer_url = args.peer_url.rstrip("/") if args.peer_url else None
    peer = peer_url
    if args.peer_script:
        peer = ServerProcess([sys.executable, str(Path(__file__).with_name("_search_r1_server.py")), "--script",
                              args.peer_script, "--index", index_dir, "--topk", str(args.topk)], "Search-R1's")
    if args.servers == "process":
        reference = [sys.executable, str(Path(__file__).with_name("_reference_server.py")), "--index", index_dir,
                     "--topk", str(args.topk)]
        ours = {"query_precision": args.query_precision} if args.query_precision else {}
        return {"peer": peer or ServerProcess(reference, "peer"),
                "ours": ServerProcess(our_server(index_dir, **ours), "ours"),
                "ours, batching off": ServerProcess(our_server(index_dir, batching=False, **ours),
                                                    "ours, batching off")}
    return {"peer": peer or create_reference_app(index, default_topk=args.topk),
            "ours": _our_app(index, batching=True), "ours, batching off": _our_app(index, batching=False)}


def _start(stack: contextlib.ExitStack, target) -> tuple[str, ServerProcess | None]:
    """(URL, its process where it has one of its own) of a contender: started here unless it is a URL."""
    if isinstance(target, str):
        return target, None
    if isinstance(target, ServerProcess):
        return stack.enter_context(target).url, target
    return stack.enter_context(ServerThread(target)), None


def _start_all(stack: contextlib.ExitStack, contenders: dict[str, object]) -> dict[str, tuple[str, ServerProcess | None]]:
    """`_start` of every contender, the processes launched together first (each stopped with `stack`), so that
    their start-ups overlap; nothing is measured before all of them answer."""
    for target in contenders.values():
        if isinstance(target, ServerProcess):
            stack.push(target)  # its __exit__ stops it, whether or not it was entered
            target.launch()
    return {name: _start(stack, target) for name, target in contenders.items()}


def _warm_up(url: str, queries: list[str], topk: int) -> None:
    """A few requests of the measured kind; with ``return_scores`` as Search-R1's agent sends it (its server's
    route fails without it: it unpacks results and scores either way)."""
    with httpx.Client(base_url=url, timeout=60) as http:
        for query in queries:
            http.post("/retrieve", json={"queries": [query], "topk": topk, "return_scores": True}).raise_for_status()


def _agreement(ours: dict[int, list[str]], peer: dict[int, list[str]]) -> tuple[int, int]:
    both = [i for i in ours if i in peer]
    return sum(ours[i] == peer[i] for i in both), len(both)


def _peer_name(args) -> str:
    if args.peer_script:
        return f"Search-R1's retrieval_server.py ({args.peer_script}, benchmarks/_search_r1_server.py)"
    return args.peer_url or "per-request reference server (benchmarks/_reference_server.py)"


def run_throughput(index: SearchIndex, index_dir: str, rng: random.Random, args) -> dict:
    counts = [int(c) for c in str(args.clients).split(",")]
    queries = make_queries(index, max(args.total_requests, max(counts) * 5), rng)
    contenders = _contenders(index, index_dir, args)
    print(f"load: one-query requests (topk {args.topk}) back to back from {', '.join(map(str, counts))} keep-alive "
          f"client(s), {args.total_requests} requests per round (at least 5 per client); peer: "
          f"{_peer_name(args)}; ours: the service's "
          f"defaults (batching, max_wait_ms {ServeConfig().max_wait_ms:g}, max_batch_ms {ServeConfig().max_batch_ms:g}); "
          f"servers: {'each in a process of its own' if args.servers == 'process' else 'threads of this process'}",
          flush=True)
    results: dict[int, dict[str, list[dict]]] = {n: {name: [] for name in contenders} for n in counts}
    with contextlib.ExitStack() as stack:
        started = _start_all(stack, contenders)
        for url, _ in started.values():
            _warm_up(url, queries[: args.warmup], args.topk)
        for clients in counts:
            per_client = max(5, args.total_requests // clients)
            order = list(started.items())
            for round_no in range(1, args.repeats + 1):
                for name, (url, process) in order if round_no % 2 else order[::-1]:  # reversed every other round
                    r = _measured_round(url, process, queries, clients, per_client, args.topk)
                    results[clients][name].append(r)
                    _print_round(f"{clients:>3} client(s)", round_no, name, r, process)
        limit = _batched_limit(started, queries, args) if args.limit_queries_per_request > 1 else None
    report = _throughput_report(counts, results, limit)
    if limit and "queries_per_index_call" in report["medians"][max(counts)]["ours"]:
        sizes = sorted({max(1, round(report["medians"][max(counts)]["ours"]["queries_per_index_call"])),
                        max(1, round(report["batched_limit"]["ours"]["queries_per_index_call"]))})
        report["index_alone_ms_per_query"] = index_alone(index, queries, sizes, args.topk)
        print("  the index alone in this process (no server, no clients), ms a query at the batch sizes those loads "
              "formed: " + ", ".join(f"{ms:.2f} at {n}" for n, ms in report["index_alone_ms_per_query"].items()))
    return report


def index_alone(index: SearchIndex, queries: list[str], sizes: list[int], topk: int, rounds: int = 3) -> dict[int, float]:
    """Milliseconds a query of ``index.retrieve`` on `queries` in batches of each size, in this process with nothing
    else running: the encoder's and the search's own batch effect, without a server. About 512 queries a size, once
    untimed (the first call of a new shape pays for kernel selection), then the sizes alternate for `rounds` rounds
    (`_common.alternate`); medians."""
    def batches_of(n: int) -> list[list[str]]:
        total = max(n, 512 - 512 % n)
        pool = [queries[i % len(queries)] for i in range(total)]
        return [pool[i:i + n] for i in range(0, total, n)]

    def search_all(batches: list[list[str]]):
        return lambda: [index.retrieve(batch, topk) for batch in batches]

    work = {n: batches_of(n) for n in sizes}
    seconds = alternate({n: search_all(batches) for n, batches in work.items()}, rounds)
    return {n: round(statistics.median(seconds[n]) * 1000 / sum(map(len, work[n])), 3) for n in sizes}


def _measured_round(url: str, process, queries: list[str], clients: int, per_client: int, topk: int,
                    queries_per_request: int = 1) -> dict:
    """One closed-loop round (`closed_loop`) with, for a server in a process of its own, its CPU time per request,
    and, for ours (its ``GET /health`` carries ``stats``), the queries per index call (how full its batches were),
    the index's milliseconds per query (encoder and search, in the index thread) and its busy share of the round
    (the rest of the round the index waited for requests)."""
    cpu = process.cpu_seconds() if process else None
    stats = _batch_stats(url)
    r = asyncio.run(closed_loop(url, queries, clients, per_client, topk, queries_per_request=queries_per_request))
    if process:
        r["server_cpu_ms_per_request"] = round((process.cpu_seconds() - cpu) * 1000 / r["requests"], 3)
    if stats is not None and (after := _batch_stats(url)) is not None and after[1] > stats[1]:
        queries_, calls, seconds = (b - a for a, b in zip(stats, after))
        r["queries_per_index_call"] = round(queries_ / calls, 2)
        r["index_ms_per_query"] = round(seconds * 1000 / queries_, 3)
        r["index_busy_share"] = round(seconds / r["wall_s"], 3)
    return r


def _batch_stats(url: str) -> tuple[int, int, float] | None:
    """(queries, index calls, index seconds) so far from our service's ``/health``; None from a server without
    them."""
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        stats = httpx.get(f"{url}/health", timeout=10).json()["stats"]
        return stats["queries"], stats["index_calls"], stats["index_seconds"]
    return None


def _print_round(load: str, round_no: int, name: str, r: dict, process) -> None:
    print(f"  {load} round {round_no}  {name:<19} {r['requests_per_s']:>8.1f} req/s  {r['queries_per_s']:>8.1f} q/s  "
          f"p50 {r['p50_ms']:>7.1f} ms  p95 {r['p95_ms']:>7.1f} ms  p99 {r['p99_ms']:>7.1f} ms  "
          + (f"server CPU {r['server_cpu_ms_per_request']:.2f} ms/request  " if process else "")
          + (f"{r['queries_per_index_call']:.1f} queries/index call, index {r['index_ms_per_query']:.2f} ms/query, "
             f"busy {r['index_busy_share']:.0%}  " if "queries_per_index_call" in r else "")
          + f"errors {r['errors']}", flush=True)


def _batched_limit(started: dict, queries: list[str], args) -> dict[str, list[dict]]:
    """What each server reaches when the clients batch for it: `--limit-clients` clients sending requests of
    `--limit-queries-per-request` queries (the encoder's batches then come full without any batching of ours), as
    many queries in all as a one-query round, alternating as the rounds above do."""
    clients, size = args.limit_clients, args.limit_queries_per_request
    per_client = max(5, args.total_requests // (clients * size))
    runs: dict[str, list[dict]] = {name: [] for name in ("peer", "ours")}
    order = [(name, started[name]) for name in runs]
    for round_no in range(1, args.repeats + 1):
        for name, (url, process) in order if round_no % 2 else order[::-1]:
            r = _measured_round(url, process, queries, clients, per_client, args.topk, queries_per_request=size)
            runs[name].append(r)
            _print_round(f"{clients:>3} x {size}-query", round_no, name, r, process)
    return runs


def _without_answers(by_name: dict) -> dict:
    """The rounds under each name without each request's result ids (kept for the agreement line only)."""
    return {name: [{k: v for k, v in r.items() if k != "answers"} for r in runs] for name, runs in by_name.items()}


def _medians(by_name: dict[str, list[dict]]) -> dict[str, dict]:
    keys = ("requests_per_s", "queries_per_s", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "server_cpu_ms_per_request",
            "queries_per_index_call", "index_ms_per_query", "index_busy_share")
    return {name: {k: round(statistics.median(r[k] for r in runs), 3) for k in keys if k in runs[0]}
            for name, runs in by_name.items()}


def _throughput_report(counts: list[int], results: dict[int, dict[str, list[dict]]],
                       limit: dict[str, list[dict]] | None = None) -> dict:
    medians = {n: _medians(by_name) for n, by_name in results.items()}
    print("medians (requests/s, p50 ms, p95 ms) and ratios ours/peer:")
    ratios = {}
    for n in counts:
        m = medians[n]
        ratios[n] = {name: {"throughput": round(m[name]["requests_per_s"] / m["peer"]["requests_per_s"], 3),
                            "p50_latency": round(m[name]["p50_ms"] / m["peer"]["p50_ms"], 3),
                            "p95_latency": round(m[name]["p95_ms"] / m["peer"]["p95_ms"], 3)}
                     for name in m if name != "peer"}
        for name, r in m.items():
            line = f"  {n:>3} client(s)  {name:<19} {r['requests_per_s']:>8.1f}  {r['p50_ms']:>7.1f}  {r['p95_ms']:>7.1f}"
            if "server_cpu_ms_per_request" in r:
                line += f"  CPU {r['server_cpu_ms_per_request']:>6.2f} ms/request"
            if "queries_per_index_call" in r:
                line += (f"  {r['queries_per_index_call']:>5.1f} queries/index call, index {r['index_ms_per_query']:.2f} "
                         f"ms/query, busy {r['index_busy_share']:.0%}")
            if name in ratios[n]:
                x = ratios[n][name]
                line += f"   x{x['throughput']:.2f} throughput, x{x['p50_latency']:.2f} p50, x{x['p95_latency']:.2f} p95"
            print(line)
    lone = ratios[min(counts)]["ours"]
    targets = {f"{min(counts)} client(s): throughput >= 1.0x": lone["throughput"] >= 1.0,
               f"{min(counts)} client(s): p50 latency <= 1.0x": lone["p50_latency"] <= 1.0,
               **{f"{n} clients: throughput >= 4x": ratios[n]["ours"]["throughput"] >= 4 for n in counts
                  if n > min(counts)}}
    limit_medians = share_of_limit = None
    if limit:
        limit_medians = _medians(limit)
        busiest = max(counts)
        share_of_limit = {name: round(medians[busiest][name]["queries_per_s"] / limit_medians[name]["queries_per_s"], 3)
                          for name in limit_medians}
        for name, r in limit_medians.items():
            print(f"  batched limit, {name:<6} {r['queries_per_s']:>8.1f} queries/s with "
                  f"{limit[name][0]['requests']} requests of several queries; one-query requests at {busiest} clients "
                  f"reach {share_of_limit[name]:.0%} of it")
        one, full = medians[busiest]["ours"], limit_medians["ours"]
        if "index_ms_per_query" in one and "index_ms_per_query" in full:
            print(f"  where ours loses it: the index took {one['index_ms_per_query']:.2f} ms a query at {busiest} clients "
                  f"({one['queries_per_index_call']:.0f} queries a call) against {full['index_ms_per_query']:.2f} with "
                  f"batched requests ({full['queries_per_index_call']:.0f} a call), x"
                  f"{one['index_ms_per_query'] / full['index_ms_per_query']:.2f}; it was busy {one['index_busy_share']:.0%} "
                  f"and {full['index_busy_share']:.0%} of those rounds (the rest: waiting for requests)")
        targets[f"{busiest} clients, one-query requests: >= 90% of ours with batched requests"] = share_of_limit["ours"] >= 0.9
    for target, met in targets.items():
        print(f"  target {target}: {'met' if met else 'NOT MET'}")
    same, compared = _agreement(results[counts[0]]["ours"][0]["answers"], results[counts[0]]["peer"][0]["answers"])
    errors = sum(r["errors"] for by_name in [*results.values(), limit or {}] for runs in by_name.values() for r in runs)
    print(f"top-k ids identical to the peer's: {same} of {compared} requests; errors: {errors}")
    rounds = {n: _without_answers(by_name) for n, by_name in results.items()}
    if limit:
        rounds["batched_limit"] = _without_answers(limit)
    return {"medians": medians, "ratios": ratios, "targets": targets, "same_topk_as_peer": [same, compared],
            "errors": errors, "rounds": rounds, "batched_limit": limit_medians, "share_of_batched_limit": share_of_limit}


# ---------------------------------------------------------------------------------------------- overhead


def run_overhead(index: SearchIndex, index_dir: str, rng: random.Random, args) -> dict:
    """The service's own CPU per request: ``index serve``'s app over `agentic_retriever.standins.instant_index.InstantIndex` (the index's
    corpus, a search that costs nothing) in a process of its own, one-query requests from each `--clients` count,
    `--repeats` rounds; the medians of requests/s and server CPU ms per request."""
    counts = [int(c) for c in str(args.clients).split(",")]
    queries = make_queries(index, max(args.total_requests, max(counts) * 5), rng)
    command = [sys.executable, "-m", "agentic_retriever.standins.instant_index", "--index", index_dir]
    rounds: dict[int, list[dict]] = {n: [] for n in counts}
    with ServerProcess(command, "ours, instant index") as server:
        _warm_up(server.url, queries[: args.warmup], args.topk)
        for round_no in range(1, args.repeats + 1):
            for clients in counts:
                r = _measured_round(server.url, server, queries, clients, max(5, args.total_requests // clients),
                                    args.topk)
                rounds[clients].append(r)
                _print_round(f"{clients:>3} client(s)", round_no, "ours, instant index", r, server)
    medians = _medians({str(n): runs for n, runs in rounds.items()})
    rounds = _without_answers(rounds)
    for n, m in medians.items():
        print(f"  {n:>3} client(s): server CPU {m['server_cpu_ms_per_request']:.3f} ms/request (median of "
              f"{args.repeats}), {m['requests_per_s']:.0f} requests/s")
    errors = sum(r["errors"] for runs in rounds.values() for r in runs)
    return {"medians": medians, "rounds": rounds, "errors": errors}


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


async def _probes(host: str, port: int, queries: list[str], clients: int, per_client: int, topk: int,
                  big: asyncio.Future | None) -> tuple[list[tuple[float, float]], list[str]]:
    """One-query requests back to back from `clients` connections: `per_client` each, or with `big`, as many
    as each client can send while `big` is unanswered (at least one). Returns ((sent, answered) times, errors)."""
    times, errors = [], []

    async def client(c: int) -> None:
        connection = RawConnection(host, port)
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


async def _fairness_round(url: str, calls: _CallLog | None, probe_queries: list[str], big_queries: list[str], args,
                          with_big: bool) -> dict:
    host, port = host_port(url)
    big = None
    if with_big:
        async def send_big() -> tuple[int, float, int]:
            connection = RawConnection(host, port)
            started = time.perf_counter()
            try:  # the answer is read, not parsed: parsing megabytes here would stall the server's thread too
                status, content = await connection.post_json("/retrieve", {"queries": big_queries, "topk": args.topk})
            finally:
                await connection.close()
            return status, time.perf_counter() - started, len(content)

        if calls is not None:
            first = len(calls.calls)
            big = asyncio.ensure_future(send_big())
            while len(calls.calls) == first and not big.done():  # its first chunk is being searched: start the probes
                await asyncio.sleep(0.002)
        else:  # a server in its own process: its /health counts the big request once it is queued
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                before = (await http.get("/health")).json()["stats"]["requests"]
                big = asyncio.ensure_future(send_big())
                while not big.done() and (await http.get("/health")).json()["stats"]["requests"] == before:
                    await asyncio.sleep(0.002)
    times, errors = await _probes(host, port, probe_queries, args.probe_clients, args.probes, args.topk, big)
    latencies = [answered - sent for sent, answered in times]
    result = {"probes": len(latencies), "errors": len(errors), "first_errors": errors[:3],
              "p50_ms": round(percentile(latencies, 50) * 1000, 1),
              "p95_ms": round(percentile(latencies, 95) * 1000, 1),
              "max_ms": round(max(latencies) * 1000, 1)}
    if big is not None:
        status, seconds, size = await big
        result |= {"big_status": status, "big_s": round(seconds, 3), "big_response_bytes": size}
    if big is not None and calls is not None:
        waited = [calls.waited(sent, answered) for sent, answered in times]
        result |= {"probe_index_calls_waited_p95": percentile([w[0] for w in waited], 95),
                   "probe_index_calls_waited_max": max(w[0] for w in waited),
                   "probe_queries_waited_p95": percentile([w[1] for w in waited], 95),
                   "probe_queries_waited_max": max(w[1] for w in waited)}
    return result


def _waited(figures: dict) -> str:
    """What a probe waited for, where the index calls were read (``--servers thread``)."""
    if "probe_index_calls_waited_max" not in figures:
        return ""
    return (f"; a probe waited for <= {figures['probe_index_calls_waited_max']:g} index calls, <= "
            f"{figures['probe_queries_waited_max']:g} queries")


def run_fairness(index: SearchIndex, index_dir: str, rng: random.Random, args) -> dict:
    probe_queries = make_queries(index, args.probe_clients * args.probes, rng)
    big_queries = make_queries(index, args.big_queries, rng)

    def app(max_batch_queries: int, max_batch_ms: float):
        settings = {"max_batch_queries": max_batch_queries, "max_batch_ms": max_batch_ms,
                    "max_wait_ms": args.max_wait_ms, "request_timeout_s": args.request_timeout_s,
                    "max_queries_per_request": max(args.big_queries, DEFAULT_MAX_QUERIES_PER_REQUEST)}
        if args.servers == "process":
            return ServerProcess(our_server(index_dir, **settings), f"ours (max_batch_queries {max_batch_queries})")
        return create_app(index, **settings)

    print(f"fairness: {args.probe_clients} probe clients sending requests of 1 query (topk {args.topk}) back to back: "
          f"{args.probes} each alone, and for as long as one request of {args.big_queries} queries is unanswered; "
          f"batches of at most {args.max_batch_queries} queries and {args.max_batch_ms:g} ms of index time, "
          f"{args.max_wait_ms} ms window"
          + (f"; and, as before chunking, with the big request in ONE batch (max_batch_queries {args.big_queries})"
             if args.compare_unchunked else ""), flush=True)
    modes = [("alone", False, "chunked"), ("with big", True, "chunked")]
    if args.compare_unchunked:
        modes.append(("with big, unchunked", True, "unchunked"))
    rounds: dict[str, list[dict]] = {name: [] for name, _, _ in modes}
    with contextlib.ExitStack() as stack:
        calls = stack.enter_context(_CallLog(index)) if args.servers == "thread" else None
        started = _start_all(stack, {"chunked": app(args.max_batch_queries, args.max_batch_ms),
                                     "unchunked": app(max(args.big_queries, args.max_batch_queries), 0)})
        urls = {name: url for name, (url, _) in started.items()}
        chunked = urls["chunked"]
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
                    line += f"  | big: HTTP {r['big_status']} in {r['big_s']:.2f} s{_waited(r)}"
                print(line, flush=True)
    keys = ("p50_ms", "p95_ms", "max_ms", "big_s", "probe_index_calls_waited_max", "probe_queries_waited_max")
    median = {name: {k: round(statistics.median(r[k] for r in runs), 3) for k in keys if k in runs[0]}
              for name, runs in rounds.items()}
    alone, loaded = median["alone"], median["with big"]
    p50_ratio, p95_ratio = loaded["p50_ms"] / alone["p50_ms"], loaded["p95_ms"] / alone["p95_ms"]
    print(f"median of {args.repeats} round(s):")
    for name, m in median.items():
        print(f"  {name:<19} probes p50 {m['p50_ms']:>8.1f} ms  p95 {m['p95_ms']:>8.1f} ms  max {m['max_ms']:>8.1f} ms"
              + (f"  | big request {m['big_s']:.2f} s{_waited(m)}" if "big_s" in m else ""))
    print(f"ratio with/without the big request (chunked; medians): p50 x{p50_ratio:.2f}, p95 x{p95_ratio:.2f}")
    worst_met = loaded["max_ms"] <= 500
    print(f"  target: worst probe latency with the big request <= 500 ms: {'met' if worst_met else 'NOT MET'} "
          f"({loaded['max_ms']:.0f} ms)")
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
                     "max_batch_ms": args.max_batch_ms, "max_wait_ms": args.max_wait_ms,
                     "request_timeout_s": args.request_timeout_s},
            "servers": args.servers, "worst_latency_target_met": worst_met,
            "repeats": args.repeats, "median": median, "p50_ratio": round(p50_ratio, 3), "p95_ratio": round(p95_ratio, 3),
            **figures, "one_mb_query": {"status": huge.status_code, "ms": round(huge_ms, 1)},
            "errors": errors, "big_statuses": statuses, "rounds": rounds}


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__)
    parser.add_argument("--mode", choices=("throughput", "fairness", "overhead"), default="throughput",
                        help="ours vs a peer under one-query requests, small probes with vs without a big request, "
                             "or the service's own CPU per request over an index that costs nothing")
    parser.add_argument("--index", help="a built index folder (default: build a small MiniLM index in a temp folder)")
    parser.add_argument("--passages", type=int, default=2000, help="passages in the index built without --index")
    parser.add_argument("--clients", default="1,16,64", help="throughput mode: concurrent client counts, comma-separated")
    parser.add_argument("--total-requests", type=int, default=400,
                        help="throughput mode: one-query requests per round and contender (at least 5 per client)")
    parser.add_argument("--peer-url", help="throughput mode: a running Search-R1-compatible server to compare against "
                                           "(default: the per-request reference server over the same index)")
    parser.add_argument("--peer-script", help="throughput mode: the peer is Search-R1's own retrieval_server.py at this "
                             "path, run unmodified in a process of its own over --index (_search_r1_server.py)")
    parser.add_argument("--limit-queries-per-request", type=int, default=16,
                        help="throughput mode: queries per request of the batched-limit rounds (1: none)")
    parser.add_argument("--limit-clients", type=int, default=16, help="throughput mode: clients of the batched-limit rounds")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--query-precision", help="throughput mode: ours' --query-precision (default: the service's, "
                                                  "native), e.g. fp32 to measure what bf16 queries change")
    parser.add_argument("--servers", choices=("process", "thread"), default="process",
                        help="each server in a process of its own (as users run them), or in threads of this process")
    parser.add_argument("--max-batch-queries", type=int, default=256, help="fairness mode: the servers' batch bound")
    parser.add_argument("--max-batch-ms", type=float, default=ServeConfig().max_batch_ms,
                        help="fairness mode: the chunked server's time bound of a batch (0: by count alone)")
    parser.add_argument("--max-wait-ms", type=float, default=ServeConfig().max_wait_ms,
                        help="fairness mode: the servers' batching window")
    parser.add_argument("--warmup", type=int, default=8, help="unmeasured requests to each server first")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each contender; the medians are compared")
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
    if args.peer_url and args.peer_script:
        parser.error("--peer-url and --peer-script name two peers: give one")
    logging.basicConfig(level=logging.WARNING)
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="bench_service_") as tmp:
        if args.index:
            index, origin, index_dir = open_index(args.index), args.index, args.index
        else:
            (index, origin), index_dir = build_bench_index(Path(tmp), args.passages), str(Path(tmp) / "index")
        device = describe_device() | {"load_average_at_start": load_average()}
        m = index.manifest
        print(f"{device_line(device)}; load average {device['load_average_at_start']}")
        print(f"index: {m.backend}/{m.index_type}, {len(index)} passages ({origin}), "
              f"encoder {(m.encoder or {}).get('model')}, dim {m.dim}")
        figures = {"throughput": run_throughput, "fairness": run_fairness, "overhead": run_overhead}[args.mode](
            index, index_dir, rng, args)
    device["load_average_at_end"] = load_average()
    print(f"load average at the end: {device['load_average_at_end']}")
    figures["index"] = {"backend": m.backend, "type": m.index_type, "passages": len(index), "origin": origin,
                        "encoder": (m.encoder or {}).get("model")}
    write_json(args.json, "bench_service" if args.mode == "throughput" else f"bench_service_{args.mode}", args, device,
               figures)
    return figures


if __name__ == "__main__":
    main()
