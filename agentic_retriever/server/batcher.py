"""Dynamic micro-batching of concurrent retrieval requests, fair to small requests.

Every request is a queue entry whose queries are searched in chunks. A *batch* holds at most
``max_batch_queries`` queries and at most ONE chunk of each waiting request (`fair_shares`): the small
requests (each no larger than an equal split of the batch among the waiting requests) are taken whole, and
what is left of the batch goes to the others oldest first, a big request taking a chunk of what is free. A
request whose chunk was searched goes back to the END of the queue until its last query is done, so the
requests that arrived meanwhile are ahead of it (round-robin): a small request waits about one batch behind
any number of big ones, and the big ones take turns. With ``batching`` off a batch is one chunk of one
request (the queue's head), taken round-robin the same way.

Chunks are also bounded by time: with ``max_batch_s`` > 0 a big request's chunk, with the small requests taken
whole beside it, is no more than the index searches in that long (`CallTimes`: a line fitted to the recent index
calls' seconds against their queries), so a small request waits for at most about ``max_batch_s`` of a big
request's work before its own batch, on any hardware (a count alone meant a second of encoder time per chunk on 2
CPU cores, and a few milliseconds on a GPU). Small requests are never cut by it: many clients' one-query requests
still share one encoder batch.

When a batch is taken: as soon as the index thread is free (``max_wait_s`` 0, the default), so a lone
request is searched at once and the requests that arrive while a batch is searched form the next one: the
batching window is the index's own busy time, which grows with the load (continuous batching). A
``max_wait_s`` > 0 also keeps a batch open that long after its oldest request arrived, or until it is full.

Each request pins the index generation current when it arrives (`IndexSlot.current`), and every chunk of it is
searched on that index, so a swap (`IndexSlot.swap`) never mixes two indexes in one answer: requests that arrived
before it finish on the old index, which is freed once no waiting request pins it. A batch is searched as one
``index.retrieve`` call per distinct (pinned index, ``topk``) in it, each with that exact topk on that index, so
one index call never mixes indexes and a request's results never depend on its batch-mates (HNSW's beam and
top-k tie-breaking can depend on k).
The calls run one at a time in a single worker thread; a failed call is retried chunk by chunk, so one bad
request fails only itself. A request whose caller gave up is dropped from the queue: one past its time limit
(`RequestTimeout`), or one whose answer the caller cancelled (its client hung up, `app`); the chunk being searched
finishes, the rest of the request is never searched.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from agentic_retriever.base.corpus import ScoredPassage
from .schema import RetrieveRequest
from .slot import IndexSlot, ServedIndex

log = logging.getLogger(__name__)


class RequestTimeout(Exception):
    """A request was not answered within the server's ``request_timeout_s``."""


@dataclass(eq=False)
class _Pending:
    """One request: its queries, the index it pinned on arrival, how many are searched already, and the rows
    found so far."""

    queries: list[str]
    topk: int
    questions: list[str | None] | None
    histories: list[list[str] | None] | None
    future: asyncio.Future
    arrived: float
    served: ServedIndex
    searched: int = 0
    rows: list[list[ScoredPassage]] = field(default_factory=list)
    expiry: asyncio.TimerHandle | None = None

    @property
    def remaining(self) -> int:
        return len(self.queries) - self.searched


@dataclass(eq=False)
class _Chunk:
    """Queries ``start:stop`` of one request, searched in one batch."""

    pending: _Pending
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class _Stats:
    requests: int = 0
    queries: int = 0
    index_calls: int = 0
    index_seconds: float = 0.0
    batches: int = 0
    failed_requests: int = 0
    rejected_requests: int = 0
    timed_out_requests: int = 0
    abandoned_requests: int = 0
    split_requests: int = 0
    largest_batch_queries: int = 0
    largest_batch_requests: int = 0

    def as_dict(self) -> dict:
        return {
            "requests": self.requests, "queries": self.queries, "index_calls": self.index_calls,
            "index_seconds": round(self.index_seconds, 6),
            "batches": self.batches, "failed_requests": self.failed_requests,
            "rejected_requests": self.rejected_requests, "timed_out_requests": self.timed_out_requests,
            "abandoned_requests": self.abandoned_requests,
            "split_requests": self.split_requests, "largest_batch_queries": self.largest_batch_queries,
            "largest_batch_requests": self.largest_batch_requests,
            "mean_batch_requests": round(self.requests / self.index_calls, 3) if self.index_calls else 0.0,
        }


