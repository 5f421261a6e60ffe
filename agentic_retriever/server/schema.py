"""The wire format of ``POST /retrieve``: the pydantic request model (`RetrieveRequest`, with the optional
``questions``/``histories`` lists parallel to ``queries``), the size limits a request must keep (their defaults;
`limit_violation`: the 413 message of the parsed request; `body_limit` enforces the byte limit on the body), the
rendering of retrieved passages as Search-R1 result rows, and pydantic validation errors rendered as one readable
line for the 4xx reply; and the body of ``POST /admin/swap-index`` (`SwapRequest`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentic_retriever.base.corpus import ScoredPassage

MAX_TOPK = 1000
DEFAULT_TOPK = 3
DEFAULT_MAX_QUERIES_PER_REQUEST = 10_000
DEFAULT_MAX_QUERY_CHARS = 4096
DEFAULT_REQUEST_TIMEOUT_S = 120.0
#: Passages one request may ask for in all (queries x topk): what the batcher and the answer hold for it. A request of
#: 10,000 queries x topk 1,000 (10^7 passages) grew a server to 16.7 GB in two minutes; 100,000 passages (10,000
#: queries x 10, a Search-R1 evaluation batch of 512 x 3 is 1,536) are about 170 MB.
DEFAULT_MAX_PASSAGES_PER_REQUEST = 100_000
#: Bytes in one request body, refused (413) before it is parsed. A request at the two limits above holds 10,000
#: queries of 4,096 characters: 41 MB of JSON in ASCII. 128 MiB (134 MB) lets it through with a question as long
#: beside each query (82 MB), or with every character of its queries a 3-byte UTF-8 one (123 MB), and refuses a
#: body far beyond anything those limits accept before FastAPI spends memory parsing it.
DEFAULT_MAX_REQUEST_BYTES = 128 * 1024 * 1024
#: No fixed batching window: a batch gathers the requests that arrived while the index searched the one before.
DEFAULT_MAX_WAIT_MS = 0.0
#: Most index time one batch may take (`batcher.CallTimes`): a small request beside a big one waits for about this
#: much of the big one's work before its own batch.
DEFAULT_MAX_BATCH_MS = 100.0


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


class SwapRequest(BaseModel):
    """Body of ``POST /admin/swap-index``: the index folder to serve from now on (relative paths: the server's
    working directory)."""

    model_config = ConfigDict(extra="forbid")

    index: str = Field(min_length=1)


def limit_violation(request: RetrieveRequest, max_queries: int, max_chars: int,
                    max_passages: int = DEFAULT_MAX_PASSAGES_PER_REQUEST) -> str | None:
    """Why `request` is too large to serve (the 413 message, naming the limit and its setting), or None.

    At most `max_queries` queries and `max_passages` passages in all (queries x topk); each query and each
    question at most `max_chars` characters, and each query's history (all its entries together) too: the encoder
    tokenizes all of it before truncating, so a huge string costs every request batched with it."""
    if len(request.queries) > max_queries:
        return (f"too many queries in one request: {len(request.queries)}, the limit is {max_queries} "
                f"(server setting max_queries_per_request, --max-queries-per-request); send them in several requests")
    if (asked := len(request.queries) * request.topk) > max_passages:
        return (f"too many passages asked for in one request: {len(request.queries)} queries x topk "
                f"{request.topk} = {asked}, the limit is {max_passages} (server setting max_passages_per_request, "
                f"--max-passages-per-request); send fewer queries per request or a smaller topk")
    for name, values in (("queries", request.queries), ("questions", request.questions or ())):
        for i, value in enumerate(values):
            if value is not None and len(value) > max_chars:
                return (f"{name}[{i}] is too long: {len(value)} characters, the limit is {max_chars} "
                        f"(server setting max_query_chars, --max-query-chars)")
    for i, history in enumerate(request.histories or ()):
        if history is not None and (size := sum(len(h) for h in history)) > max_chars:
            return (f"histories[{i}] is too long: {size} characters in all, the limit is {max_chars} "
                    f"(server setting max_query_chars, --max-query-chars)")
    return None


def _readable_errors(errors: Sequence[dict]) -> str:
    """Pydantic errors as one line: ``body.topk: Input should be greater than or equal to 1; ...``."""
    parts = []
    for error in errors:
        loc = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{loc}: {error.get('msg', 'invalid')}" if loc else str(error.get("msg", "invalid")))
    return "; ".join(parts) or "invalid request"


#: Rows of an answer rendered at a time (`render_answer`): an answer with more is sent as a stream of pieces of
#: this many rows, the event loop free between them, so a 10,000-query answer (about 20 MB of JSON) does not hold
#: every other request for the second its encoding takes on a small CPU.
RENDER_PIECE_ROWS = 256


async def render_answer(results: list[list[ScoredPassage]], with_scores: bool):
    """The ``{"result": [...]}`` body of `results` as UTF-8 pieces of `RENDER_PIECE_ROWS` rows, yielding to the
    event loop between pieces; the bytes are those of one ``JSONResponse`` (compact, non-ASCII kept)."""
    yield b'{"result":['
    for start in range(0, len(results), RENDER_PIECE_ROWS):
        rows = [_render(row, with_scores) for row in results[start:start + RENDER_PIECE_ROWS]]
        piece = json.dumps(rows, ensure_ascii=False, allow_nan=False, separators=(",", ":"))[1:-1]
        yield (("," if start else "") + piece).encode("utf-8")
        await asyncio.sleep(0)
    yield b"]}"


def _render(passages: list[ScoredPassage], with_scores: bool) -> list[dict]:
    if with_scores:
        return [{"document": {"id": p.id, "contents": p.contents}, "score": float(p.score)} for p in passages]
    return [{"id": p.id, "contents": p.contents} for p in passages]
