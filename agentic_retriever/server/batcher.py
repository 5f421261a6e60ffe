"""Dynamic micro-batching of concurrent retrieval requests: pending requests are gathered (up to
``max_batch_queries`` queries, or ``max_wait_s`` after the first one arrived) into ONE ``index.retrieve``
call run in a worker thread, with the largest ``topk`` of the batch, and each request gets its own slice
back; a failed batch is retried request by request, so one bad request fails only itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..corpus import ScoredPassage
from ..index.base import SearchIndex
from .schema import RetrieveRequest

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """One request waiting for its share of a batch."""

    queries: list[str]
    topk: int
    questions: list[str | None] | None
    histories: list[list[str] | None] | None
    future: asyncio.Future
    arrived: float


@dataclass
class _Stats:
    requests: int = 0
    queries: int = 0
    index_calls: int = 0
    failed_requests: int = 0
    largest_batch_queries: int = 0
    largest_batch_requests: int = 0

    def as_dict(self) -> dict:
        return {
            "requests": self.requests, "queries": self.queries, "index_calls": self.index_calls,
            "failed_requests": self.failed_requests, "largest_batch_queries": self.largest_batch_queries,
            "largest_batch_requests": self.largest_batch_requests,
            "mean_batch_requests": round(self.requests / self.index_calls, 3) if self.index_calls else 0.0,
        }


@dataclass
class _Batcher:
    """Gathers pending requests into index calls; one worker task per event loop, one index thread.

    With ``batching`` off a batch is exactly one request and nothing waits, so requests are served
    strictly one after the other through the same queue, worker and thread.
    """

    index: SearchIndex
    max_batch_queries: int
    max_wait_s: float
    batching: bool
    stats: _Stats = field(default_factory=_Stats)

    def __post_init__(self):
        self._pending: collections.deque[_Pending] = collections.deque()
        self._pending_queries = 0
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
            self._pending.clear()
            self._pending_queries = 0
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
        while self._pending:
            pending = self._pending.popleft()
            if not pending.future.done():
                pending.future.set_exception(RuntimeError("the retrieval server is shutting down"))
        self._pending_queries = 0
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    # requests ----------------------------------------------------------------------------------

    async def submit(self, request: RetrieveRequest) -> list[list[ScoredPassage]]:
        self.start()
        loop = asyncio.get_running_loop()
        pending = _Pending(request.queries, request.topk, request.questions, request.histories,
                           loop.create_future(), loop.time())
        self._pending.append(pending)
        self._pending_queries += len(pending.queries)
        self._wakeup.set()
        return await pending.future

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            if self.batching and self.max_wait_s > 0:
                deadline = self._pending[0].arrived + self.max_wait_s
                while self._pending_queries < self.max_batch_queries and (left := deadline - loop.time()) > 0:
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), left)
            batch = self._take_batch()
            if batch:
                try:
                    await self._run_batch(batch)
                except Exception as error:  # the worker must survive anything a batch does
                    log.exception("retrieval batch failed unexpectedly")
                    _fail(batch, error)

    def _take_batch(self) -> list[_Pending]:
        batch, size = [], 0
        while self._pending:
            head = self._pending[0]
            if batch and (not self.batching or size + len(head.queries) > self.max_batch_queries):
                break
            self._pending.popleft()
            self._pending_queries -= len(head.queries)
            if head.future.done():  # the client went away while it waited
                continue
            batch.append(head)
            size += len(head.queries)
        return batch

    async def _run_batch(self, batch: list[_Pending]) -> None:
        try:
            results = await self._call_index(batch)
        except Exception as error:
            if len(batch) == 1:
                _fail(batch, error)
                return
            # One bad request must not fail the others gathered with it: retry each on its own.
            log.warning("a batch of %d requests failed (%s); retrying them one by one", len(batch), error)
            for pending in batch:
                await self._run_batch([pending])
            return
        start = 0
        for pending in batch:
            rows = results[start:start + len(pending.queries)]
            start += len(pending.queries)
            if not pending.future.done():
                pending.future.set_result([row[:pending.topk] for row in rows])

    async def _call_index(self, batch: list[_Pending]) -> list[list[ScoredPassage]]:
        queries = [q for p in batch for q in p.queries]
        questions = histories = None
        if any(p.questions is not None for p in batch):
            questions = [q for p in batch for q in (p.questions or [None] * len(p.queries))]
        if any(p.histories is not None for p in batch):
            histories = [h for p in batch for h in (p.histories or [None] * len(p.queries))]
        topk = max(p.topk for p in batch)
        self.stats.index_calls += 1
        self.stats.largest_batch_queries = max(self.stats.largest_batch_queries, len(queries))
        self.stats.largest_batch_requests = max(self.stats.largest_batch_requests, len(batch))
        results = await asyncio.get_running_loop().run_in_executor(
            self._executor, self.index.retrieve, queries, topk, questions, histories)
        if len(results) != len(queries):
            raise RuntimeError(f"the index returned {len(results)} result lists for {len(queries)} queries")
        return results


def _fail(batch: list[_Pending], error: BaseException) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)