class CallTimes:
    """Seconds an index call takes for n queries, as ``intercept + slope * n`` fitted (least squares) to the last
    `window` calls: `queries_within` says how many queries fit in a time budget. Until it has seen two calls of
    different sizes it takes the calls' mean seconds per query, which overestimates the slope (each call's fixed
    cost counted per query) and so keeps chunks small rather than slow.

    The very first call is cold (the index's first search pays for lazy loading, kernel selection, a thread
    pool's start) and, searching the whole count before anything is timed, it is the largest: on a line it
    would hold the slope up for the whole window. It sizes the second call alone and leaves the fit once that
    one is timed. A short window lets any later slow call fall out after a few fast ones."""

    def __init__(self, window: int = 16):
        self.calls: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)
        self.first_call_dropped = False

    def add(self, queries: int, seconds: float) -> None:
        if len(self.calls) == 1 and not self.first_call_dropped:
            self.calls.clear()
            self.first_call_dropped = True
        self.calls.append((queries, seconds))

    def fit(self) -> tuple[float, float] | None:
        """(intercept, slope) in seconds; None before the first call."""
        if not self.calls:
            return None
        sizes, seconds = zip(*self.calls)
        if len(set(sizes)) > 1:
            slope, intercept = statistics.linear_regression(sizes, seconds)
            if slope > 0:
                return max(0.0, intercept), slope
        return 0.0, sum(seconds) / sum(sizes)

    def queries_within(self, budget_s: float, most: int) -> int:
        """How many queries one call searches in `budget_s` seconds, between 1 and `most` (`most` before the
        first call)."""
        fitted = self.fit()
        if fitted is None:
            return most
        intercept, slope = fitted
        return max(1, min(most, int((budget_s - intercept) / slope)))


def fair_shares(remaining: list[int], capacity: int) -> list[int]:
    """How many queries of each waiting request (their counts left, in queue order) the next batch takes.

    Small requests first, whole: visiting them from the smallest, a request is taken whole while it is no
    larger than an equal split of the capacity still free among the requests not yet visited. The capacity
    left then goes to the other requests in queue order (oldest first), each taking as much of it as it can,
    so a big request is cut to what is free and the requests behind it wait for a later batch. The total is
    min(capacity, sum(remaining)); no request gets more than it has left.
    """
    shares = [0] * len(remaining)
    left = capacity
    for visited, i in enumerate(sorted(range(len(remaining)), key=lambda i: (remaining[i], i))):
        if remaining[i] > left // (len(remaining) - visited):
            break
        shares[i], left = remaining[i], left - remaining[i]
    for i, want in enumerate(remaining):
        if left <= 0:
            break
        if not shares[i]:
            shares[i] = min(want, left)
            left -= shares[i]
    return shares


