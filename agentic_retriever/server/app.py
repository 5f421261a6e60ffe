"""The FastAPI application of the retrieval service and the ways to run it: `create_app` (``POST /retrieve``
through the request batcher, ``GET /health``: backend, index type, model, composition, index size,
dimension, uptime, batching), `serve` (uvicorn in the foreground), `ServerThread` and `running_server`
(uvicorn in a background thread on a loopback port).

    from agentic_retriever.index import open_index
    from agentic_retriever.server import serve
    serve(open_index("runs/quickstart/index"), port=8000)
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..index.base import SearchIndex
from .batcher import _Batcher
from .schema import RetrieveRequest, _readable_errors, _render

log = logging.getLogger(__name__)


def create_app(index: SearchIndex, max_batch_queries: int = 256, max_wait_ms: float = 5.0,
               batching: bool = True) -> FastAPI:
    """The FastAPI application serving `index` (see the `agentic_retriever.server` docstring for the API)."""
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
