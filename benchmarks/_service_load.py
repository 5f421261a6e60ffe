"""Load generation for `bench_service.py`: cheap keep-alive HTTP/1.1 clients on asyncio streams, a closed-loop
load of one-query requests against any ``/retrieve`` URL, and the latency percentiles and machine load it
reports. Only loopback (or the URL the user names); a fixed number of requests; it stops by itself.

Not a benchmark itself (run_all.py only runs ``bench_*.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from urllib.parse import urlsplit


def load_average() -> list[float] | None:
    """1/5/15-minute load averages: other work on a shared machine shows up here (and in the figures)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected a plain http://HOST:PORT URL, got {url!r}")
    return parts.hostname, parts.port or 80


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: a load generator that costs the server's
    process far less CPU than httpx (whose per-request overhead would otherwise dominate on a small CPU).
    `headers` holds the last response's headers (names in lower case)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None
        self.headers: dict[str, str] = {}

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
        self.headers = {name.strip().lower().decode("latin-1"): value.strip().decode("latin-1")
                        for name, _, value in (line.partition(b":") for line in lines[1:] if line)}
        if self.headers.get("transfer-encoding", "").lower() == "chunked":  # a streamed answer
            return status, await self._chunked_body()
        if "content-length" not in self.headers:
            raise RuntimeError(f"response without Content-Length or chunked encoding: {head[:200]!r}")
        return status, await self.reader.readexactly(int(self.headers["content-length"]))

    async def _chunked_body(self) -> bytes:
        """A chunked body (RFC 9112, section 7.1): hex size lines and their data, up to the zero-size chunk."""
        parts = []
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)
        while await self.reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, then the empty line
            pass
        return b"".join(parts)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def closed_loop(url: str, queries: list[str], clients: int, per_client: int, topk: int,
                      queries_per_request: int = 1) -> dict:
    """`clients` connections each sending `per_client` requests of `queries_per_request` queries back to back (a new
    one as soon as the last is answered). Returns requests/s, queries/s, latency percentiles, errors and each
    request's result ids (of its first query)."""
    host, port = host_port(url)
    latencies: list[float] = []
    answers: dict[int, list[str]] = {}
    errors: list[str] = []

    async def client(c: int) -> None:
        connection = RawConnection(host, port)
        try:
            for r in range(per_client):
                number = c * per_client + r
                first = number * queries_per_request
                body = {"queries": [queries[(first + i) % len(queries)] for i in range(queries_per_request)],
                        "topk": topk, "return_scores": True}
                started = time.perf_counter()
                try:
                    status, content = await connection.post_json("/retrieve", body)
                except (OSError, asyncio.IncompleteReadError) as error:
                    errors.append(f"{type(error).__name__}: {error}")
                    await connection.close()
                    connection = RawConnection(host, port)
                    continue
                latencies.append(time.perf_counter() - started)
                if status != 200:
                    errors.append(f"{status}: {content[:200]!r}")
                    continue
                answers[number] = [hit["document"]["id"] for hit in json.loads(content)["result"][0]]
        finally:
            await connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - started
    if not latencies:
        raise RuntimeError(f"no request to {url} was answered: {errors[:3]}")
    return {"requests": len(latencies), "errors": len(errors), "first_errors": errors[:3],
            "wall_s": round(wall, 3), "requests_per_s": round(len(latencies) / wall, 1),
            "queries_per_s": round(len(latencies) * queries_per_request / wall, 1),
            "p50_ms": round(percentile(latencies, 50) * 1000, 2), "p95_ms": round(percentile(latencies, 95) * 1000, 2),
            "p99_ms": round(percentile(latencies, 99) * 1000, 2),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 2), "answers": answers}
