"""The retrieval service: Search-R1 API, questions, validation, health, micro-batching (its clients:
test_client.py; the shared indexes: conftest.py)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from agentic_retriever.encoder import SEPARATOR, EncoderConfig
from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index, open_index
from agentic_retriever.server import ServerThread, create_app
from agentic_retriever.server.batcher import fair_shares
from tests.fakes import WORDS, synthetic_rows, write_jsonl
from tests.retrieval.topics import CONTENTS, PASSAGES, QUERIES


def _ids(result_lists):
    return [[hit["document"]["id"] for hit in hits] for hits in result_lists]


def _scores(result_lists):
    return [[hit["score"] for hit in hits] for hits in result_lists]


class CountingRetrieve:
    """Wraps index.retrieve: counts calls (their queries and k) and the most calls ever running at once.

    With `hold_first`, the first call waits until that event is set: what arrives meanwhile is queued."""

    def __init__(self, index, fail_on: str | None = None, hold_first: threading.Event | None = None):
        self.original, self.fail_on, self.hold_first = index.retrieve, fail_on, hold_first
        self.calls, self.ks, self.active, self.max_active = [], [], 0, 0
        self._lock = threading.Lock()

    def __call__(self, queries, k, questions=None, histories=None):
        with self._lock:
            self.calls.append(list(queries))
            self.ks.append(k)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            first = len(self.calls) == 1
        try:
            if first and self.hold_first is not None:
                assert self.hold_first.wait(60), "the test never released the first index call"
            if self.fail_on is not None and self.fail_on in queries:
                raise RuntimeError(f"the index is on fire ({self.fail_on})")
            return self.original(queries, k, questions, histories)
        finally:
            with self._lock:
                self.active -= 1


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
    assert _ids(composed["result"]) == direct.ids
    assert _scores(composed["result"])[0] == pytest.approx(direct.scores[0], abs=1e-5)
    assert _ids(plain["result"]) == alone.ids
    assert _scores(composed["result"])[0] != pytest.approx(_scores(plain["result"])[0], abs=1e-4), \
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
    assert _ids(body["result"]) == expected.ids
    assert _ids(body["result"])[1] == dense_qsq.search(["mercury"], k=4).ids[0]


def test_plain_query_encoder_ignores_questions(dense):
    with TestClient(create_app(dense)) as client:
        plain = client.post("/retrieve", json={"queries": ["python"], "topk": 4, "return_scores": True}).json()
        asked = client.post("/retrieve", json={"queries": ["python"], "topk": 4, "return_scores": True,
                                               "questions": ["Which snakes live in Africa?"]}).json()
    assert _ids(asked["result"]) == _ids(plain["result"])
    assert _scores(asked["result"])[0] == pytest.approx(_scores(plain["result"])[0], abs=1e-5)


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
    from agentic_retriever.fingerprint import service_identity

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
        assert _ids(got) == _ids(single["result"])
        assert _scores(got)[0] == pytest.approx(_scores(single["result"])[0], abs=1e-4)
    assert len(counter.calls) < len(bodies) / 2, f"{len(bodies)} concurrent requests took {len(counter.calls)} index calls"
    assert max(len(c) for c in counter.calls) > 1
    assert counter.max_active == 1, "index calls never overlap"
    assert stats["requests"] == len(bodies) and stats["index_calls"] == len(counter.calls)


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
        assert _ids(response.json()["result"]) == bm25.search(body["queries"], body["topk"]).ids


# ---------------------------------------------------------------------------------------------- fairness


def _wait_until(condition, what: str, timeout: float = 60.0) -> None:
    """Poll `condition` (not a timing assertion: the bound only stops a broken test from hanging)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


def _post_in_thread(url: str, body: dict, responses: dict, key, finished: list) -> threading.Thread:
    def send():
        with httpx.Client(timeout=120) as http:
            responses[key] = http.post(f"{url}/retrieve", json=body)
        finished.append(key)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_fair_shares_take_small_requests_whole_and_the_rest_oldest_first():
    assert fair_shares([1, 10_000], 256) == [1, 255]
    assert fair_shares([10_000, 1, 10_000], 256) == [255, 1, 0], "the small one whole, then a chunk of the oldest"
    assert fair_shares([64, 10_000, 3], 256) == [64, 189, 3]
    assert fair_shares([100, 10_000, 10_000], 256) == [100, 156, 0]
    assert fair_shares([300, 100, 100, 100], 256) == [256, 0, 0, 0], "none is small: a quarter of 256 is 64"
    assert fair_shares([300, 60, 100, 100], 256) == [196, 60, 0, 0]
    assert fair_shares([2] * 12, 5) == [2, 2, 1] + [0] * 9, "overloaded: the oldest first, whole where they fit"
    assert fair_shares([3, 4], 256) == [3, 4]
    for remaining in ([5, 17, 300, 1, 1], [1000] * 7, [1] * 300):
        shares = fair_shares(remaining, 256)
        assert sum(shares) == min(256, sum(remaining))
        assert all(0 <= s <= r for s, r in zip(shares, remaining))


