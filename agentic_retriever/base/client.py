"""The retrieval-client protocol: how a search agent asks a retriever for passages.

An agent depends on `RetrievalClient` only, never on an index (docs/architecture.md, "Layers"):

* `agentic_retriever.retrieval.LocalRetrievalClient` searches an in-process `SearchIndex` (the retriever's side);
* `HttpRetrievalClient` talks to a retrieval service (`agentic_retriever.server`, or Search-R1's own
  server: the same ``POST /retrieve`` API), in batches, with retries and back-off.

    with HttpRetrievalClient("http://127.0.0.1:8000") as client:
        hits = client.retrieve(["who wrote hamlet"], topk=3, questions=["Who wrote Hamlet and when?"])
        hits[0][0].title, hits[0][0].text, hits[0][0].score
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx

from .corpus import ScoredPassage, split_contents

__all__ = ["HttpRetrievalClient", "RetrievalClient", "RetrievalConfig", "RetrievalServiceError", "api_key_headers",
           "check_request"]

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_MAX_RETRY_AFTER_S = 30.0

#: A retrieval service's API key: the environment variable servers and clients read it from, and the header it
#: travels in (`agentic_retriever.server.gate`).
API_KEY_ENV = "AGENTIC_RETRIEVER_API_KEY"
API_KEY_HEADER = "X-API-Key"


def api_key_headers(api_key: str | None = None) -> dict[str, str]:
    """The headers that carry a service's API key: `api_key` (None: ``$AGENTIC_RETRIEVER_API_KEY``), none when
    that is empty."""
    api_key = os.environ.get(API_KEY_ENV, "") if api_key is None else api_key
    return {API_KEY_HEADER: api_key} if api_key else {}


@runtime_checkable
class RetrievalClient(Protocol):
    """Anything that turns a batch of search queries into ranked passages."""

    def retrieve(self, queries: Sequence[str], topk: int,
                 questions: Sequence[str | None] | None = None) -> list[list[ScoredPassage]]:
        """Per query, up to `topk` passages, best first. `questions` (parallel to `queries`, entries may
        be None) is the agent's original question; retrievers trained on ``Q [SEP] q`` use it."""
        ...


