"""The retrieval service: Search-R1 API, questions, validation, health, micro-batching (fairness, limits and
batch-mates: test_server_fairness.py; its clients: test_client.py; the shared indexes: conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from agentic_retriever.base.encoder import SEPARATOR
from agentic_retriever.server import ServerThread, create_app
from tests.fakes import CountingRetrieve, free_port, post_in_thread, result_ids, result_scores, wait_until
from tests.retrieval.topics import CONTENTS, PASSAGES, QUERIES


# ---------------------------------------------------------------------------------------------- API shape


def test_retrieve_with_scores_returns_search_r1_documents_best_first(dense):
    with TestClient(create_app(dense)) as client:
        response = client.post("/retrieve", json={"queries": ["who wrote hamlet", "capital of france"], "topk": 3,
                                                  "return_scores": True})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"result"} and len(body["result"]) == 2
    expected = dense.retrieve(["who wrote hamlet", "capital of france"], 3)
    for hits, want in zip(body["result"], expected):
        assert len(hits) == 3
        for hit, passage in zip(hits, want):
            assert set(hit) == {"document", "score"}
            assert set(hit["document"]) == {"id", "contents"}
            assert hit["document"]["id"] == passage.id
            assert hit["document"]["contents"] == CONTENTS[passage.id] == f'"{passage.title}"\n{passage.text}'
            assert hit["score"] == pytest.approx(passage.score, abs=1e-5)
        scores = [hit["score"] for hit in hits]
        assert scores == sorted(scores, reverse=True)
    assert body["result"][0][0]["document"]["contents"].startswith('"Hamlet"\n')
    assert body["result"][1][0]["document"]["contents"].startswith('"Paris"\n')


def test_retrieve_without_scores_returns_bare_id_and_contents(dense):
    with TestClient(create_app(dense)) as client:
        body = client.post("/retrieve", json={"queries": ["python"], "topk": 2, "return_scores": False}).json()
        default = client.post("/retrieve", json={"queries": ["python"]}).json()
    assert set(body) == {"result"}
    hits = body["result"][0]
    assert len(hits) == 2
    for hit in hits:
        assert set(hit) == {"id", "contents"}
        assert hit["contents"] == CONTENTS[hit["id"]]
    assert len(default["result"][0]) == 3, "topk defaults to 3 and return_scores to false"
    assert set(default["result"][0][0]) == {"id", "contents"}


def test_empty_queries_give_empty_result_without_an_index_call(dense, monkeypatch):
    counter = CountingRetrieve(dense)
    monkeypatch.setattr(dense, "retrieve", counter)
    with TestClient(create_app(dense)) as client:
        response = client.post("/retrieve", json={"queries": [], "topk": 3, "return_scores": True})
    assert response.status_code == 200 and response.json() == {"result": []}
    assert counter.calls == []


def test_topk_larger_than_the_index_returns_every_passage(bm25):
    with TestClient(create_app(bm25)) as client:
        body = client.post("/retrieve", json={"queries": ["mercury planet"], "topk": 1000}).json()
    assert len(body["result"][0]) <= len(PASSAGES)
    assert body["result"][0][0]["id"] == "0"


# ---------------------------------------------------------------------------------------------- questions


def test_questions_compose_question_sep_query_for_a_context_aware_encoder(dense_qsq):
    assert dense_qsq.composition == "question_sep_query"
    question = "Which planet is the closest to the Sun?"
    with TestClient(create_app(dense_qsq)) as client:
        plain = client.post("/retrieve", json={"queries": ["mercury"], "topk": 5, "return_scores": True}).json()
        composed = client.post("/retrieve", json={"queries": ["mercury"], "topk": 5, "return_scores": True,
                                                  "questions": [question]}).json()
    direct = dense_qsq.search([f"{question}{SEPARATOR}mercury"], k=5)
    alone = dense_qsq.search(["mercury"], k=5)
    assert result_ids(composed["result"]) == direct.ids
    assert result_scores(composed["result"])[0] == pytest.approx(direct.scores[0], abs=1e-5)
    assert result_ids(plain["result"]) == alone.ids
    assert result_scores(composed["result"])[0] != pytest.approx(result_scores(plain["result"])[0], abs=1e-4), \
        "the question must change the retriever input"
    assert composed["result"][0][0]["document"]["id"] == "0", "the question points at Mercury the planet"


def test_questions_may_be_null_per_query_and_histories_are_accepted(dense_qsq):
    question = "Which planet is the closest to the Sun?"
    with TestClient(create_app(dense_qsq)) as client:
        body = client.post("/retrieve", json={
            "queries": ["mercury", "mercury"], "topk": 4, "return_scores": True,
            "questions": [question, None], "histories": [["smallest planet"], None]}).json()
    expected = dense_qsq.search(["mercury", "mercury"], k=4, questions=[question, None],
                                histories=[["smallest planet"], None])
    assert result_ids(body["result"]) == expected.ids
    assert result_ids(body["result"])[1] == dense_qsq.search(["mercury"], k=4).ids[0]


def test_plain_query_encoder_ignores_questions(dense):
    with TestClient(create_app(dense)) as client:
        plain = client.post("/retrieve", json={"queries": ["python"], "topk": 4, "return_scores": True}).json()
        asked = client.post("/retrieve", json={"queries": ["python"], "topk": 4, "return_scores": True,
                                               "questions": ["Which snakes live in Africa?"]}).json()
    assert result_ids(asked["result"]) == result_ids(plain["result"])
    assert result_scores(asked["result"])[0] == pytest.approx(result_scores(plain["result"])[0], abs=1e-5)


def test_bm25_accepts_and_ignores_questions(bm25):
    with TestClient(create_app(bm25)) as client:
        plain = client.post("/retrieve", json={"queries": ["capital city"], "topk": 3, "return_scores": True}).json()
        asked = client.post("/retrieve", json={"queries": ["capital city"], "topk": 3, "return_scores": True,
                                               "questions": ["Where is the Amazon river?"],
                                               "histories": [["largest river"]]}).json()
    assert plain == asked
    assert {hit["document"]["id"] for hit in plain["result"][0][:2]} == {"5", "6"}


# ---------------------------------------------------------------------------------------------- bad input


BAD_REQUESTS = {
    "missing queries": ({"json": {"topk": 3}}, "queries"),
    "queries not a list": ({"json": {"queries": "who wrote hamlet"}}, "queries"),
    "query not a string": ({"json": {"queries": [3]}}, "queries"),
    "topk zero": ({"json": {"queries": ["a"], "topk": 0}}, "topk"),
    "topk too large": ({"json": {"queries": ["a"], "topk": 1001}}, "topk"),
    "topk not a number": ({"json": {"queries": ["a"], "topk": "x"}}, "topk"),
    "questions length mismatch": ({"json": {"queries": ["a", "b"], "questions": ["Q"]}}, "questions"),
    "histories length mismatch": ({"json": {"queries": ["a"], "histories": [["x"], ["y"]]}}, "histories"),
    "malformed json": ({"content": b'{"queries": ["a"', "headers": {"content-type": "application/json"}}, "JSON"),
    "body not an object": ({"json": ["a", "b"]}, "body"),
    "empty body": ({"content": b"", "headers": {"content-type": "application/json"}}, "body"),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request_gets_a_4xx_naming_the_problem_and_the_server_keeps_answering(bm25, name):
    kwargs, mention = BAD_REQUESTS[name]
    with TestClient(create_app(bm25), raise_server_exceptions=False) as client:
        response = client.post("/retrieve", **kwargs)
        assert 400 <= response.status_code < 500, response.text
        assert mention in response.json()["detail"]
        after = client.post("/retrieve", json={"queries": ["chess"], "topk": 1})
    assert after.status_code == 200
    assert after.json()["result"][0][0]["id"] == "15"


def test_index_failure_fails_only_its_own_request_with_a_500_and_message(bm25, monkeypatch):
    counter = CountingRetrieve(bm25, fail_on="boom")
    monkeypatch.setattr(bm25, "retrieve", counter)
    app = create_app(bm25, max_wait_ms=300)
    with ServerThread(app) as url:
        responses = {}
        barrier = threading.Barrier(2)

        def send(query):
            barrier.wait()
            responses[query] = httpx.post(f"{url}/retrieve", json={"queries": [query], "topk": 1}, timeout=30)

        threads = [threading.Thread(target=send, args=(q,)) for q in ("boom", "chess")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = httpx.post(f"{url}/retrieve", json={"queries": ["jazz"], "topk": 1}, timeout=30)
    assert responses["boom"].status_code == 500
    assert "the index is on fire" in responses["boom"].json()["detail"]
    assert responses["chess"].status_code == 200 and responses["chess"].json()["result"][0][0]["id"] == "15"
    assert after.status_code == 200 and after.json()["result"][0][0]["id"] == "12"
    assert ["boom", "chess"] in counter.calls or ["chess", "boom"] in counter.calls, "both went out as one batch"


def test_an_exception_escaping_retrieve_gets_a_500_and_the_server_keeps_answering(bm25, monkeypatch):
    """/retrieve is answered in front of FastAPI's error page (`ServiceApp`): a bug there is uvicorn's 500."""
    from agentic_retriever.server import app as app_module

    render, calls = app_module._render, []

    def render_failing_once(rows, with_scores):
        calls.append(len(rows))
        if len(calls) == 1:
            raise RuntimeError("a rendering bug")
        return render(rows, with_scores)
    monkeypatch.setattr(app_module, "_render", render_failing_once)
    with ServerThread(create_app(bm25)) as url:
        failed = httpx.post(f"{url}/retrieve", json={"queries": ["chess"], "topk": 1}, timeout=30)
        after = httpx.post(f"{url}/retrieve", json={"queries": ["chess"], "topk": 1}, timeout=30)
    assert (failed.status_code, failed.text) == (500, "Internal Server Error") and calls == [1, 1]
    assert after.status_code == 200 and after.json()["result"][0][0]["id"] == "15"


# ---------------------------------------------------------------------------------------------- health


def test_health_reports_the_served_index(dense_qsq, bm25):
    with TestClient(create_app(dense_qsq, batching=False)) as client:
        health = client.get("/health").json()
    assert health["status"] == "ok"
    assert health["backend"] == "dense" and health["index_type"] == "flat"
    assert health["model"] == "default"
    assert health["composition"] == "question_sep_query"
    assert health["index_size"] == len(PASSAGES)
    assert health["dim"] == 384
    assert health["batching"] is False
    assert isinstance(health["uptime_s"], float) and health["uptime_s"] >= 0
    with TestClient(create_app(bm25)) as client:
        sparse = client.get("/health").json()
    assert sparse["backend"] == "bm25" and sparse["model"] is None and sparse["dim"] is None
    assert sparse["composition"] == "query" and sparse["batching"] is True
    assert health["encoder_fingerprint"] == dense_qsq.manifest.encoder["fingerprint"] and sparse["encoder_fingerprint"] is None
    assert health["corpus_sha256"] == sparse["corpus_sha256"] == bm25.manifest.corpus_sha256
    from agentic_retriever.base.fingerprint import service_identity

    identity = service_identity("http://h:1", health)
    assert "url" not in identity and identity["encoder_fingerprint"] == health["encoder_fingerprint"], \
        "a client's cache keys on what the service serves, not on its address"


# ---------------------------------------------------------------------------------------------- batching


def _request(i: int) -> dict:
    """Request i of the concurrency tests: varied queries, topk, and questions on half of them."""
    body = {"queries": [QUERIES[i % len(QUERIES)]], "topk": 1 + i % 4, "return_scores": True}
    if i % 2:
        body["questions"] = ["Which planet is the closest to the Sun?" if i % 4 == 1 else None]
    return body


def _send_concurrently(url: str, bodies: list[dict]) -> list[httpx.Response]:
    responses: list[httpx.Response | None] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def send(i):
        with httpx.Client(timeout=60) as http:
            barrier.wait()
            responses[i] = http.post(f"{url}/retrieve", json=bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return responses


def test_concurrent_requests_are_gathered_into_fewer_index_calls_with_the_same_answers(dense_qsq, monkeypatch):
    bodies = [_request(i) for i in range(32)]
    with TestClient(create_app(dense_qsq, batching=False)) as client:
        alone = [client.post("/retrieve", json=body).json() for body in bodies]
    counter = CountingRetrieve(dense_qsq)
    monkeypatch.setattr(dense_qsq, "retrieve", counter)
    with ServerThread(create_app(dense_qsq, max_wait_ms=50)) as url:
        responses = _send_concurrently(url, bodies)
        stats = httpx.get(f"{url}/health").json()["stats"]
    assert all(r.status_code == 200 for r in responses)
    for body, response, single in zip(bodies, responses, alone):
        got = response.json()["result"]
        assert len(got[0]) == body["topk"]
        assert result_ids(got) == result_ids(single["result"])
        assert result_scores(got)[0] == pytest.approx(result_scores(single["result"])[0], abs=1e-4)
    assert len(counter.calls) < len(bodies) / 2, f"{len(bodies)} concurrent requests took {len(counter.calls)} index calls"
    assert max(len(c) for c in counter.calls) > 1
    assert counter.max_active == 1, "index calls never overlap"
    assert stats["requests"] == len(bodies) and stats["index_calls"] == len(counter.calls)


def test_health_counts_the_seconds_spent_in_index_calls(bm25, monkeypatch):
    """``stats.index_seconds``: the index thread's busy time (a benchmark divides it by a round's wall time)."""
    original = bm25.retrieve

    def slow_retrieve(*args, **kwargs):
        time.sleep(0.05)
        return original(*args, **kwargs)

    monkeypatch.setattr(bm25, "retrieve", slow_retrieve)
    with TestClient(create_app(bm25, batching=False)) as client:
        started = time.perf_counter()
        for query in QUERIES[:4]:
            assert client.post("/retrieve", json={"queries": [query]}).status_code == 200
        wall = time.perf_counter() - started
        stats = client.get("/health").json()["stats"]
    assert stats["index_calls"] == 4 and 4 * 0.05 <= stats["index_seconds"] <= wall


def test_max_batch_queries_caps_the_gathered_batch(bm25, monkeypatch):
    counter = CountingRetrieve(bm25)
    monkeypatch.setattr(bm25, "retrieve", counter)
    bodies = [{"queries": [QUERIES[i % len(QUERIES)]] * 2, "topk": 2} for i in range(12)]
    with ServerThread(create_app(bm25, max_batch_queries=5, max_wait_ms=200)) as url:
        responses = _send_concurrently(url, bodies)
    assert all(r.status_code == 200 and len(r.json()["result"]) == 2 for r in responses)
    assert max(len(c) for c in counter.calls) <= 5
    assert sum(len(c) for c in counter.calls) == 24


def test_batching_off_serves_one_request_per_index_call_one_at_a_time(bm25, monkeypatch):
    counter = CountingRetrieve(bm25)
    monkeypatch.setattr(bm25, "retrieve", counter)
    bodies = [_request(i) for i in range(16)]
    with ServerThread(create_app(bm25, batching=False)) as url:
        responses = _send_concurrently(url, bodies)
    assert all(r.status_code == 200 for r in responses)
    assert len(counter.calls) == len(bodies) and all(len(c) == 1 for c in counter.calls)
    assert counter.max_active == 1
    for body, response in zip(bodies, responses):
        assert result_ids(response.json()["result"]) == bm25.search(body["queries"], body["topk"]).ids


def test_by_default_a_lone_request_is_searched_at_once_and_later_ones_join_the_next_batch(bm25, monkeypatch):
    """No fixed window (max_wait_ms 0): the first request goes to the index alone, and the requests that arrive
    while the index is busy with it are searched together in the very next index call."""
    release = threading.Event()
    counter = CountingRetrieve(bm25, hold_first=release)
    monkeypatch.setattr(bm25, "retrieve", counter)
    bodies = [{"queries": [QUERIES[i % len(QUERIES)]], "topk": 2, "return_scores": True} for i in range(7)]
    app = create_app(bm25)
    responses, finished, threads = {}, [], []
    with ServerThread(app) as url:
        threads.append(post_in_thread(url, bodies[0], responses, 0, finished))
        wait_until(lambda: len(counter.calls) == 1, "the lone request to be searched")
        threads += [post_in_thread(url, body, responses, i, finished) for i, body in enumerate(bodies[1:], 1)]
        wait_until(lambda: app.state.batcher.stats.requests == len(bodies), "the later requests to be queued")
        release.set()
        for thread in threads:
            thread.join()
        assert httpx.get(f"{url}/health").json()["max_wait_ms"] == 0
    assert [len(call) for call in counter.calls] == [1, len(bodies) - 1]
    for i, body in enumerate(bodies):
        assert responses[i].status_code == 200
        assert result_ids(responses[i].json()["result"]) == bm25.search(body["queries"], 2).ids


def test_the_answer_is_byte_for_byte_the_json_response_fastapi_sent_before(dense):
    """`endpoint.RetrieveEndpoint` answers /retrieve without FastAPI's router: the body must stay the bytes of the
    ``JSONResponse`` the route returned (Search-R1's format, compact, non-ASCII kept), with the same headers."""
    from starlette.responses import JSONResponse

    from agentic_retriever.server.schema import _render

    queries = ["who won the chess final", "jazz in the café"]
    with TestClient(create_app(dense)) as client:
        response = client.post("/retrieve", json={"queries": queries, "topk": 2, "return_scores": True})
    expected = JSONResponse({"result": [_render(rows, True) for rows in dense.retrieve(queries, 2)]})
    assert response.status_code == 200 and response.content == expected.body
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-length"] == str(len(expected.body))
    assert response.headers["x-index-generation"] == "0"


def test_another_method_on_retrieve_is_a_405_and_other_paths_reach_fastapi(bm25):
    with TestClient(create_app(bm25)) as client:
        refused = client.get("/retrieve")
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"
        assert client.get("/health").json()["status"] == "ok"
        assert client.get("/nowhere").status_code == 404


def test_a_validation_error_keeps_fastapis_shape_with_the_body_location(bm25):
    with TestClient(create_app(bm25)) as client:
        response = client.post("/retrieve", json={"queries": ["a"], "topk": 0})
    assert response.status_code == 422
    body = response.json()
    assert body["errors"][0]["loc"] == ["body", "topk"] and body["errors"][0]["type"] == "greater_than_equal"
    assert body["detail"].startswith("body.topk: Input should be greater than or equal to 1")


def test_retrieve_is_found_under_a_root_path_as_fastapis_routes_are(bm25):
    with TestClient(create_app(bm25), root_path="/api") as client:
        response = client.post("/api/retrieve", json={"queries": ["chess"], "topk": 1})
        health = client.get("/api/health")
    assert response.status_code == 200 and response.json()["result"][0][0]["id"] == "15"
    assert health.status_code == 200


@pytest.mark.parametrize("flags, logged", [([], False), (["--access-log"], True)])
def test_index_serve_writes_an_access_line_per_request_only_when_asked(bm25, tmp_path, flags, logged):
    """``agentic-retriever index serve`` as users run it, in a process of its own: uvicorn's line per request is off
    by default (a rollout's hundreds of requests a second) and on with ``--access-log``."""
    port = free_port()
    output = tmp_path / "serve.log"
    with output.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "agentic_retriever.app.cli", "index", "serve", "--index",
                                    bm25.index_dir, "--port", str(port), *flags], stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "Uvicorn running" in output.read_text() or process.poll() is not None, "the server")
        answer = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": [QUERIES[0]], "topk": 2}, timeout=60)
        assert answer.status_code == 200
        if logged:
            wait_until(lambda: '"POST /retrieve HTTP/1.1" 200' in output.read_text(), "the access line")
    finally:
        process.terminate()
        process.wait(30)
    text = output.read_text()
    assert ("access log on" in text) == logged and ("access log off" in text) != logged
    assert ('"POST /retrieve HTTP/1.1" 200' in text) == logged
