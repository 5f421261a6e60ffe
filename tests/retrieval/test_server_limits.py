"""The retrieval service's guards that act outside the parsed request: the byte limit on a request body, enforced
before FastAPI parses it (a Content-Length over it, a chunked body passing it), and a client that hangs up while
its request waits or is searched (the rest of it is dropped). Requests go over raw sockets where the test needs
control over what is sent and when the connection closes."""

from __future__ import annotations

import json
import socket
import threading
from urllib.parse import urlsplit

import httpx
from fastapi.testclient import TestClient

from agentic_retriever.server import (
    DEFAULT_MAX_QUERIES_PER_REQUEST, DEFAULT_MAX_QUERY_CHARS, DEFAULT_MAX_REQUEST_BYTES, ServerThread, create_app,
)
from tests.fakes import CountingRetrieve, wait_until
from tests.retrieval.topics import QUERIES

LIMIT = 1000


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def _head(**headers: str) -> bytes:
    lines = ["POST /retrieve HTTP/1.1", "Host: test", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _read_response(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of one HTTP/1.1 answer with a Content-Length (a timeout fails the test)."""
    data = b""
    while b"\r\n\r\n" not in data:
        received = sock.recv(65536)
        assert received, f"the server closed the connection without an answer: {data!r}"
        data += received
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        received = sock.recv(65536)
        assert received, "the server closed the connection in the middle of its answer"
        body += received
    return int(lines[0].split()[1]), json.loads(body)


# ------------------------------------------------------------------------------------------- byte limit


def test_a_content_length_over_the_limit_is_refused_before_the_body_is_read(bm25, monkeypatch):
    """Only the headers are sent: the 413 comes without the server waiting for a body, the index never runs."""
    counter = CountingRetrieve(bm25)
    monkeypatch.setattr(bm25, "retrieve", counter)
    app = create_app(bm25, max_request_bytes=LIMIT)
    with ServerThread(app) as url:
        with _connect(url) as sock:
            sock.sendall(_head(Content_Length=str(10**10)))
            status, body = _read_response(sock)
        sent = httpx.post(f"{url}/retrieve", content=json.dumps({"queries": ["x" * LIMIT]}),
                          headers={"content-type": "application/json"}, timeout=30)
        stats = httpx.get(f"{url}/health").json()["stats"]
    assert status == 413
    assert body["detail"] == (f"the request body is too large: {10**10} bytes (Content-Length), the limit is {LIMIT} "
                              f"bytes (server setting max_request_bytes, --max-request-bytes); send fewer queries "
                              f"per request")
    assert sent.status_code == 413 and "max_request_bytes" in sent.json()["detail"]
    assert counter.calls == []
    assert stats["rejected_requests"] == 2 and stats["requests"] == 0


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(bm25, monkeypatch):
    """No Content-Length: the body is counted as it arrives; the last chunk is never sent, so only a refusal
    made while receiving can answer."""
    counter = CountingRetrieve(bm25)
    monkeypatch.setattr(bm25, "retrieve", counter)
    with ServerThread(create_app(bm25, max_request_bytes=LIMIT)) as url:
        with _connect(url) as sock:
            sock.sendall(_head(Transfer_Encoding="chunked") + _chunk(b'{"queries": ["' + b"a" * 600))
            sock.sendall(_chunk(b"b" * 600))
            status, body = _read_response(sock)
    assert status == 413
    assert f"more than {LIMIT} bytes, the limit is {LIMIT} bytes" in body["detail"]
    assert "max_request_bytes" in body["detail"] and "--max-request-bytes" in body["detail"]
    assert counter.calls == []


def test_requests_within_the_byte_limit_are_answered_with_or_without_a_content_length(bm25):
    request = json.dumps({"queries": ["chess"], "topk": 1}).encode()
    with ServerThread(create_app(bm25, max_request_bytes=LIMIT)) as url:
        sized = httpx.post(f"{url}/retrieve", content=request, headers={"content-type": "application/json"}, timeout=30)
        with _connect(url) as sock:
            sock.sendall(_head(Transfer_Encoding="chunked") + _chunk(request[:10]) + _chunk(request[10:]) + _chunk(b""))
            status, chunked = _read_response(sock)
    assert sized.status_code == 200 and sized.json()["result"][0][0]["id"] == "15"
    assert status == 200 and chunked == sized.json()


def test_health_reports_the_byte_limit_and_the_default_admits_a_request_at_the_other_limits(bm25):
    with TestClient(create_app(bm25)) as client:
        default = client.get("/health").json()["max_request_bytes"]
    with TestClient(create_app(bm25, max_request_bytes=LIMIT)) as client:
        assert client.get("/health").json()["max_request_bytes"] == LIMIT
    largest = {"queries": ["q" * DEFAULT_MAX_QUERY_CHARS] * DEFAULT_MAX_QUERIES_PER_REQUEST, "topk": 3}
    assert default == DEFAULT_MAX_REQUEST_BYTES >= len(json.dumps(largest))


# ------------------------------------------------------------------------------------------- hang-ups


def test_a_client_that_hangs_up_has_the_rest_of_its_request_dropped(bm25, monkeypatch):
    """10 queries in chunks of 2: the client hangs up while the first chunk is searched; that chunk finishes,
    the other 4 are never searched, and the service answers the next request."""
    hold = threading.Event()
    counter = CountingRetrieve(bm25, hold_first=hold)
    monkeypatch.setattr(bm25, "retrieve", counter)
    app = create_app(bm25, max_batch_queries=2)
    queries = [QUERIES[i % len(QUERIES)] for i in range(10)]
    request = json.dumps({"queries": queries, "topk": 2}).encode()
    stats = app.state.batcher.stats
    with ServerThread(app) as url:
        sock = _connect(url)
        sock.sendall(_head(Content_Length=str(len(request))) + request)
        wait_until(lambda: len(counter.calls) == 1, "the first chunk to be searched")
        sock.close()
        wait_until(lambda: stats.as_dict().get("abandoned_requests") == 1,
                   "the service to drop the request of the client that hung up", timeout=10)
        hold.set()  # the chunk in flight finishes; nothing is left of the request to search
        after = httpx.post(f"{url}/retrieve", json={"queries": ["chess"], "topk": 1}, timeout=30)
        health = httpx.get(f"{url}/health").json()["stats"]
    assert after.status_code == 200 and after.json()["result"][0][0]["id"] == "15"
    assert counter.calls == [queries[:2], ["chess"]]
    assert (health["abandoned_requests"], health["requests"], health["failed_requests"]) == (1, 2, 0)
