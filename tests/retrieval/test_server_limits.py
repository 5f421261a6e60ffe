"""The retrieval service's guards that act outside the parsed request: the byte limit on a request body, enforced
before FastAPI parses it (a Content-Length over it, a chunked body passing it), and a client that hangs up while
its request waits or is searched (the rest of it is dropped). Requests go over raw sockets where the test needs
control over what is sent and when the connection closes; the hang-up watcher and the batcher's answer future are
also driven on an event loop directly."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from agentic_retriever.server import (
    DEFAULT_MAX_QUERIES_PER_REQUEST, DEFAULT_MAX_QUERY_CHARS, DEFAULT_MAX_REQUEST_BYTES, ServerThread, create_app,
)
from agentic_retriever.server.app import ClientDisconnected, unless_disconnected
from agentic_retriever.server.batcher import _Batcher
from agentic_retriever.server.schema import RetrieveRequest
from agentic_retriever.server.slot import IndexSlot
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


def _receive_then(message_or_error, delivered: asyncio.Event):
    """An ASGI ``receive`` after the body: it waits for `delivered`, then gives `message_or_error` (raises it when
    it is an exception)."""
    async def receive():
        await delivered.wait()
        if isinstance(message_or_error, BaseException):
            raise message_or_error
        return message_or_error
    return receive


def test_unless_disconnected_gives_the_answer_and_stops_watching_for_a_hang_up():
    async def run():
        answer = asyncio.get_running_loop().create_future()
        answer.get_loop().call_soon(answer.set_result, "rows")
        before = asyncio.all_tasks()
        result = await unless_disconnected(answer, _receive_then({"type": "http.disconnect"}, asyncio.Event()))
        await asyncio.sleep(0)  # the watcher's cancellation runs
        return result, asyncio.all_tasks() - before
    assert asyncio.run(run()) == ("rows", set())


def test_unless_disconnected_cancels_the_answer_when_the_client_hangs_up_or_receive_fails():
    async def run(message_or_error):
        answer, hung_up = asyncio.get_running_loop().create_future(), asyncio.Event()
        hung_up.set()
        with pytest.raises(Exception) as raised:
            await unless_disconnected(answer, _receive_then(message_or_error, hung_up))
        return raised.type, answer.cancelled()
    assert asyncio.run(run({"type": "http.disconnect"})) == (ClientDisconnected, True)
    assert asyncio.run(run(OSError("the server's receive broke"))) == (OSError, True)


def test_unless_disconnected_passes_on_the_cancellation_of_its_own_task():
    """The server stopping cancels the handler's task: that is a cancellation, not a hang-up, and the answer goes too."""
    async def run():
        answer = asyncio.get_running_loop().create_future()
        handler = asyncio.ensure_future(unless_disconnected(answer, _receive_then({"type": "http.disconnect"},
                                                                                   asyncio.Event())))
        await asyncio.sleep(0)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        return answer.cancelled()
    assert asyncio.run(run())


def test_a_request_answered_or_abandoned_leaves_no_timer_and_an_abandoned_one_is_never_searched(bm25, monkeypatch):
    """`_Batcher.submit`'s future: the timer of its time limit is cancelled with the answer (the event loop holds
    none until it expires), and cancelling the future (a hang-up) counts the request abandoned at the next step
    of the loop and never searches it."""
    counter = CountingRetrieve(bm25)
    monkeypatch.setattr(bm25, "retrieve", counter)

    async def run():
        loop = asyncio.get_running_loop()
        timers, call_later = [], loop.call_later
        monkeypatch.setattr(loop, "call_later", lambda *args: timers.append(call_later(*args)) or timers[-1])
        requests = _Batcher(IndexSlot(bm25), max_batch_queries=8, max_wait_s=0.0, batching=True, timeout_s=600.0)
        first = await requests.submit(RetrieveRequest(queries=["chess"], topk=1))
        requests.submit(RetrieveRequest(queries=["tea"], topk=1)).cancel()
        await asyncio.sleep(0)
        abandoned = requests.stats.abandoned_requests
        third = await requests.submit(RetrieveRequest(queries=["chess"], topk=1))
        await requests.stop()
        return first, abandoned, third, [timer.cancelled() for timer in timers]
    first, abandoned, third, timers = asyncio.run(run())
    assert [first[0][0][0].id, first[1], third[0][0][0].id] == ["15", 0, "15"]
    assert abandoned == 1 and counter.calls == [["chess"], ["chess"]] and timers == [True, True, True]