def within_time(shares: list[int], remaining: list[int], capacity: int) -> list[int]:
    """`fair_shares`'s `shares` with each big request's chunk cut so the batch holds at most `capacity` queries
    (what the index searches in the time budget). Big: more left than `capacity`, or cut by the count already.
    The requests taken whole are kept whole; the chunks get what they leave, oldest first, and at least half of
    `capacity` (at least one query), so a big request keeps advancing under any load of small ones."""
    big = [share and (left > capacity or share < left) for share, left in zip(shares, remaining)]
    room = max(capacity - sum(share for share, is_big in zip(shares, big) if share and not is_big),
               (capacity + 1) // 2)
    cut = list(shares)
    for i, is_big in enumerate(big):
        if is_big:
            cut[i] = max(0, min(shares[i], room))
            room -= cut[i]
    return cut


@dataclass
class _Batcher:
    """Gathers waiting requests into batches; one worker task per event loop, one index thread.

    With ``batching`` off a batch is one chunk of one request and nothing waits, so index calls are
    strictly one after the other through the same queue, worker and thread.
    """

    slot: IndexSlot
    max_batch_queries: int
    max_wait_s: float
    batching: bool
    timeout_s: float | None = None
    max_batch_s: float = 0.0
    stats: _Stats = field(default_factory=_Stats)
    call_times: CallTimes = field(default_factory=CallTimes)

    @property
    def batch_capacity(self) -> int:
        """Most queries of a batch that holds a big request's chunk: ``max_batch_queries``, and with
        ``max_batch_s`` no more than the index searches in that long (`CallTimes`)."""
        if self.max_batch_s <= 0:
            return self.max_batch_queries
        return self.call_times.queries_within(self.max_batch_s, self.max_batch_queries)

    def __post_init__(self):
        self._waiting: collections.deque[_Pending] = collections.deque()
        self._waiting_queries = 0
        self._in_flight: list[_Chunk] = []
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker on the running loop (again, if an earlier loop has gone away)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and self._loop is loop and not self._task.done():
            return
        if self._loop is not loop:  # a new event loop: whatever waited on the old one is gone with it
            self._waiting.clear()
            self._waiting_queries = 0
        self._loop = loop
        self._wakeup = asyncio.Event()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval-index")
        self._task = loop.create_task(self._work(), name="retrieval-batcher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        stopped = RuntimeError("the retrieval server is shutting down")
        _fail([*self._waiting, *(chunk.pending for chunk in self._in_flight)], stopped)
        self._waiting.clear()
        self._in_flight = []
        self._waiting_queries = 0
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    # requests ----------------------------------------------------------------------------------

    def submit(self, request: RetrieveRequest) -> asyncio.Future[tuple[list[list[ScoredPassage]], int]]:
        """Queue the request now, with the current index pinned, and return the future of its answer: its result
        rows and the generation of the index that answered all of them (the one current when it arrived). The
        future fails with `RequestTimeout` after ``timeout_s`` (`_expire`, a timer of the event loop); cancelling it
        (its client hung up) drops the rest of the request from the queue (`_closed`, which runs before whoever
        awaits the future resumes). A future and a callback, not a coroutine: the caller awaits it without a task
        of its own."""
        self.start()
        loop = asyncio.get_running_loop()
        pending = _Pending(request.queries, request.topk, request.questions, request.histories,
                           loop.create_future(), loop.time(), self.slot.current)
        if self.timeout_s:
            pending.expiry = loop.call_later(self.timeout_s, self._expire, pending)
        pending.future.add_done_callback(functools.partial(self._closed, pending))
        self._enqueue(pending)
        return pending.future

    def _closed(self, pending: _Pending, future: asyncio.Future) -> None:
        """The request's answer is settled, whichever way: its timer goes; if its caller gave up (the future
        cancelled), what is left of it leaves the queue (the chunk being searched finishes)."""
        if pending.expiry is not None:
            pending.expiry.cancel()
        if future.cancelled():
            self._forget(pending)
            self.stats.abandoned_requests += 1
            log.info("a request was abandoned after %d of its %d queries were searched; the rest is not searched",
                     pending.searched, len(pending.queries))

    def _expire(self, pending: _Pending) -> None:
        """A request's time limit is up: unless answered, it fails with `RequestTimeout` and what is left of it
        leaves the queue (the chunk being searched finishes; the worker skips a request whose future is done)."""
        if pending.future.done():
            return
        self._forget(pending)
        self.stats.timed_out_requests += 1
        pending.future.set_exception(RequestTimeout(f"{pending.searched} of {len(pending.queries)} queries searched"))

    def _enqueue(self, pending: _Pending) -> None:
        self._waiting.append(pending)
        self._waiting_queries += pending.remaining
        self._wakeup.set()

    def _forget(self, pending: _Pending) -> None:
        with contextlib.suppress(ValueError):  # not waiting: in flight, or gone already
            self._waiting.remove(pending)
            self._waiting_queries -= pending.remaining

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            if self.batching and self.max_wait_s > 0:
                deadline = self._waiting[0].arrived + self.max_wait_s
                while self._waiting_queries < self.max_batch_queries and (left := deadline - loop.time()) > 0:
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), left)
            # no local holds the batch between batches: a finished request (and the index it pinned) is freed
            await self._serve(self._take_batch())

    async def _serve(self, batch: list[_Chunk]) -> None:
        """Search one batch, then answer its finished requests and queue the others again."""
        if not batch:
            return
        self._in_flight = batch
        try:
            await self._run_batch(batch)
        except Exception as error:  # the worker must survive anything a batch does
            log.exception("retrieval batch failed unexpectedly")
            _fail([chunk.pending for chunk in batch], error)
        self._in_flight = []
        self._settle(batch)

    def _take_batch(self) -> list[_Chunk]:
        """The next batch's chunks; the requests they belong to leave the queue until `_settle`."""
        for pending in [p for p in self._waiting if p.future.done()]:  # callers that gave up
            self._forget(pending)
        if not self._waiting:
            return []
        remaining = [p.remaining for p in self._waiting]
        if not self.batching:
            shares = [min(remaining[0], self.batch_capacity)] + [0] * (len(remaining) - 1)
        else:
            shares = within_time(fair_shares(remaining, self.max_batch_queries), remaining, self.batch_capacity)
        batch, kept = [], collections.deque()
        for pending, share in zip(self._waiting, shares):
            if share:
                batch.append(_Chunk(pending, pending.searched, pending.searched + share))
                self._waiting_queries -= pending.remaining
                if share < len(pending.queries) and pending.searched == 0:
                    self.stats.split_requests += 1
            else:
                kept.append(pending)
        self._waiting = kept
        return batch

    def _settle(self, batch: list[_Chunk]) -> None:
        """After a batch: finished requests get their rows, the others go to the back of the queue."""
        for chunk in batch:
            pending = chunk.pending
            if pending.future.done():
                continue
            if pending.remaining:
                self._enqueue(pending)
            else:
                pending.future.set_result((pending.rows, pending.served.generation))

    async def _run_batch(self, batch: list[_Chunk]) -> None:
        self.stats.batches += 1
        groups: dict[tuple[int, int], list[_Chunk]] = {}
        for chunk in batch:
            groups.setdefault((chunk.pending.served.generation, chunk.pending.topk), []).append(chunk)
        for (_, topk), chunks in groups.items():
            await self._search(topk, [c for c in chunks if not c.pending.future.done()])

    async def _search(self, topk: int, chunks: list[_Chunk]) -> None:
        if not chunks:
            return
        try:
            results = await self._call_index(topk, chunks)
        except Exception as error:
            if len(chunks) == 1:
                _fail([chunks[0].pending], error)
                return
            # One bad request must not fail the others gathered with it: retry each on its own.
            log.warning("an index call for %d requests failed (%s); retrying them one by one", len(chunks), error)
            for chunk in chunks:
                await self._search(topk, [chunk])
            return
        start = 0
        for chunk in chunks:
            rows = results[start:start + len(chunk)]
            start += len(chunk)
            chunk.pending.rows.extend(row[:topk] for row in rows)
            chunk.pending.searched = chunk.stop

    async def _call_index(self, topk: int, chunks: list[_Chunk]) -> list[list[ScoredPassage]]:
        """One ``retrieve`` call on the index the chunks pinned (one index: `_run_batch` groups by it)."""
        index = chunks[0].pending.served.index
        queries = [q for c in chunks for q in c.pending.queries[c.start:c.stop]]
        questions = histories = None
        if any(c.pending.questions is not None for c in chunks):
            questions = [q for c in chunks
                         for q in (c.pending.questions[c.start:c.stop] if c.pending.questions is not None
                                   else [None] * len(c))]
        if any(c.pending.histories is not None for c in chunks):
            histories = [h for c in chunks
                         for h in (c.pending.histories[c.start:c.stop] if c.pending.histories is not None
                                   else [None] * len(c))]
        self.stats.index_calls += 1
        self.stats.largest_batch_queries = max(self.stats.largest_batch_queries, len(queries))
        self.stats.largest_batch_requests = max(self.stats.largest_batch_requests, len(chunks))
        started = time.perf_counter()
        results = await asyncio.get_running_loop().run_in_executor(
            self._executor, index.retrieve, queries, topk, questions, histories)
        seconds = time.perf_counter() - started
        self.call_times.add(len(queries), seconds)
        self.stats.index_seconds += seconds
        if len(results) != len(queries):
            raise RuntimeError(f"the index returned {len(results)} result lists for {len(queries)} queries")
        return results


def _fail(requests: list[_Pending], error: BaseException) -> None:
    for pending in requests:
        if not pending.future.done():
            pending.future.set_exception(error)