@pytest.mark.parametrize("batching, bigs, small_call", [(True, 1, 1), (True, 2, 1), (False, 1, 1), (False, 2, 2)])
def test_a_small_request_is_served_about_one_batch_behind_big_ones(bm25, monkeypatch, batching, bigs, small_call):
    """Big (cap-sized) requests are searched in chunks of max_batch_queries; a small request arriving while
    one is searched goes into the very next batch (batching off: after one chunk of each request ahead of it)
    and is answered long before the big ones."""
    cap, chunk = 1000, 50
    hold = threading.Event()
    counter = CountingRetrieve(bm25, hold_first=hold)
    monkeypatch.setattr(bm25, "retrieve", counter)
    big_queries = [QUERIES[i % len(QUERIES)] for i in range(cap)]
    app = create_app(bm25, max_batch_queries=chunk, max_queries_per_request=cap, batching=batching)
    responses, finished, threads = {}, [], []
    with ServerThread(app) as url:
        for b in range(bigs):
            threads.append(_post_in_thread(url, {"queries": big_queries, "topk": 3}, responses, f"big{b}", finished))
            _wait_until(lambda: app.state.batcher.stats.requests == b + 1, "the big request to be queued")
        _wait_until(lambda: len(counter.calls) == 1, "the first chunk to be searched")
        threads.append(_post_in_thread(url, {"queries": ["chess"], "topk": 3}, responses, "small", finished))
        _wait_until(lambda: app.state.batcher.stats.requests == bigs + 1, "the small request to be queued")
        hold.set()
        for thread in threads:
            thread.join()
        stats = httpx.get(f"{url}/health").json()["stats"]
    assert all(r.status_code == 200 for r in responses.values())
    assert counter.calls[0] == big_queries[:chunk], "the first call is one chunk of the first big request"
    assert all(len(call) <= chunk for call in counter.calls)
    with_small = [i for i, call in enumerate(counter.calls) if "chess" in call]
    assert with_small == [small_call], f"the small request went out in index call {with_small}, not {small_call}"
    assert len(counter.calls) >= bigs * cap // chunk
    assert finished.index("small") < min(finished.index(f"big{b}") for b in range(bigs))
    assert stats["split_requests"] == bigs and stats["batches"] == len(counter.calls)
    assert responses["small"].json()["result"][0][0]["id"] == "15"
    expected = bm25.search(big_queries, 3).ids
    for b in range(bigs):
        assert [[hit["id"] for hit in hits] for hits in responses[f"big{b}"].json()["result"]] == expected


def test_requests_over_the_limits_get_413_naming_the_limit_and_nothing_is_searched(bm25, monkeypatch):
    counter = CountingRetrieve(bm25)
    monkeypatch.setattr(bm25, "retrieve", counter)
    long = "x" * 101
    with TestClient(create_app(bm25, max_queries_per_request=5, max_query_chars=100)) as client:
        many = client.post("/retrieve", json={"queries": ["chess"] * 6})
        too_long = client.post("/retrieve", json={"queries": ["chess", long]})
        long_question = client.post("/retrieve", json={"queries": ["chess"], "questions": [long]})
        long_history = client.post("/retrieve", json={"queries": ["chess"], "histories": [["x" * 60, "y" * 41]]})
        assert counter.calls == []
        at_the_limits = client.post("/retrieve", json={"queries": ["chess"] * 4 + ["x" * 100], "topk": 1,
                                                       "questions": ["q" * 100] * 5, "histories": [["h" * 100]] * 5})
        stats = client.get("/health").json()["stats"]
    assert many.status_code == 413
    assert "6" in many.json()["detail"] and "limit is 5" in many.json()["detail"]
    assert "max_queries_per_request" in many.json()["detail"]
    for response, name in ((too_long, "queries[1]"), (long_question, "questions[0]"), (long_history, "histories[0]")):
        assert response.status_code == 413, response.text
        detail = response.json()["detail"]
        assert name in detail and "101 characters" in detail and "limit is 100" in detail
        assert "max_query_chars" in detail
    assert at_the_limits.status_code == 200 and at_the_limits.json()["result"][0][0]["id"] == "15"
    assert stats["rejected_requests"] == 4 and stats["requests"] == 1


def test_default_limits_are_10000_queries_and_4096_characters(bm25):
    with TestClient(create_app(bm25)) as client:
        health = client.get("/health").json()
        assert client.post("/retrieve", json={"queries": ["a"] * 10_001}).status_code == 413
        assert client.post("/retrieve", json={"queries": ["a" * 4097]}).status_code == 413
        assert client.post("/retrieve", json={"queries": ["a" * 4096], "topk": 1}).status_code == 200
    assert (health["max_queries_per_request"], health["max_query_chars"], health["request_timeout_s"]) == (10_000, 4096, 120)
    with TestClient(create_app(bm25, request_timeout_s=0)) as client:
        assert client.get("/health").json()["request_timeout_s"] is None, "0: no time limit"