class RetrievalServiceError(RuntimeError):
    """The retrieval service refused a request, or could not be reached after the retries."""

    def __init__(self, message: str, status_code: int | None = None, url: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.url = url


def check_request(queries: Sequence[str], topk: int, questions, histories) -> None:
    if isinstance(queries, str):
        raise TypeError("queries must be a sequence of strings, not one string")
    if topk < 1:
        raise ValueError(f"topk must be at least 1, got {topk}")
    for name, values in (("questions", questions), ("histories", histories)):
        if values is not None and len(values) != len(queries):
            raise ValueError(f"{name} must be parallel to queries: got {len(values)} for {len(queries)} queries")


class HttpRetrievalClient:
    """Client of a Search-R1 compatible retrieval service.

    `url` is the service's base address (``http://host:port``) or its ``/retrieve`` endpoint. Query lists
    longer than `batch_size` go out as several requests. Connection errors, timeouts, 5xx and 429 are
    retried `max_retries` times, waiting ``backoff * 2**attempt`` seconds (or the server's Retry-After);
    any other 4xx raises `RetrievalServiceError` at once with the server's message. `api_key` (None:
    ``$AGENTIC_RETRIEVER_API_KEY``; empty: none) is sent as the header ``X-API-Key`` with every request.
    """

    def __init__(self, url: str, timeout: float = 30.0, max_retries: int = 3, backoff: float = 0.5,
                 batch_size: int = 64, transport: httpx.BaseTransport | None = None, api_key: str | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        base = url.rstrip("/")
        if base.endswith("/retrieve"):
            base = base[: -len("/retrieve")]
        self.base_url = base
        self.max_retries, self.backoff, self.batch_size = max_retries, backoff, batch_size
        self._http = httpx.Client(timeout=timeout, transport=transport, headers=api_key_headers(api_key))

    # protocol ----------------------------------------------------------------------------------

    def retrieve(self, queries: Sequence[str], topk: int, questions: Sequence[str | None] | None = None,
                 histories: Sequence[Sequence[str] | None] | None = None) -> list[list[ScoredPassage]]:
        check_request(queries, topk, questions, histories)
        results: list[list[ScoredPassage]] = []
        for start in range(0, len(queries), self.batch_size):
            stop = start + self.batch_size
            body: dict[str, Any] = {"queries": list(queries[start:stop]), "topk": topk, "return_scores": True}
            if questions is not None:
                body["questions"] = list(questions[start:stop])
            if histories is not None:
                body["histories"] = [list(h) if h is not None else None for h in histories[start:stop]]
            payload = self._request("POST", "/retrieve", body)
            batch = payload.get("result") if isinstance(payload, dict) else None
            if not isinstance(batch, list) or len(batch) != len(body["queries"]):
                raise RetrievalServiceError(
                    f"{self.base_url}/retrieve answered {len(batch) if isinstance(batch, list) else 'no'} result "
                    f"lists for {len(body['queries'])} queries", url=f"{self.base_url}/retrieve")
            results.extend([_passage(hit) for hit in hits] for hits in batch)
        return results

    def health(self) -> dict:
        """The service's ``GET /health`` (model, index size, dimension, uptime...)."""
        return self._request("GET", "/health")

    def identity(self) -> dict:
        """What decides this service's results, for cache keys, from its ``/health`` (`fingerprint.service_identity`)."""
        from .fingerprint import service_identity

        try:
            health = self.health()
        except RetrievalServiceError as error:
            log.info("%s/health: %s", self.base_url, error)
            health = None
        return service_identity(self.base_url, health)

    # plumbing ----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        url = self.base_url + path
        for attempt in range(self.max_retries + 1):
            retry_after = status = None
            try:
                response = self._http.request(method, url, json=body)
            except httpx.TransportError as error:  # refused, reset, timed out...
                problem = f"{type(error).__name__}: {error}"
            else:
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError:
                        raise RetrievalServiceError(f"{url} answered {response.status_code} with a body that is "
                                                    f"not JSON: {response.text[:200]!r}", response.status_code, url)
                message = _error_message(response)
                if response.status_code not in _RETRY_STATUS:
                    raise RetrievalServiceError(f"{url} refused the request ({response.status_code}): {message}",
                                                response.status_code, url)
                status, problem = response.status_code, f"HTTP {response.status_code}: {message}"
                retry_after = _retry_after(response)
            if attempt == self.max_retries:
                raise RetrievalServiceError(f"{url} failed after {attempt + 1} attempts; last: {problem}", status, url)
            delay = retry_after if retry_after is not None else self.backoff * 2 ** attempt
            log.warning("%s %s failed (%s); retry %d of %d in %.2f s", method, url, problem, attempt + 1,
                        self.max_retries, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HttpRetrievalClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _passage(hit: dict) -> ScoredPassage:
    """One hit of either response shape (with or without scores) as a ScoredPassage."""
    document, score = (hit["document"], hit.get("score", 0.0)) if "document" in hit else (hit, 0.0)
    if "contents" in document:
        title, text = split_contents(document["contents"])
    else:
        title, text = document.get("title", ""), document.get("text", "")
    return ScoredPassage(str(document.get("id", "")), title, text, float(score if score is not None else 0.0))


def _error_message(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return response.text[:500] or response.reason_phrase
    if isinstance(detail, list):  # FastAPI's default validation errors
        return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                         if isinstance(e, dict) else str(e) for e in detail)
    return str(detail) if detail is not None else response.text[:500]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return min(max(float(value), 0.0), _MAX_RETRY_AFTER_S) if value is not None else None
    except ValueError:
        return None



@dataclass
class RetrievalConfig:
    """The retriever a command searches: an index folder opened in this process, or a service URL (exactly one).

    The ``retrieval`` setting of a config file, shared by every command that searches
    (`agentic_retriever.app.config_loader`)."""

    index: str = field(default="", metadata={"help": "index folder searched in this process", "alias": "--index"})
    url: str = field(default="", metadata={"help": "or a retrieval service URL (Search-R1 /retrieve API)",
                                           "alias": "--url"})
