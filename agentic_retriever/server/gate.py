"""The service's front door: which callers it answers, decided from the request's headers before any byte of its
body is read, in front of every other layer (`app.ServiceApp`).

In order, for every HTTP request:

1. ``GET /livez`` answers ``{"status": "ok"}`` to anyone on an allowed host: a liveness check for process
   supervisors and load balancers, which tells nothing about the index.
2. **Host.** A service bound to a loopback address answers only requests whose ``Host`` header names a loopback
   host (``localhost``, 127.0.0.0/8, ``::1``; any port): a web page whose DNS name is rebound to 127.0.0.1 sends its
   own name there and gets a 421, so it cannot read answers from the user's local service (DNS rebinding).
3. **API key.** With a key (`resolve_api_key`: given, or ``$AGENTIC_RETRIEVER_API_KEY``) every other path needs
   the header ``X-API-Key: KEY`` (compared in constant time), or gets a 401 that says nothing else: ``/retrieve``,
   ``/health``, ``/docs``, ``/openapi.json`` and the admin endpoints alike (which also need the admin token).
   Search-R1's client sends no header: it keeps working against a service without a key, which is allowed on
   loopback only (`check_exposure`).
4. **JSON only.** A POST must say ``Content-Type: application/json``, or it gets a 415: a browser page may send a
   cross-site ``text/plain`` POST without asking (a "simple" request), but not a JSON one, which it must first
   ask about with a CORS preflight that this service never grants.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from starlette.types import ASGIApp, Receive, Scope, Send

from agentic_retriever.base.client import API_KEY_ENV, API_KEY_HEADER
from .endpoint import Reply, route_path, send_reply

__all__ = ["API_KEY_ENV", "API_KEY_HEADER", "LIVENESS_PATH", "Gate", "check_exposure", "is_loopback",
           "resolve_api_key"]

LIVENESS_PATH = "/livez"


def resolve_api_key(key: str | None) -> str | None:
    """The service's API key: `key` when not empty, else ``$AGENTIC_RETRIEVER_API_KEY`` when not empty, else None."""
    return key or os.environ.get(API_KEY_ENV) or None


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    host = host.strip().lower().removeprefix("[").removesuffix("]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, unauthenticated_network: bool) -> None:
    """Refuse to serve a non-loopback address without an API key unless the user said so by name (ValueError)."""
    if is_loopback(host) or api_key or unauthenticated_network:
        return
    raise ValueError(
        f"serving on {host} without an API key would let anyone who reaches this port search the index and read the "
        f"corpus: set one (the environment variable {API_KEY_ENV}, or index_serve.api_key, --api-key; clients send "
        f"it as the header '{API_KEY_HEADER}: KEY'), bind 127.0.0.1, or accept the risk with "
        "--unauthenticated-network (index_serve.unauthenticated_network)")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _host_name(host_header: str) -> str:
    """The host of a ``Host`` header without its port (``[::1]:8000`` -> ``::1``)."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


class Gate:
    """ASGI middleware enforcing the module's rules; `loopback_only_hosts` turns on the Host check (a loopback
    bind), `api_key` None turns off the key check; `on_refused` counts each refusal."""

    def __init__(self, app: ASGIApp, api_key: str | None, loopback_only_hosts: bool, on_refused=lambda: None):
        self.app, self.api_key, self.loopback_only_hosts = app, api_key, loopback_only_hosts
        self._key = api_key.encode() if api_key else None
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            self.on_refused()
            await send_reply(send, refusal)
            return
        if route_path(scope) == LIVENESS_PATH and scope["method"] in ("GET", "HEAD"):
            await send_reply(send, Reply(200, {"status": "ok"}))
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> Reply | None:
        if self.loopback_only_hosts:
            host = _header(scope, b"host")
            if host is None or not is_loopback(_host_name(host)):
                return Reply(421, {"detail": "this service answers requests addressed to localhost only (Host "
                                             "header); it is bound to a loopback address"})
        if route_path(scope) == LIVENESS_PATH:
            return None
        if self._key is not None:
            given = _header(scope, API_KEY_HEADER.lower().encode())
            if given is None or not hmac.compare_digest(given.encode("latin-1"), self._key):
                return Reply(401, {"detail": f"missing or wrong API key: send the header '{API_KEY_HEADER}: KEY'"},
                             {"WWW-Authenticate": API_KEY_HEADER})
        if scope["method"] == "POST":
            kind = (_header(scope, b"content-type") or "").partition(";")[0].strip().lower()
            if kind != "application/json":
                return Reply(415, {"detail": "POST bodies must be JSON, sent with 'Content-Type: application/json'"})
        return None
