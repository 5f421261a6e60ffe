"""The retrieval service under load: big requests split into chunks served fairly beside small ones, the
limits (413) and the time bound (504), and results that do not depend on batch-mates."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from fastapi.testclient import TestClient

from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index, open_index
from agentic_retriever.server import ServerThread, create_app
from agentic_retriever.server import batcher
from agentic_retriever.server.batcher import CallTimes, fair_shares, within_time
from tests.fakes import (
    WORDS, CountingRetrieve, post_in_thread, result_ids, result_scores, synthetic_rows, wait_until, write_jsonl,
)
from tests.retrieval.topics import QUERIES


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


def test_call_times_fit_the_index_cost_and_size_a_batch_to_a_time_budget():
    times = CallTimes()
    assert times.fit() is None and times.queries_within(0.1, 256) == 256, "nothing timed yet: the count alone"
    times.add(256, 2.56)
    assert times.queries_within(0.1, 256) == 10, "the first call alone: its seconds per query"
    times.add(10, 0.025)
    assert times.queries_within(0.1, 256) == 40, "the cold first call has left: one size, its fixed cost included"
    intercept, slope = 2 / 1024, 1 / 1024
    for n in (1, 50, 200, 10):
        times.add(n, intercept + slope * n)
    times.calls.popleft()  # the 10-query call, off the line
    assert times.fit() == pytest.approx((intercept, slope))
    assert times.queries_within(0.1, 256) == 100  # (0.1 - 2/1024) * 1024 = 100.4
    assert times.queries_within(0.001, 256) == 1 and times.queries_within(10.0, 256) == 256


def test_the_time_budget_cuts_big_chunks_and_never_a_small_request():
    remaining = [1, 10_000, 3]
    assert within_time(fair_shares(remaining, 256), remaining, 20) == [1, 16, 3], "the chunk gets what is left"
    assert within_time([1] * 64, [1] * 64, 20) == [1] * 64, "64 one-query requests still share one batch"
    assert within_time([5, 5], [5, 5], 4) == [4, 0], "two big ones: the oldest first"
    assert within_time([3, 5], [3, 100], 3) == [3, 2], "small ones fill the budget: the big one still gets half"
    assert within_time([1] * 30 + [200], [1] * 30 + [10_000], 21) == [1] * 30 + [11]
    assert within_time([30, 2], [30, 2], 20) == [18, 2]
    assert within_time([255, 1], [10_000, 1], 256) == [255, 1], "within the budget: fair_shares unchanged"


class IndexClock:
    """The batcher's clock (`batcher.time`, which it reads only around index calls) made virtual: it moves only by
    what the index says its calls cost, so the chunk sizes the call-time fit gives are the same on any machine
    under any load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class SlowRetrieve(CountingRetrieve):
    """An index call that costs 2 ms plus `per_query` seconds a query on `clock`, as an encoder does, plus `cold`
    seconds for the first call (lazy loading, a cold thread pool)."""

    def __init__(self, index, per_query: float, clock: IndexClock, cold: float = 0.0):
        super().__init__(index)
        self.per_query, self.clock, self.cold = per_query, clock, cold

    def __call__(self, queries, k, questions=None, histories=None):
        self.clock.now += 0.002 + self.per_query * len(queries) + (self.cold if not self.calls else 0.0)
        return super().__call__(queries, k, questions, histories)


def chunk_sizes(bm25, monkeypatch, max_batch_ms: float, cold: float = 0.0) -> tuple[list[int], dict]:
    """The index calls' sizes when one 600-query request meets `max_batch_ms` over an index that costs 1 ms a
    query (and 2 ms a call) on a virtual clock; and the service's /health."""
    clock = IndexClock()
    counter = SlowRetrieve(bm25, per_query=0.001, clock=clock, cold=cold)
    monkeypatch.setattr(bm25, "retrieve", counter)
    monkeypatch.setattr(batcher, "time", clock)
    queries = [QUERIES[i % len(QUERIES)] for i in range(600)]
    app = create_app(bm25, max_batch_queries=256, max_queries_per_request=1000, max_batch_ms=max_batch_ms)
    with TestClient(app) as client:
        answer = client.post("/retrieve", json={"queries": queries, "topk": 3})
        health = client.get("/health").json()
    sizes = [len(call) for call in counter.calls]
    assert answer.status_code == 200 and [[hit["id"] for hit in hits] for hits in answer.json()["result"]] == (
        bm25.search(queries, 3).ids), "chunking changes no answer"
    return sizes, health


@pytest.mark.parametrize("max_batch_ms", [30.0, 0.0])
def test_a_big_request_is_searched_in_chunks_of_the_time_budget(bm25, monkeypatch, max_batch_ms):
    """With max_batch_ms, once the service has timed its index the chunks hold what it searches in that long (1 ms a
    query and 2 ms a call: 28 in 30 ms), not max_batch_queries (256: a quarter of a second here, seconds on a slow
    CPU); with 0 the count alone."""
    sizes, health = chunk_sizes(bm25, monkeypatch, max_batch_ms)
    assert sizes[0] == 256, "the first call, before any timing, takes the count"
    if max_batch_ms:
        assert sizes[1] == 29, "sized on the first call's mean cost a query (its fixed 2 ms spread over 256)"
        assert set(sizes[2:-1]) <= {27, 28}, f"the fitted line: (30 - 2) / 1 queries a call, rounded down: {sizes}"
        assert sum(sizes) == 600 and health["max_batch_ms"] == max_batch_ms and health["batch_capacity"] in (27, 28)
    else:
        assert sizes == [256, 256, 88] and health["batch_capacity"] == 256


