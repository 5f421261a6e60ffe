"""The admin token of the retrieval service: where it comes from, and whether a request carries it.

Admin endpoints (``POST /admin/swap-index``) are on only when the service has a token: the one given
(`create_app(admin_token=...)`, `ServeConfig.admin_token`), else the environment variable
``AGENTIC_RETRIEVER_ADMIN_TOKEN``; with neither they answer 403. A request proves it knows the token with the
header ``Authorization: Bearer TOKEN``, compared in constant time (`hmac.compare_digest`); without it, or with
another token, it gets a 401.
"""

from __future__ import annotations

import hmac
import os

ADMIN_TOKEN_ENV = "AGENTIC_RETRIEVER_ADMIN_TOKEN"


def resolve_admin_token(token: str | None) -> str | None:
    """The service's admin token: `token` when not empty, else ``$AGENTIC_RETRIEVER_ADMIN_TOKEN`` when not empty,
    else None (admin endpoints off)."""
    return token or os.environ.get(ADMIN_TOKEN_ENV) or None


def admin_refusal(authorization: str | None, token: str | None) -> tuple[int, str] | None:
    """Why a request with this ``Authorization`` header may not use an admin endpoint (status, message), or None.

    403 when admin endpoints are off (`token` None), 401 when the header is missing, not ``Bearer ...``, or
    names another token."""
    if token is None:
        return 403, (f"admin endpoints are off: start the service with an admin token (environment variable "
                     f"{ADMIN_TOKEN_ENV}, or the index_serve setting admin_token, --admin-token) to turn them on")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return 401, "missing admin token: send the header 'Authorization: Bearer TOKEN'"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return 401, "wrong admin token"
    return None
