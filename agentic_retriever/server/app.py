"""The FastAPI application of the retrieval service and the ways to run it: `create_app` (``POST /retrieve``
through the request batcher, with its limits: 413 for a body over ``max_request_bytes`` before it is parsed
(`body_limit`), or beyond ``max_queries_per_request`` queries or ``max_query_chars`` characters, 504 after
``request_timeout_s``, nothing more searched for a client that hung up, and the header ``X-Index-Generation``
naming the index generation that answered; ``GET /health``: the current index's folder, generation, backend,
index type, model, composition, encoder fingerprint and corpus hash, size, dimension, and uptime, batching, limits;
``POST /admin/swap-index``: serve another index folder without a restart, `slot`, behind the admin token, `auth`),
`serve` (uvicorn in the foreground), `ServerThread` and `running_server` (uvicorn in a background thread on a
loopback port).

    from agentic_retriever.index import open_index
    from agentic_retriever.server import serve
    serve(open_index("runs/quickstart/index"), port=8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from ..index.base import SearchIndex
from .auth import admin_refusal, resolve_admin_token
from .batcher import RequestTimeout, _Batcher
from .body_limit import BodySizeLimit
from .endpoint import Reply, RetrieveEndpoint
from .gate import Gate, check_exposure, is_loopback, resolve_api_key
from .schema import (
    DEFAULT_MAX_BATCH_MS, DEFAULT_MAX_PASSAGES_PER_REQUEST, DEFAULT_MAX_QUERIES_PER_REQUEST, DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_WAIT_MS, DEFAULT_REQUEST_TIMEOUT_S, RENDER_PIECE_ROWS, RetrieveRequest, SwapRequest,
    _readable_errors, _render, limit_violation, render_answer,
)
from .slot import IndexSlot, SwapRefused, query_dtype

#: The response header of ``POST /retrieve`` naming the index generation that answered (the body stays Search-R1's).
GENERATION_HEADER = "X-Index-Generation"
#: The status logged for a request whose client hung up before its answer (nginx's "client closed request").
CLIENT_CLOSED_REQUEST = 499

log = logging.getLogger(__name__)
T = TypeVar("T")


class ClientDisconnected(Exception):
    """The HTTP client of a request went away before its answer was ready."""


async def _until_disconnect(receive: Receive) -> None:
    """Return when the ASGI server reports that the client went away (after the body, ``receive`` gives nothing
    else)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(answer: asyncio.Future[T], receive: Receive) -> T:
    """`answer`'s result, or `ClientDisconnected` as soon as the client goes away first; `answer` is then cancelled
    (the batcher drops the rest of the request before this returns). One task watches for the hang-up while this
    awaits the future itself, where a task for each and ``asyncio.wait`` over both cost every request a task, a
    waiter future and four callbacks more (benchmarks/RESULTS.md, "the request path at its floor")."""
    hangup = asyncio.ensure_future(_until_disconnect(receive))
    hangup.add_done_callback(lambda _: answer.cancel())  # a no-op once `answer` is done
    try:
        return await answer
    except asyncio.CancelledError:
        if not hangup.done() or hangup.cancelled():
            raise  # this task itself was cancelled (the server is stopping), not by a hang-up
        hangup.result()  # a failure of the server's receive is raised, not taken for a hang-up
        raise ClientDisconnected from None
    finally:
        hangup.cancel()


class ServiceApp(FastAPI):
    """A FastAPI application with `front`, ASGI middleware wrapped around FastAPI's own handling, in front of
    everything FastAPI does. The service puts its body-size limit and ``POST /retrieve`` there (`body_limit`,
    `endpoint`), ahead of the layers FastAPI puts before an app's own middleware (Starlette's server-error page,
    FastAPI's OpenTelemetry and body-limit layers): /retrieve uses none of them, and they cost each of its requests
    CPU taken from the encoder (benchmarks/RESULTS.md, "the request path at its floor": 1.7x less). An exception
    escaping /retrieve still gets a 500 and a log line, from uvicorn; a FastAPI configured for OpenTelemetry traces
    the other paths only."""

    def __init__(self, front: Callable[[ASGIApp], ASGIApp], **fastapi_options):
        super().__init__(**fastapi_options)
        self._front = front(super().__call__)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._front(scope, receive, send)


