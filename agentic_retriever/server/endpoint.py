"""``POST /retrieve`` as a pure ASGI middleware in front of FastAPI (`app.ServiceApp`).

RL rollouts send the service one small request per search, hundreds a second, and every millisecond of CPU a
request costs is taken from the encoder on the same cores. Profiled under 64 one-query clients with an index that
costs nothing (benchmarks/RESULTS.md, "Retrieval service: its own CPU per request"), FastAPI's routing,
dependency solving and request and response objects were about 60% of the service's own CPU per request. This
endpoint does that request's work directly: the body (already checked against ``max_request_bytes`` by `body_limit` in front of it), pydantic's
own JSON validation of `RetrieveRequest`, the answer `create_app` computes, and the JSON bytes of Starlette's
``JSONResponse`` (compact, non-ASCII kept), or a chunked stream for a big answer. Every other path goes on to
FastAPI (``/health``, ``/admin/swap-index``); an exception escaping here gets uvicorn's 500 and log line.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

PATH = "/retrieve"


@dataclass
class Reply:
    """An answer to send: a JSON object (rendered as one body) or an async iterator of body pieces (streamed)."""

    status: int
    content: dict | AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)


#: ``answer(body, receive)``: the `Reply` to a request's body; `receive` reports the client's hang-up.
Answer = Callable[[bytes, Receive], Awaitable[Reply]]


def json_body(content: dict) -> bytes:
    """The bytes of Starlette's ``JSONResponse(content)``."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode("utf-8")


class RetrieveEndpoint:
    """Answers ``POST /retrieve`` with `answer` (405 for another method on that path); passes anything else on."""

    def __init__(self, app: ASGIApp, answer: Answer):
        self.app = app
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) != PATH:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await send_reply(send, Reply(405, {"detail": "Method Not Allowed"}, {"allow": "POST"}))
            return
        body = await _read_body(receive)
        if body is not None:
            await send_reply(send, await self.answer(body, receive))


def route_path(scope: Scope) -> str:
    """The request's path as FastAPI's router matches it: without the ``root_path`` a proxy mounts the app under."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


async def _read_body(receive: Receive) -> bytes | None:
    """The request's body; None when the client left before sending all of it."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_reply(send: Send, reply: Reply) -> None:
    headers = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers.items()]
    headers.append((b"content-type", b"application/json"))
    if isinstance(reply.content, dict):
        body = json_body(reply.content)
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    async for piece in reply.content:
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