def test_a_request_over_its_time_limit_gets_504_and_the_rest_of_it_is_never_searched(bm25, monkeypatch):
    hold = threading.Event()
    counter = CountingRetrieve(bm25, hold_first=hold)
    monkeypatch.setattr(bm25, "retrieve", counter)
    app = create_app(bm25, max_batch_queries=2, request_timeout_s=1.0)
    responses, finished = {}, []
    with ServerThread(app) as url:
        slow = _post_in_thread(url, {"queries": ["mercury", "python", "venus", "board game"]}, responses, "slow", finished)
        _wait_until(lambda: len(counter.calls) == 1, "the first chunk to be searched")
        queued = _post_in_thread(url, {"queries": ["largest river"]}, responses, "queued", finished)
        slow.join()
        queued.join()
        hold.set()  # the chunk in flight finishes; what is left of both requests is dropped
        after = httpx.post(f"{url}/retrieve", json={"queries": ["chess"], "topk": 1}, timeout=60)
        stats = httpx.get(f"{url}/health").json()["stats"]
    for key in ("slow", "queued"):
        assert responses[key].status_code == 504, responses[key].text
        detail = responses[key].json()["detail"]
        assert "within 1 s" in detail and "request_timeout_s" in detail
    assert "0 of 4 queries searched" in responses["slow"].json()["detail"]
    assert after.status_code == 200 and after.json()["result"][0][0]["id"] == "15"
    assert counter.calls == [["mercury", "python"], ["chess"]]
    assert stats["timed_out_requests"] == 2 and stats["failed_requests"] == 0


@pytest.mark.parametrize("bad", [{"max_queries_per_request": 0}, {"max_query_chars": 0}, {"request_timeout_s": -1}])
def test_create_app_refuses_nonsense_limits(bm25, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        create_app(bm25, **bad)


# ---------------------------------------------------------------------------------------------- batch-mates


@pytest.fixture(params=["hnsw", "bm25"])
def tie_prone_index(request, tmp_path, tiny_model_dir):
    """An HNSW index (tiny encoder, small efSearch) or a BM25 index over templated passages with many tied
    scores: both can answer differently for a larger k (HNSW's beam, top-k tie-breaking)."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(300))
    if request.param == "hnsw":
        config = IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "index"), corpus_cache=str(tmp_path / "cache"),
                                  encoder=EncoderConfig(model=tiny_model_dir),
                                  dense=DenseParams(chunk_size=64, type="hnsw", hnsw_m=8, ef_construction=16, ef_search=4))
    else:
        config = IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "index"), corpus_cache=str(tmp_path / "cache"),
                                  backend="bm25")
    build_index(config)
    return open_index(tmp_path / "index", corpus_cache=str(tmp_path / "cache"))


def test_results_do_not_depend_on_batch_mates_with_a_larger_topk(tie_prone_index, monkeypatch):
    index = tie_prone_index
    queries = list(WORDS) + [f"{a} {b}" for a in WORDS[:5] for b in WORDS[5:10]]
    mine = {"queries": queries, "topk": 3, "return_scores": True}
    with TestClient(create_app(index, batching=False)) as client:
        alone = client.post("/retrieve", json=mine).json()["result"]
    hold = threading.Event()
    counter = CountingRetrieve(index, hold_first=hold)
    monkeypatch.setattr(index, "retrieve", counter)
    app = create_app(index, max_wait_ms=0)
    bodies = {"plug": {"queries": ["plug"], "topk": 3}, "mine": mine,
              "mates50": {"queries": queries, "topk": 50}, "mates300": {"queries": queries[::-1], "topk": 300}}
    responses, finished, threads = {}, [], []
    with ServerThread(app) as url:
        for n, (name, body) in enumerate(bodies.items(), start=1):
            threads.append(_post_in_thread(url, body, responses, name, finished))
            _wait_until(lambda: app.state.batcher.stats.requests == n and len(counter.calls) == 1, f"{name} queued")
        hold.set()  # mine and both mates are waiting: they form one batch
        for thread in threads:
            thread.join()
        stats = httpx.get(f"{url}/health").json()["stats"]
    assert all(r.status_code == 200 for r in responses.values())
    assert stats["batches"] == 2, "the plug, then one batch of the other three"
    assert sorted(counter.ks[1:]) == [3, 50, 300], "one index call per distinct topk, each with its own k"
    assert counter.calls[1 + counter.ks[1:].index(3)] == queries
    batched = responses["mine"].json()["result"]
    assert _ids(batched) == _ids(alone)
    assert _scores(batched) == _scores(alone)
    assert all(len(hits) == 3 for hits in batched)
