"""The one retrieval service of a loop, kept running across iterations (or one the user runs), moved onto each
iteration's index with ``POST /admin/swap-index`` instead of a restart.

    with LoopService(settings, base_index) as service:
        service.serve(index_dir)     # a swap when the service holds another index, else nothing
        service.url                  # what every step's retrieval points at
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import httpx

from agentic_retriever.base.client import API_KEY_ENV, RetrievalServiceError, api_key_headers
from .config import LoopServiceConfig

__all__ = ["LoopService"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class LoopService:
    """A served-here service (uvicorn thread on a loopback port, a fresh random admin token) when ``url`` is
    empty, else the service at ``url`` with the token in ``admin_token_env``."""

    def __init__(self, settings: LoopServiceConfig, first_index: str, for_cluster: bool = False,
                 index_roots: Sequence[str] = ()):
        """`for_cluster`: shards on other nodes search it (``loop.placement: ray``), so a served-here service binds
        an address they reach and hands out this node's address, never a loopback one; off loopback it takes an
        API key (``$AGENTIC_RETRIEVER_API_KEY``, or a fresh random one put there), which this process's children
        inherit and Ray's shards are handed (`forwarded_environment`). `index_roots`: the folders its swaps may
        open (besides `first_index`'s parent)."""
        self.settings, self.first_index, self.for_cluster = settings, first_index, for_cluster
        self.index_roots = [os.path.dirname(os.path.abspath(first_index)), *map(os.path.abspath, index_roots)]
        self.url = settings.url.rstrip("/").removesuffix("/retrieve")
        self._thread = None
        self._made_key = False
        self.token = os.environ.get(settings.admin_token_env, "") if settings.url else secrets.token_urlsafe(32)
        self.swaps: list[dict] = []

    def __enter__(self) -> LoopService:
        if self.settings.url:
            if not self.token:
                raise ValueError(f"loop.service.url {self.settings.url} is given but ${self.settings.admin_token_env} "
                                 "is empty: export the admin token the service was started with (index serve "
                                 "--admin-token, or the same variable), so the loop can swap its index")
            return self
        from agentic_retriever.index import open_index
        from agentic_retriever.server import ServerThread, create_app
        from agentic_retriever.server.slot import query_dtype
        from agentic_retriever.server.gate import is_loopback

        if self.for_cluster and self.settings.host in _LOOPBACK:
            raise ValueError(f"loop.placement ray: shards on other nodes cannot reach the loop's service at "
                             f"loop.service.host {self.settings.host}; set it to 0.0.0.0 (every interface, the "
                             "URL handed out is this node's address) or to an address of this node they reach")
        loopback = is_loopback(self.settings.host)
        if not loopback and not os.environ.get(API_KEY_ENV):
            os.environ[API_KEY_ENV] = secrets.token_urlsafe(32)  # inherited by every process the loop starts
            self._made_key = True
        index = open_index(self.first_index, gpu=self.settings.open_gpu, query_precision=self.settings.query_precision)
        app = create_app(index, admin_token=self.token, index_gpu=self.settings.open_gpu,
                         api_key=None if loopback else os.environ[API_KEY_ENV], loopback_only_hosts=loopback,
                         index_roots=self.index_roots, query_precision=self.settings.query_precision)
        self._thread = ServerThread(app, host=self.settings.host, port=self.settings.port)
        self.url = self._thread.start()
        if self.for_cluster and self.settings.host == "0.0.0.0":
            from .ray_placement import node_address

            self.url = f"http://{node_address()}:{self._thread.port}"
        print(f"retrieval service for the loop on {self.url}/retrieve, serving {self.first_index}: index searched on "
              f"{index.device}, queries encoded on {index.query_device or 'no encoder'}"
              + (f" in {query_dtype(index)}" if index.query_device else "") + " (loop.service.index_gpu "
              f"{self.settings.index_gpu})", flush=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._made_key:  # the key lives as long as the service
            os.environ.pop(API_KEY_ENV, None)
            self._made_key = False

    def serving(self) -> str:
        """The index folder the service holds now (its ``/health``)."""
        try:
            health = httpx.get(f"{self.url}/health", timeout=30.0,  # as admin: the folder in full
                               headers={"Authorization": f"Bearer {self.token}", **api_key_headers()}).json()
        except httpx.HTTPError as error:
            raise RetrievalServiceError(f"{self.url}/health could not be read ({error})", url=self.url) from None
        return health.get("index_dir") or ""

    def url_for(self, index_dir: str) -> str:
        """The service's URL, once it holds `index_dir` (`serve`)."""
        self.serve(index_dir)
        return self.url

    def serve(self, index_dir: str) -> dict | None:
        """Make the service hold `index_dir` (a swap, recorded in `swaps`), unless it already does."""
        from agentic_retriever.server import swap_index

        wanted = str(Path(index_dir).resolve())
        current = self.serving()
        if current and Path(current).resolve() == Path(wanted):
            return None
        answer = swap_index(self.url, wanted, self.token)
        self.swaps.append({"index": wanted, "generation": answer.get("generation"), "load_s": answer.get("load_s")})
        print(f"retrieval service now serves {wanted} (generation {answer.get('generation')}, "
              f"loaded in {answer.get('load_s', 0):.1f} s, searched on {answer['new'].get('search_device')})",
              flush=True)
        return answer