def create_app(index: SearchIndex, max_batch_queries: int = 256, max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
               batching: bool = True,
               max_queries_per_request: int = DEFAULT_MAX_QUERIES_PER_REQUEST,
               max_query_chars: int = DEFAULT_MAX_QUERY_CHARS,
               request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
               admin_token: str | None = None,
               max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               max_batch_ms: float = DEFAULT_MAX_BATCH_MS, index_gpu: str | None = None,
               max_passages_per_request: int = DEFAULT_MAX_PASSAGES_PER_REQUEST, api_key: str | None = None,
               loopback_only_hosts: bool = False, index_roots: Sequence[str] | None = None,
               query_precision: str | None = None) -> ServiceApp:
    """The FastAPI application serving `index` (see the `agentic_retriever.server` docstring for the API).

    `max_batch_queries` bounds one batch, and so the chunks a big request is searched in; `max_batch_ms` > 0 bounds
    it by time too (no more queries than the recent index calls say fit in that long; 0: by count only). An answer
    of more than `RENDER_PIECE_ROWS` rows is streamed in pieces, the other requests served in between. A batch is
    searched as soon as the index is free and gathers the requests that arrived while it was busy; `max_wait_ms` > 0
    also holds a batch open that long after its first request arrived (bigger batches for a GPU encoder, at a cost in
    latency to a lone client). A request whose body is larger than `max_request_bytes` gets a 413 before it is
    parsed (a ``Content-Length`` over it at once, a chunked body as soon as it passes it); one with more
    than `max_queries_per_request` queries, or a query, question or history longer than `max_query_chars`
    characters, or asking for more than `max_passages_per_request` passages in all (queries x topk: what the
    batcher holds for it), gets a 413; one not answered within `request_timeout_s` seconds (None or 0: no limit) gets a 504
    and the rest of it is not searched, and so does one whose client hangs up before its answer.

    `admin_token` (None or empty: ``$AGENTIC_RETRIEVER_ADMIN_TOKEN``; that empty too: admin endpoints off, 403)
    guards ``POST /admin/swap-index`` (`auth`). A swap opens the new folder in a worker thread while `index`
    keeps serving, then serves it to the requests arriving from then on; a second swap while one is loading gets
    a 409 (`slot`); it places the new index as `index_gpu` says (auto, on, off; None: as the folder's build
    recorded), so give the placement `index` was opened with, and encodes its queries in `query_precision` (as
    `open_index` takes it: give the one `index` was opened with). A swap opens only folders below `index_roots`
    (None: the folder of `index`'s parent), and its refusals name no path outside them.

    In front of everything, `gate.Gate`: with `api_key` (None or empty: ``$AGENTIC_RETRIEVER_API_KEY``; that empty
    too: no key) every path but ``GET /livez`` needs the header ``X-API-Key``; with `loopback_only_hosts` (what
    `serve`, `running_server` and the loop's service set when they bind a loopback address) only requests
    addressed to localhost are answered; POST bodies must be JSON. ``/health`` names the index folder in full to admin callers only (others get its name).
    """
    for name, value in (("max_batch_queries", max_batch_queries), ("max_queries_per_request", max_queries_per_request),
                        ("max_query_chars", max_query_chars), ("max_request_bytes", max_request_bytes),
                        ("max_passages_per_request", max_passages_per_request)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    for name, value in (("max_wait_ms", max_wait_ms), ("max_batch_ms", max_batch_ms)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if request_timeout_s is not None and request_timeout_s < 0:
        raise ValueError(f"request_timeout_s must be >= 0 (0: no limit), got {request_timeout_s}")
    timeout_s = request_timeout_s or None
    slot = IndexSlot(index, index_gpu, index_roots, query_precision)
    batcher = _Batcher(slot, max_batch_queries, max_wait_ms / 1000.0, batching, timeout_s, max_batch_ms / 1000.0)
    token = resolve_admin_token(admin_token)
    started = time.time()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    def count_refusal() -> None:
        batcher.stats.rejected_requests += 1

    async def answer_retrieve(body: bytes, receive: Receive) -> Reply:
        """The reply to a ``POST /retrieve`` body (`endpoint.RetrieveEndpoint` sends it)."""
        try:
            request = RetrieveRequest.model_validate_json(body)
        except ValidationError as error:
            errors = [{"loc": ["body", *e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                      for e in error.errors()]
            return Reply(422, {"detail": _readable_errors(errors), "errors": errors})
        if not request.queries:
            return Reply(200, {"result": []}, {GENERATION_HEADER: str(slot.current.generation)})
        if (problem := limit_violation(request, max_queries_per_request, max_query_chars,
                                       max_passages_per_request)) is not None:
            batcher.stats.rejected_requests += 1
            return Reply(413, {"detail": problem})
        batcher.stats.requests += 1
        batcher.stats.queries += len(request.queries)
        try:
            results, generation = await unless_disconnected(batcher.submit(request), receive)
        except ClientDisconnected:
            log.info("the client of a request of %d queries hung up before its answer", len(request.queries))
            return Reply(CLIENT_CLOSED_REQUEST, {"detail": "the client hung up"})
        except RequestTimeout as timeout:
            log.warning("a request of %d queries timed out after %s s (%s)", len(request.queries), timeout_s, timeout)
            return Reply(504, {
                "detail": f"the request was not answered within {timeout_s:g} s ({timeout}; server setting "
                          f"request_timeout_s, --request-timeout-s): the server is busy or the request is too "
                          f"large; retry later or send fewer queries per request"})
        except Exception as error:
            batcher.stats.failed_requests += 1
            log.warning("retrieval failed for a request of %d queries: %s", len(request.queries), error)
            return Reply(500, {"detail": f"retrieval failed: {type(error).__name__}: {error}"})
        headers = {GENERATION_HEADER: str(generation)}
        if len(results) > RENDER_PIECE_ROWS:  # rendered piece by piece, other requests served in between
            return Reply(200, render_answer(results, request.return_scores), headers)
        return Reply(200, {"result": [_render(rows, request.return_scores) for rows in results]}, headers)

    # who may call is decided on the headers (gate), the body's size before anything reads it, /retrieve's too;
    # then /retrieve, then FastAPI
    app = ServiceApp(lambda fastapi: Gate(BodySizeLimit(RetrieveEndpoint(fastapi, answer=answer_retrieve),
                                                        max_bytes=max_request_bytes, on_refused=count_refusal),
                                          resolve_api_key(api_key), loopback_only_hosts, on_refused=count_refusal),
                     title="agentic-retriever retrieval service", version="1",
                     description="Search-R1 compatible POST /retrieve, plus GET /health and POST /admin/swap-index",
                     lifespan=lifespan)
    app.state.batcher = batcher
    app.state.slot = slot

    @app.post("/admin/swap-index")
    async def swap_index(request: Request) -> JSONResponse:
        if (refusal := admin_refusal(request.headers.get("authorization"), token)) is not None:
            status, message = refusal
            log.warning("refused %s /admin/swap-index from %s (%d): %s", request.method,
                        request.client.host if request.client else "?", status, message)
            return JSONResponse(status_code=status, content={"detail": message},
                                headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)
        try:
            body = SwapRequest.model_validate_json(await request.body())
        except ValidationError as error:
            return JSONResponse(status_code=422, content={"detail": _readable_errors(error.errors())})
        try:
            return JSONResponse(await slot.swap(body.index))
        except SwapRefused as refused:
            log.warning("swap to %s refused (%d): %s", body.index, refused.status_code, refused)
            return JSONResponse(status_code=refused.status_code, content={"detail": str(refused)})

    @app.get("/health")
    async def health(request: Request) -> dict:
        described = slot.current.describe()
        if admin_refusal(request.headers.get("authorization"), token) is not None:  # the folder's name only
            described["index_dir"] = os.path.basename(described["index_dir"] or "") or None
        return {
            "status": "ok",
            **described,
            "swap_loading": slot.loading,
            "admin": token is not None,
            "uptime_s": round(time.time() - started, 3),
            "batching": batching,
            "max_batch_queries": max_batch_queries,
            "max_batch_ms": max_batch_ms,
            "batch_capacity": batcher.batch_capacity,
            "max_wait_ms": max_wait_ms,
            "max_queries_per_request": max_queries_per_request,
            "max_query_chars": max_query_chars,
            "max_request_bytes": max_request_bytes,
            "max_passages_per_request": max_passages_per_request,
            "api_key": resolve_api_key(api_key) is not None,
            "request_timeout_s": timeout_s,
            "stats": batcher.stats.as_dict(),
        }

    return app


def _describe(index: SearchIndex) -> str:
    m = index.manifest
    model = (m.encoder or {}).get("model")
    where = getattr(index, "index_dir", None)
    return (f"{m.backend}/{m.index_type} index{f' at {where}' if where else ''}: {len(index)} passages from "
            f"{m.corpus_path}, searched on {index.device}"
            + (f", encoder {model!r} on {index.query_device} in {query_dtype(index)} (dim {m.dim}, "
               f"composition {index.composition})"
               if model else ""))


def serve(index: SearchIndex, host: str = "127.0.0.1", port: int = 8000, max_batch_queries: int = 256,
          max_wait_ms: float = DEFAULT_MAX_WAIT_MS, batching: bool = True, log_level: str = "info",
          max_queries_per_request: int = DEFAULT_MAX_QUERIES_PER_REQUEST,
          max_query_chars: int = DEFAULT_MAX_QUERY_CHARS,
          request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S, admin_token: str | None = None,
          max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, max_batch_ms: float = DEFAULT_MAX_BATCH_MS,
          access_log: bool = False, index_gpu: str | None = None,
          max_passages_per_request: int = DEFAULT_MAX_PASSAGES_PER_REQUEST, api_key: str | None = None,
          unauthenticated_network: bool = False, index_roots: Sequence[str] | None = None,
          query_precision: str | None = None) -> None:
    """Serve `index` with uvicorn until interrupted (one process: the index lives in its memory; an admin
    token, given or from ``$AGENTIC_RETRIEVER_ADMIN_TOKEN``, turns on ``POST /admin/swap-index``). `access_log`:
    uvicorn's line per request (its formatting and write were 2.8% of the server's samples under 64 one-query
    clients, taken from the encoder on the same cores; benchmarks/RESULTS.md). A non-loopback `host` needs an API
    key (given or ``$AGENTIC_RETRIEVER_API_KEY``) unless `unauthenticated_network` (`gate.check_exposure`); a
    loopback one answers requests addressed to localhost only."""
    import uvicorn

    api_key = resolve_api_key(api_key)
    check_exposure(host, api_key, unauthenticated_network)
    app = create_app(index, max_batch_queries=max_batch_queries, max_wait_ms=max_wait_ms, batching=batching,
                     max_queries_per_request=max_queries_per_request, max_query_chars=max_query_chars,
                     request_timeout_s=request_timeout_s, admin_token=admin_token,
                     max_request_bytes=max_request_bytes, max_batch_ms=max_batch_ms, index_gpu=index_gpu,
                     max_passages_per_request=max_passages_per_request, api_key=api_key,
                     loopback_only_hosts=is_loopback(host), index_roots=index_roots, query_precision=query_precision)
    log.info("serving %s", _describe(index))
    log.info("callers: %s; %s", "an API key on every path but /livez (header X-API-Key)" if api_key else
             "no API key (anyone who reaches the port)",
             "requests addressed to localhost only" if is_loopback(host) else f"any Host header on {host}")
    log.info("retrieval service on http://%s:%d/retrieve (health: /health); micro-batching %s; limits: %d bytes "
             "per request body, %d queries per request, %d characters per query, %s per request", host, port,
             f"on (up to {max_batch_queries} queries" + (f" and {max_batch_ms:g} ms" if max_batch_ms else "")
             + (f", {max_wait_ms:g} ms window)" if max_wait_ms else ")")
             if batching else "off",
             max_request_bytes, max_queries_per_request, max_query_chars,
             f"{request_timeout_s:g} s" if request_timeout_s else "no time limit")
    log.info("admin endpoints (POST /admin/swap-index) %s", "on" if resolve_admin_token(admin_token) else
             "off (set AGENTIC_RETRIEVER_ADMIN_TOKEN to turn them on)")
    log.info("access log %s", "on: a line per request" if access_log else
             "off (--access-log turns it on; GET /health counts the requests)")
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1, access_log=access_log)


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
    """`create_app(index, **options)` served on a free loopback port for the duration of the block (`options`
    include ``admin_token``)."""
    with ServerThread(create_app(index, **{"loopback_only_hosts": True, **options})) as url:
        yield url
