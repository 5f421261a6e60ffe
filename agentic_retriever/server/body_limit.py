"""A limit on the bytes of a request body, enforced before anything parses it (a pure ASGI middleware).

FastAPI reads and parses a whole JSON body before a handler runs, so the limits on the parsed request
(``max_queries_per_request``, ``max_query_chars``) apply only after the memory for it is spent. `BodySizeLimit`
stands in front of the app: a request whose ``Content-Length`` is over the limit gets a 413 at once, its body
unread; a body without one (``Transfer-Encoding: chunked``) is counted as it arrives and refused with a 413 as
soon as it passes the limit. A 413 closes the connection (the rest of the body is never read). A body within the
limit is handed on as it was sent, followed by the server's own ``receive`` (which then reports the client's
hang-up, `app`).

    app.add_middleware(BodySizeLimit, max_bytes=1 << 20)
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodySizeLimit:
    """Refuse (413) any HTTP request whose body is larger than `max_bytes`, before the app reads it; call
    `on_refused` for each one refused (the service counts them)."""

    def __init__(self, app: ASGIApp, max_bytes: int, on_refused: Callable[[], None] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send, f"{declared} bytes (Content-Length)")
            return
        body = await self._receive_body(scope, receive, send)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)

    async def _receive_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, counted as it arrives; None when it passed the limit (refused here) or the client left
        before sending all of it (no one to answer)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, f"more than {self.max_bytes} bytes")
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        if self.on_refused is not None:
            self.on_refused()
        detail = (f"the request body is too large: {size}, the limit is {self.max_bytes} bytes (server setting "
                  f"max_request_bytes, --max-request-bytes); send fewer queries per request")
        response = JSONResponse(status_code=413, content={"detail": detail}, headers={"Connection": "close"})
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    """The request's declared ``Content-Length``, or None when it has none (or one that is not a number: the
    server's HTTP parser refuses those, and the body is counted anyway)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives `body` as one message, then whatever the server's `receive` gives (a hang-up)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
