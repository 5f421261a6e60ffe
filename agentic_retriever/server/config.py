"""Settings of `agentic-retriever index serve` (section ``index_serve``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..client import RetrievalConfig

__all__ = ["ServeConfig"]


@dataclass
class ServeConfig:
    RENAMED: ClassVar[dict[str, str]] = {"index": "retrieval.index"}

    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig, metadata={
        "help": "the index to serve (its folder: retrieval.index)"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on"})
    port: int = field(default=8000, metadata={"help": "port to listen on"})
    batching: bool = field(default=True, metadata={"help": "gather concurrent requests into one search"})
    max_batch_queries: int = field(default=256, metadata={"help": "most queries gathered into one search"})
    max_wait_ms: float = field(default=5.0, metadata={"help": "longest wait for more requests before searching"})
    gpu: Literal["auto", "on", "off"] = field(default="auto", metadata={"help": "FAISS on GPUs (dense indexes)"})