def test_a_cold_first_call_sizes_only_the_next_chunk(bm25, monkeypatch):
    """An index whose first search is slow shrinks the second chunk only: the first call leaves the fit once
    another is timed, so it cannot hold the chunks small for a whole window of calls."""
    sizes, _ = chunk_sizes(bm25, monkeypatch, 30.0, cold=1.0)
    assert sizes[0] == 256 and sizes[1] == 6, f"the second chunk sized on the cold call (4.9 ms a query): {sizes}"
    assert sizes[2] > 20 and set(sizes[3:-1]) <= {27, 28}, f"then on the warm calls alone: {sizes}"


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
            threads.append(post_in_thread(url, {"queries": big_queries, "topk": 3}, responses, f"big{b}", finished))
            wait_until(lambda: app.state.batcher.stats.requests == b + 1, "the big request to be queued")
        wait_until(lambda: len(counter.calls) == 1, "the first chunk to be searched")
        threads.append(post_in_thread(url, {"queries": ["chess"], "topk": 3}, responses, "small", finished))
        wait_until(lambda: app.state.batcher.stats.requests == bigs + 1, "the small request to be queued")
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
        slow = post_in_thread(url, {"queries": ["mercury", "python", "venus", "board game"]}, responses, "slow", finished)
        wait_until(lambda: len(counter.calls) == 1, "the first chunk to be searched")
        queued = post_in_thread(url, {"queries": ["largest river"]}, responses, "queued", finished)
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


@pytest.mark.parametrize("bad", [{"max_queries_per_request": 0}, {"max_query_chars": 0}, {"request_timeout_s": -1},
                                 {"max_request_bytes": 0}])
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
    app = create_app(index, max_wait_ms=0, max_batch_ms=0)  # the held plug would time the index as slow
    bodies = {"plug": {"queries": ["plug"], "topk": 3}, "mine": mine,
              "mates50": {"queries": queries, "topk": 50}, "mates300": {"queries": queries[::-1], "topk": 300}}
    responses, finished, threads = {}, [], []
    with ServerThread(app) as url:
        for n, (name, body) in enumerate(bodies.items(), start=1):
            threads.append(post_in_thread(url, body, responses, name, finished))
            wait_until(lambda: app.state.batcher.stats.requests == n and len(counter.calls) == 1, f"{name} queued")
        hold.set()  # mine and both mates are waiting: they form one batch
        for thread in threads:
            thread.join()
        stats = httpx.get(f"{url}/health").json()["stats"]
    assert all(r.status_code == 200 for r in responses.values())
    assert stats["batches"] == 2, "the plug, then one batch of the other three"
    assert sorted(counter.ks[1:]) == [3, 50, 300], "one index call per distinct topk, each with its own k"
    assert counter.calls[1 + counter.ks[1:].index(3)] == queries
    batched = responses["mine"].json()["result"]
    assert result_ids(batched) == result_ids(alone)
    assert result_scores(batched) == result_scores(alone)
    assert all(len(hits) == 3 for hits in batched)


def test_a_big_answer_is_streamed_in_pieces_with_the_bytes_of_one_json_response(bm25):
    """Over RENDER_PIECE_ROWS rows the answer is rendered piece by piece (the event loop serves others in between);
    the body parses to what rendering it whole gives, with scores and without."""
    from agentic_retriever.server.schema import RENDER_PIECE_ROWS

    queries = [QUERIES[i % len(QUERIES)] for i in range(RENDER_PIECE_ROWS * 2 + 7)]
    expected = bm25.search(queries, 3).ids
    with ServerThread(create_app(bm25, max_queries_per_request=len(queries))) as url:
        for scores in (True, False):
            with httpx.Client(timeout=60) as http, http.stream(
                    "POST", f"{url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": scores}) as big:
                pieces = list(big.iter_raw())
                headers = big.headers
            body = b"".join(pieces)
            assert big.status_code == 200 and "content-length" not in headers and headers["x-index-generation"] == "0"
            result = httpx.Response(200, content=body).json()["result"]
            assert [[(hit["document"] if scores else hit)["id"] for hit in hits] for hits in result] == expected
            small = httpx.post(f"{url}/retrieve", json={"queries": queries[:3], "topk": 3, "return_scores": scores})
            assert "content-length" in small.headers, "a small answer is one JSON response, as before"
            assert result[:3] == small.json()["result"]


def test_a_streamed_answer_lets_the_event_loop_serve_others_between_its_pieces():
    """`render_answer` as Starlette's StreamingResponse consumes it, inside the event loop: another task (a small
    request's handler) runs between the pieces of a big answer, not only after its last one."""
    from agentic_retriever.base.corpus import ScoredPassage
    from agentic_retriever.server.schema import RENDER_PIECE_ROWS, render_answer

    results = [[ScoredPassage(str(i), f"T{i}", "text", 1.0)] for i in range(RENDER_PIECE_ROWS * 3)]

    async def serve() -> list[str]:
        order: list[str] = []

        async def small_request() -> None:
            for _ in range(2):
                order.append("small")
                await asyncio.sleep(0)

        task = asyncio.create_task(small_request())
        async for _ in render_answer(results, with_scores=True):
            order.append("piece")
        await task
        return order

    order = asyncio.run(serve())
    pieces = [i for i, what in enumerate(order) if what == "piece"]
    assert len(pieces) == 5  # the opening, three pieces of rows, the closing
    assert any(pieces[0] < i < pieces[-1] for i, what in enumerate(order) if what == "small"), order
