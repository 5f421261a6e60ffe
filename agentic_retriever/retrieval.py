"""Opening a retriever for the agent's side: an index folder searched in this process (`LocalRetrievalClient`) or
a running service (`agentic_retriever.base.client.HttpRetrievalClient`), chosen by the shared ``retrieval`` setting
(`open_client`).

The one module of the retriever's family the agent may import (docs/architecture.md, "Layers"): the agent holds a
`RetrievalClient` and never an index; this is where a `RetrievalConfig` naming an index folder becomes one.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from .base.client import HttpRetrievalClient, RetrievalConfig, check_request
from .base.corpus import ScoredPassage
from .index.base import SearchIndex

__all__ = ["LocalRetrievalClient", "SearchConfig", "open_client"]


class LocalRetrievalClient:
    """Searches an index in this process (no server). Safe to share between threads."""

    def __init__(self, index: SearchIndex):
        self.index = index
        self._lock = threading.Lock()

    def retrieve(self, queries: Sequence[str], topk: int, questions: Sequence[str | None] | None = None,
                 histories: Sequence[Sequence[str] | None] | None = None) -> list[list[ScoredPassage]]:
        check_request(queries, topk, questions, histories)
        if not queries:
            return []
        with self._lock:
            return self.index.retrieve(list(queries), topk,
                                       list(questions) if questions is not None else None,
                                       [list(h) if h is not None else None for h in histories]
                                       if histories is not None else None)

    @property
    def encoder(self):
        """The index's query encoder (`agentic_retriever.base.encoder.Encoder`), None for an index without one (BM25):
        for rewards that embed the agent's queries the way the retriever does."""
        return getattr(self.index, "encoder", None)

    def identity(self) -> dict:
        """What decides this client's results, for cache keys: the index's content (its manifest), not its path."""
        from .index.identity import index_identity

        params = getattr(self.index, "params", None)
        return index_identity(self.index.manifest, dataclasses.asdict(params) if dataclasses.is_dataclass(params)
                              else None)

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalRetrievalClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_client(config: RetrievalConfig) -> LocalRetrievalClient | HttpRetrievalClient:
    """An in-process client over ``config.index``, or an HTTP client of the service at ``config.url``."""
    if bool(config.index) == bool(config.url):
        raise ValueError("give exactly one retriever: --index DIR (retrieval.index) or --url URL (retrieval.url)"
                         + (f"; got both {config.index!r} and {config.url!r}" if config.index else ""))
    if config.url:
        return HttpRetrievalClient(config.url)
    from .index import open_index

    return LocalRetrievalClient(open_index(config.index))


@dataclass
class SearchConfig:
    """Settings of `agentic-retriever index search` (section ``index_search``)."""

    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    queries: list[str] = field(default_factory=list, metadata={"help": "queries to search", "required": True})
    questions: list[str] = field(default_factory=list, metadata={
        "help": "original questions, parallel to the queries (for encoders trained on 'Q [SEP] q')"})
    k: int = field(default=3, metadata={"help": "passages per query"})
    json: bool = field(default=False, metadata={"help": "print JSON lines instead of text"})
