"""Calling the retrieval service's admin endpoints from Python (the co-training loop, the CLI).

    from agentic_retriever.server import swap_index
    token = os.environ["AGENTIC_RETRIEVER_ADMIN_TOKEN"]
    answer = swap_index("http://127.0.0.1:8000", "/runs/r1/iter_2/index", token)
    answer["generation"], answer["new"]["index_size"], answer["load_s"]
"""

from __future__ import annotations

import httpx

from agentic_retriever.base.client import RetrievalServiceError, _error_message, api_key_headers

__all__ = ["swap_index"]


def swap_index(url: str, index_dir: str, token: str, timeout_s: float = 600.0) -> dict:
    """Make the service at `url` serve the index folder `index_dir` from now on (``POST /admin/swap-index``).

    `index_dir` is a path on the SERVER's machine (a relative one is relative to the server's working directory).
    Returns the server's answer: ``previous`` and ``new`` (folder, generation, backend, model, composition, size,
    dim, corpus_sha256, ...), ``generation`` and ``load_s``. Waits up to `timeout_s` for the load (a big index
    takes minutes). Not retried: raises `RetrievalServiceError` with the server's message on any refusal (401 a
    missing or wrong token, 403 admin off, 409 another swap loading, 422 a bad folder; the old index is still
    served) and when the service cannot be reached. The service's API key, if it has one, is read from
    ``$AGENTIC_RETRIEVER_API_KEY``.
    """
    base = url.rstrip("/").removesuffix("/retrieve")
    endpoint = f"{base}/admin/swap-index"
    try:
        response = httpx.post(endpoint, json={"index": str(index_dir)}, timeout=timeout_s,
                              headers={"Authorization": f"Bearer {token}", **api_key_headers()})
    except httpx.TransportError as error:
        raise RetrievalServiceError(f"{endpoint} could not be reached ({type(error).__name__}: {error}); the swap to "
                                    f"{index_dir} may or may not have happened: see {base}/health", url=endpoint)
    if response.status_code >= 400:
        raise RetrievalServiceError(f"{endpoint} refused the swap to {index_dir} ({response.status_code}): "
                                    f"{_error_message(response)}", response.status_code, endpoint)
    return response.json()
