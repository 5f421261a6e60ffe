"""HTTP retrieval service, compatible with Search-R1's retrieval server API.

Search-R1 (Jin et al., 2025, https://github.com/PeterGriffinJin/Search-R1, ``search_r1/search/retrieval_server.py``)
serves its retrievers behind ``POST /retrieve``; verl's search tool and Search-R1's rollout code speak it:

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
      -> {"result": [[{"document": {"id": "..", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ..], ..]}
    with "return_scores": false
      -> {"result": [[{"id": "..", "contents": ".."}, ..], ..]}

This module implements that API over any `SearchIndex` (dense FAISS or BM25), with:

* a backward-compatible extension: optional ``"questions"`` (and ``"histories"``) parallel to ``queries``.
  When the served encoder was trained on ``Q [SEP] q`` input (its composition mode says so), the index
  composes it, so unmodified agents still work and patched agents get the context-aware query. BM25
  accepts and ignores them;
* validation of every request (pydantic): a bad request gets a 4xx naming the field, never a 500 or a
  dead server;
* dynamic micro-batching: concurrent requests are gathered (up to ``max_batch_queries`` queries, or
  ``max_wait_ms`` after the first one arrived) into ONE ``index.retrieve`` call run in a worker thread,
  with the largest ``topk`` of the batch, then each request gets its own slice back. ``batching=False``
  serves requests strictly one at a time, one index call each (the baseline of
  ``benchmarks/bench_service.py``), through the same code path;
* ``GET /health``: backend, index type, model, composition, index size, dimension, uptime, batching.

    from agentic_retriever.index import open_index
    from agentic_retriever.server import serve
    serve(open_index("runs/quickstart/index"), port=8000)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .index.base import ScoredPassage, SearchIndex

__all__ = ["RetrieveRequest", "ServerThread", "create_app", "running_server", "serve"]

log = logging.getLogger(__name__)

MAX_TOPK = 1000
DEFAULT_TOPK = 3


class RetrieveRequest(BaseModel):
    """Body of ``POST /retrieve`` (unknown fields are ignored, as Search-R1's server does)."""

    model_config = ConfigDict(extra="ignore")

    queries: list[str]
    topk: int | None = Field(DEFAULT_TOPK, ge=1, le=MAX_TOPK)
    return_scores: bool = False
    questions: list[str | None] | None = None
    histories: list[list[str] | None] | None = None

    @model_validator(mode="after")
    def _parallel_lists(self) -> RetrieveRequest:
        for name in ("questions", "histories"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.queries):
                raise ValueError(f"'{name}' must be parallel to 'queries': got {len(values)} {name} "
                                 f"for {len(self.queries)} queries")
        if self.topk is None:  # Search-R1's server accepts a null topk and uses its default
            self.topk = DEFAULT_TOPK
        return self


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


def _readable_errors(errors: Sequence[dict]) -> str:
    """Pydantic errors as one line: ``body.topk: Input should be greater than or equal to 1; ...``."""
    parts = []
    for error in errors:
        loc = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{loc}: {error.get('msg', 'invalid')}" if loc else str(error.get("msg", "invalid")))
    return "; ".join(parts) or "invalid request"


def _render(passages: list[ScoredPassage], with_scores: bool) -> list[dict]:
    if with_scores:
        return [{"document": {"id": p.id, "contents": p.contents}, "score": float(p.score)} for p in passages]
    return [{"id": p.id, "contents": p.contents} for p in passages]


def create_app(index: SearchIndex, max_batch_queries: int = 256, max_wait_ms: float = 5.0,
               batching: bool = True) -> FastAPI:
    """The FastAPI application serving `index` (see the module docstring for the API)."""
    if max_batch_queries < 1:
        raise ValueError(f"max_batch_queries must be at least 1, got {max_batch_queries}")
    if max_wait_ms < 0:
        raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
    batcher = _Batcher(index, max_batch_queries, max_wait_ms / 1000.0, batching)
    started = time.time()
    manifest = index.manifest

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="agentic-retriever retrieval service", version="1",
                  description="Search-R1 compatible POST /retrieve, plus GET /health", lifespan=lifespan)
    app.state.batcher = batcher
    app.state.index = index

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in error.errors()]
        return JSONResponse(status_code=422, content={"detail": _readable_errors(errors), "errors": errors})

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> JSONResponse:
        if not request.queries:
            return JSONResponse({"result": []})
        batcher.stats.requests += 1
        batcher.stats.queries += len(request.queries)
        try:
            results = await batcher.submit(request)
        except Exception as error:
            batcher.stats.failed_requests += 1
            log.warning("retrieval failed for a request of %d queries: %s", len(request.queries), error)
            return JSONResponse(status_code=500,
                                content={"detail": f"retrieval failed: {type(error).__name__}: {error}"})
        return JSONResponse({"result": [_render(rows, request.return_scores) for rows in results]})

    @app.get("/health")
    async def health() -> dict:
        return {
            "status": "ok",
            "backend": manifest.backend,
            "index_type": manifest.index_type,
            "model": (manifest.encoder or {}).get("model"),
            "composition": index.composition,
            "index_size": len(index),
            "dim": manifest.dim,
            "uptime_s": round(time.time() - started, 3),
            "batching": batching,
            "max_batch_queries": max_batch_queries,
            "max_wait_ms": max_wait_ms,
            "stats": batcher.stats.as_dict(),
        }

    return app


def _describe(index: SearchIndex) -> str:
    m = index.manifest
    model = (m.encoder or {}).get("model")
    where = getattr(index, "index_dir", None)
    return (f"{m.backend}/{m.index_type} index{f' at {where}' if where else ''}: {len(index)} passages from "
            f"{m.corpus_path}" + (f", encoder {model!r} (dim {m.dim}, composition {index.composition})" if model else ""))


def serve(index: SearchIndex, host: str = "127.0.0.1", port: int = 8000, max_batch_queries: int = 256,
          max_wait_ms: float = 5.0, batching: bool = True, log_level: str = "info") -> None:
    """Serve `index` with uvicorn until interrupted (one process: the index lives in its memory)."""
    import uvicorn

    app = create_app(index, max_batch_queries=max_batch_queries, max_wait_ms=max_wait_ms, batching=batching)
    log.info("serving %s", _describe(index))
    log.info("retrieval service on http://%s:%d/retrieve (health: /health); micro-batching %s", host, port,
             f"on (up to {max_batch_queries} queries, {max_wait_ms} ms)" if batching else "off")
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)


class ServerThread:
    """Run an app with uvicorn in a background thread on a loopback port (tests, benchmarks, notebooks).

        with ServerThread(create_app(index)) as url:
            httpx.post(f"{url}/retrieve", json={"queries": ["q"]})
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on", access_log=False))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]},
                                        name=f"uvicorn-{self.port}", daemon=True)

    def start(self, timeout: float = 30.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._socket.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def running_server(index: SearchIndex, **options) -> Iterator[str]:
    """`create_app(index, **options)` served on a free loopback port for the duration of the block."""
    with ServerThread(create_app(index, **options)) as url:
        yield url
