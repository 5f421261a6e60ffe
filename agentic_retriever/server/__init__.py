"""HTTP retrieval service, compatible with Search-R1's retrieval server API.

Search-R1 (Jin et al., 2025, https://github.com/PeterGriffinJin/Search-R1, ``search_r1/search/retrieval_server.py``)
serves its retrievers behind ``POST /retrieve``; verl's search tool and Search-R1's rollout code speak it:

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
      -> {"result": [[{"document": {"id": "..", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ..], ..]}
    with "return_scores": false
      -> {"result": [[{"id": "..", "contents": ".."}, ..], ..]}

This package implements that API over any `SearchIndex` (dense FAISS or BM25), with:

* a backward-compatible extension: optional ``"questions"`` (and ``"histories"``) parallel to ``queries``.
  When the served encoder was trained on ``Q [SEP] q`` input (its composition mode says so), the index
  composes it, so unmodified agents still work and patched agents get the context-aware query. BM25
  accepts and ignores them;
* validation of every request (pydantic, `schema`): a bad request gets a 4xx naming the field, never a
  500 or a dead server;
* dynamic micro-batching (`batcher`): a batch is searched as soon as the index is free and gathers (up to
  ``max_batch_queries`` queries) the requests that arrived while it was busy, so a lone client waits for
  nothing and many clients share encoder batches; ``max_wait_ms`` > 0 adds a fixed window after a batch's
  first request (off by default). A batch is searched in a worker thread as
  one ``index.retrieve`` call per distinct ``topk`` (each request is searched with its own topk, so its
  results never depend on its batch-mates), then each request gets its own slice back.
  ``batching=False`` serves one chunk of one request per index call, one at a time (the baseline of
  ``benchmarks/bench_service.py``), through the same code path;
* fairness: a big request is searched in chunks (at most ``max_batch_queries`` queries and at most
  ``max_batch_ms`` (100) of index time, timed on the recent calls; one chunk of each waiting request per batch,
  shared max-min fairly, round-robin), so a small request waits about one batch behind it, not the whole big
  request;
* limits: a body larger than ``max_request_bytes`` (128 MiB) gets a 413 before it is parsed (`body_limit`: a
  ``Content-Length`` over it at once, a chunked body as soon as it passes it); more than
  ``max_queries_per_request`` queries (10,000), or a query, question or history longer than ``max_query_chars``
  characters (4,096), get a 413 naming the limit; a request not answered within ``request_timeout_s`` (120 s)
  gets a 504 and the rest of it is not searched; nor is the rest of a request whose client hangs up (the chunk
  being searched finishes; ``/health`` counts it in ``stats.abandoned_requests``);
* ``GET /health`` (`app`): the CURRENT index's folder and ``generation``, backend, index type, model,
  composition, encoder fingerprint, corpus hash, size, dimension; uptime, batching, limits, whether admin is on;
* swapping the index without a restart (`slot`), for the co-training loop that builds a new index per iteration:

      POST /admin/swap-index  {"index": "/path/to/index/folder"}   header  Authorization: Bearer TOKEN
        -> {"previous": {"index_dir", "generation", "backend", "model", "composition", "index_size", "dim",
                         "corpus_sha256", ..}, "new": {..}, "generation": 1, "load_s": 2.4}

  The admin token (`auth`) is ``create_app(admin_token=...)`` / ``ServeConfig.admin_token``, else the environment
  variable ``AGENTIC_RETRIEVER_ADMIN_TOKEN``; with neither the endpoint answers 403 (off). A missing or wrong
  token gets a 401 (compared with ``hmac.compare_digest``), a folder that is missing, not an index or fails to
  open a 422 naming it and why, a swap while another is loading a 409 (refused, not queued); the old index keeps
  serving in every case. The new folder is opened with `open_index` in a worker thread while the old index keeps
  serving, then the reference is replaced: each request pins the index current when it ARRIVES and all its
  chunks are searched on it, so requests in flight finish on the old index, no answer mixes two indexes, none
  fails, and the old index is freed when the last request pinning it is answered. Each ``/retrieve`` answer
  carries the header ``X-Index-Generation`` (0: the index the service started with, +1 per swap); its body
  stays Search-R1's exactly. `swap_index` (`admin`) is the Python call.

    from agentic_retriever.index import open_index
    from agentic_retriever.server import serve, swap_index
    serve(open_index("runs/quickstart/index/minilm-flat"), port=8000)    # with AGENTIC_RETRIEVER_ADMIN_TOKEN set
    swap_index("http://127.0.0.1:8000", "/abs/runs/r1/iter_2/index", token="...")   # from another process
"""

from .admin import swap_index
from .app import GENERATION_HEADER, ServerThread, create_app, running_server, serve
from .auth import ADMIN_TOKEN_ENV
from .config import ServeConfig
from .schema import (
    DEFAULT_MAX_BATCH_MS, DEFAULT_MAX_QUERIES_PER_REQUEST, DEFAULT_MAX_QUERY_CHARS, DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_REQUEST_TIMEOUT_S, DEFAULT_TOPK, MAX_TOPK, RetrieveRequest,
)

__all__ = ["ADMIN_TOKEN_ENV", "DEFAULT_MAX_BATCH_MS",
           "DEFAULT_MAX_QUERIES_PER_REQUEST", "DEFAULT_MAX_QUERY_CHARS", "DEFAULT_MAX_REQUEST_BYTES",
           "DEFAULT_MAX_WAIT_MS", "DEFAULT_REQUEST_TIMEOUT_S",
           "DEFAULT_TOPK", "GENERATION_HEADER",
           "MAX_TOPK", "RetrieveRequest", "ServeConfig", "ServerThread", "create_app", "running_server", "serve",
           "swap_index"]
