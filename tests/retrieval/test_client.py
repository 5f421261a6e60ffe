"""The retrieval clients: in-process and HTTP (batching, retries, back-off, errors), against the service."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from agentic_retriever.base.client import HttpRetrievalClient, RetrievalClient, RetrievalServiceError
from agentic_retriever.retrieval import LocalRetrievalClient
from agentic_retriever.server import ServerThread, create_app
from tests.retrieval.topics import CONTENTS, PASSAGES, QUERIES


class CountingTransport(httpx.HTTPTransport):
    def __init__(self):
        super().__init__()
        self.bodies = []

    def handle_request(self, request):
        self.bodies.append(json.loads(request.read() or b"null"))
        return super().handle_request(request)


def test_both_clients_satisfy_the_retrieval_client_protocol(bm25):
    assert isinstance(LocalRetrievalClient(bm25), RetrievalClient)
    with HttpRetrievalClient("http://127.0.0.1:9") as http:
        assert isinstance(http, RetrievalClient)


def test_http_client_returns_what_the_local_client_returns(dense_qsq):
    queries = ["mercury", "who wrote hamlet", "python", "largest river"]
    questions = ["Which planet is the closest to the Sun?", None, "Which snakes live in Africa?", None]
    local = LocalRetrievalClient(dense_qsq).retrieve(queries, 3, questions=questions)
    with ServerThread(create_app(dense_qsq)) as url, HttpRetrievalClient(url + "/retrieve") as http:
        remote = http.retrieve(queries, 3, questions=questions)
        health = http.health()
    assert [[(p.id, p.title, p.text) for p in hits] for hits in remote] == \
        [[(p.id, p.title, p.text) for p in hits] for hits in local]
    assert [p.score for hits in remote for p in hits] == \
        pytest.approx([p.score for hits in local for p in hits], abs=1e-5)
    assert remote[0][0].title == "Mercury (planet)" and remote[0][0].text == PASSAGES[0][1]
    assert health["composition"] == "question_sep_query" and health["index_size"] == len(PASSAGES)


def test_http_client_splits_a_large_call_into_batch_size_requests(bm25):
    queries = [QUERIES[i % len(QUERIES)] + f" {i}" for i in range(150)]
    transport = CountingTransport()
    with ServerThread(create_app(bm25)) as url, HttpRetrievalClient(url, batch_size=64, transport=transport) as http:
        remote = http.retrieve(queries, 2)
    assert [len(body["queries"]) for body in transport.bodies] == [64, 64, 22]
    assert [body["queries"][0] for body in transport.bodies] == [queries[0], queries[64], queries[128]]
    local = LocalRetrievalClient(bm25).retrieve(queries, 2)
    assert len(remote) == 150
    assert [[p.id for p in hits] for hits in remote] == [[p.id for p in hits] for hits in local]


def test_http_client_raises_on_a_4xx_with_the_servers_message_without_retrying(bm25):
    transport = CountingTransport()
    with ServerThread(create_app(bm25)) as url, \
            HttpRetrievalClient(url, max_retries=3, backoff=5.0, transport=transport) as http:
        with pytest.raises(RetrievalServiceError, match="topk") as caught:
            http.retrieve(["chess"], 5000)
        with pytest.raises(ValueError, match="questions must be parallel"):
            http.retrieve(["chess", "jazz"], 1, questions=["Q"])
    assert caught.value.status_code == 422
    assert len(transport.bodies) == 1, "a 4xx is not retried"


def _mock_service(statuses: list[int]):
    """A transport answering each status in turn, then a valid one-hit response."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        if len(seen) <= len(statuses):
            return httpx.Response(statuses[len(seen) - 1], json={"detail": "busy, try later"})
        hits = [[{"document": {"id": "3", "contents": CONTENTS["3"]}, "score": 0.5}] for _ in seen[-1]["queries"]]
        return httpx.Response(200, json={"result": hits})

    return httpx.MockTransport(handler), seen


def test_http_client_retries_503_and_429_with_backoff_then_succeeds():
    transport, seen = _mock_service([503, 429])
    with HttpRetrievalClient("http://retriever", max_retries=3, backoff=0.01, transport=transport) as http:
        result = http.retrieve(["who wrote hamlet"], 1)
    assert len(seen) == 3
    assert result[0][0].id == "3" and result[0][0].title == "Hamlet" and result[0][0].score == 0.5


def test_http_client_gives_up_after_max_retries_naming_the_last_error():
    transport, seen = _mock_service([503] * 10)
    with HttpRetrievalClient("http://retriever", max_retries=2, backoff=0.01, transport=transport) as http:
        with pytest.raises(RetrievalServiceError, match="busy, try later") as caught:
            http.retrieve(["q"], 1)
    assert len(seen) == 3 and caught.value.status_code == 503


def test_http_client_retries_connection_errors_then_raises():
    with socket.socket() as probe:  # a loopback port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with HttpRetrievalClient(f"http://127.0.0.1:{port}", max_retries=1, backoff=0.01, timeout=2.0) as http:
        with pytest.raises(RetrievalServiceError, match="after 2 attempts.*Connect"):
            http.retrieve(["q"], 1)
