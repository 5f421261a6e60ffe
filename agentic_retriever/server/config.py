"""Settings of `agentic-retriever index serve` (section ``index_serve``) and `index swap` (section ``index_swap``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.precision import Precision
from .schema import (
    DEFAULT_MAX_BATCH_MS, DEFAULT_MAX_PASSAGES_PER_REQUEST, DEFAULT_MAX_QUERIES_PER_REQUEST, DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_WAIT_MS, DEFAULT_REQUEST_TIMEOUT_S,
)

__all__ = ["IndexSwapConfig", "ServeConfig"]


@dataclass
class ServeConfig:
    RENAMED: ClassVar[dict[str, str]] = {"index": "retrieval.index"}

    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig, metadata={
        "help": "the index to serve (its folder: retrieval.index)"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on"})
    port: int = field(default=8000, metadata={"help": "port to listen on"})
    batching: bool = field(default=True, metadata={"help": "gather concurrent requests into one search"})
    max_batch_queries: int = field(default=256, metadata={"help": "most queries gathered into one search"})
    max_batch_ms: float = field(default=DEFAULT_MAX_BATCH_MS, metadata={
        "help": "most index time one search may take, timed on the recent searches (a small request waits for about "
                "this much of a big one's work); 0: max_batch_queries alone"})
    max_wait_ms: float = field(default=DEFAULT_MAX_WAIT_MS, metadata={
        "help": "extra window a batch stays open for more requests after its first (0: search as soon as the index "
                "is free; requests arriving meanwhile form the next batch)"})
    max_queries_per_request: int = field(default=DEFAULT_MAX_QUERIES_PER_REQUEST, metadata={
        "help": "most queries in one request (more: 413); big requests are searched in chunks "
                "(max_batch_queries, max_batch_ms)"})
    max_query_chars: int = field(default=DEFAULT_MAX_QUERY_CHARS, metadata={
        "help": "most characters in one query, question or history (more: 413)"})
    max_request_bytes: int = field(default=DEFAULT_MAX_REQUEST_BYTES, metadata={
        "help": "most bytes in one request body, refused (413) before it is parsed: a Content-Length above it at "
                "once, a chunked body as soon as it passes it (the default lets a request at the query and "
                "character limits through)"})
    max_passages_per_request: int = field(default=DEFAULT_MAX_PASSAGES_PER_REQUEST, metadata={
        "help": "most passages one request may ask for in all, queries x topk (more: 413, before any search)"})
    request_timeout_s: float = field(default=DEFAULT_REQUEST_TIMEOUT_S, metadata={
        "help": "longest time one request may take, queueing included (longer: 504); 0: no limit"})
    admin_token: str = field(default="", metadata={
        "help": "token of the admin endpoints (POST /admin/swap-index, header 'Authorization: Bearer TOKEN'); empty: "
                "the environment variable AGENTIC_RETRIEVER_ADMIN_TOKEN, and when that is empty too, admin endpoints "
                "are off (prefer the variable: a flag shows in the process list)"})
    api_key: str = field(default="", metadata={
        "help": "key every caller must send as the header 'X-API-Key: KEY' (all paths but GET /livez); empty: the "
                "environment variable AGENTIC_RETRIEVER_API_KEY, and when that is empty too, no key (allowed on a "
                "loopback address only, unless unauthenticated_network; prefer the variable: a flag shows in the "
                "process list)"})
    unauthenticated_network: bool = field(default=False, metadata={
        "help": "serve a non-loopback address without an API key: anyone who reaches the port can search the "
                "index and read the corpus (off: such a start is refused)"})
    index_roots: list[str] = field(default_factory=list, metadata={
        "help": "folders below which POST /admin/swap-index may open an index (empty: the parent folder of the "
                "served index)"})
    gpu: Literal["auto", "on", "off"] = field(default="auto", metadata={"help": "FAISS on GPUs (dense indexes)"})
    query_precision: Precision = field(default="native", metadata={
        "help": "what queries are encoded in (passages keep the build's): native, bf16 where the CPU computes bf16 "
                "in hardware (AMX, AVX512-BF16; top-3 agreement with fp32 in benchmarks/RESULTS.md) and fp32 on "
                "other CPUs, on a GPU as auto; or auto, fp32, bf16, fp16"})
    access_log: bool = field(default=False, metadata={
        "help": "log a line per request (uvicorn's access log); off by default: RL rollouts send hundreds of "
                "requests a second, and GET /health counts them"})


@dataclass
class IndexSwapConfig:
    """Settings of `agentic-retriever index swap`: make a running service serve another index folder."""

    url: str = field(default="", metadata={"help": "the running service's URL", "required": True})
    index: str = field(default="", metadata={
        "help": "index folder to serve, as a path on the server's machine (absolute: the server resolves a relative "
                "one against its own working folder)", "required": True})
    token: str = field(default="", metadata={
        "help": "the service's admin token (empty: $AGENTIC_RETRIEVER_ADMIN_TOKEN, which keeps it out of the "
                "process list)"})
    timeout_s: float = field(default=600.0, metadata={"help": "longest wait for the new index to load"})
