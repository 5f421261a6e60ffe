"""The index a running service searches, and swapping it for another folder without a restart.

`IndexSlot.current` is the `ServedIndex` that new requests pin when they arrive (the batcher keeps that pin for
every chunk of the request). `IndexSlot.swap` opens the new folder with `open_index` in a worker thread (with the
service's own index placement, `index_gpu`, not the one the new folder's build recorded) while
the current index keeps serving, then replaces the reference in one assignment on the event loop: requests that
arrived before it finish on the old index, later ones use the new one, and the old index is freed when the last
request pinning it is answered. A second swap while one is loading is refused (409), not queued: the caller
learns at once that its folder was not loaded, and no load waits behind another for minutes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..index import open_index
from ..index.base import SearchIndex
from ..index.manifest import MANIFEST_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class ServedIndex:
    """One index as served: the index, its generation (0: the one the service started with, +1 per swap),
    its folder (None when unknown) and the seconds its swap spent opening it (0 for generation 0)."""

    index: SearchIndex
    generation: int
    index_dir: str | None
    load_s: float = 0.0

    def describe(self) -> dict:
        """What ``/health`` and the swap's answer say about this index."""
        m = self.index.manifest
        return {
            "index_dir": self.index_dir,
            "generation": self.generation,
            "backend": m.backend,
            "index_type": m.index_type,
            "model": (m.encoder or {}).get("model"),
            "encoder_fingerprint": (m.encoder or {}).get("fingerprint"),  # what the index's vectors mean:
            "corpus_sha256": m.corpus_sha256,                           # caches of clients key on them
            "composition": self.index.composition,
            "index_size": len(self.index),
            "dim": m.dim,
            "search_device": self.index.device,        # host memory, or the GPUs the vectors are sharded over
            "query_device": self.index.query_device,   # where queries are encoded (None: no encoder)
            "query_dtype": query_dtype(self.index),      # and in what
        }


def query_dtype(index: SearchIndex) -> str | None:
    """The dtype an index's queries are encoded in (its encoder's weights), None for an index without an encoder."""
    return getattr(getattr(index, "encoder", None), "weights_dtype", None)


class SwapRefused(Exception):
    """A swap that did not happen (the current index keeps serving): the HTTP status and the reason."""

    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code


class IndexSlot:
    """Holds the served index; `swap` replaces it atomically (see the module docstring). `index_gpu` (auto, on,
    off; None: as each folder's build recorded) is where every index a swap opens is searched (`open_index`'s
    `gpu`), so a service started with its index in host memory keeps it there across swaps; `query_precision` is
    what their queries are encoded in (`open_index`'s; None: ``auto``). A swap opens only
    folders below `index_roots` (None: the parent folder of `index`'s own; symbolic links resolved), and a refusal
    of any other folder (403) says nothing of what is there."""

    def __init__(self, index: SearchIndex, index_gpu: str | None = None, index_roots: Sequence[str] | None = None,
                 query_precision: str | None = None):
        self.current = ServedIndex(index, 0, index.index_dir)
        self.index_gpu, self.query_precision = index_gpu, query_precision
        if index_roots is None:
            index_roots = [os.path.dirname(os.path.abspath(index.index_dir))] if index.index_dir else []
        self.index_roots = [os.path.realpath(root) for root in index_roots]
        self._loading: str | None = None

    @property
    def loading(self) -> str | None:
        """The folder a swap in progress is opening, or None."""
        return self._loading

    async def swap(self, index_dir: str) -> dict:
        """Open `index_dir` in a worker thread and serve it from now on; returns what changed (previous and new
        folder, generation, size, dim, composition, corpus hashes, load seconds). Raises `SwapRefused`: 409
        while another swap is loading, 403 for a folder outside `index_roots`, 422 for one below them that is
        missing, not an index, or fails to open."""
        if self._loading is not None:
            raise SwapRefused(409, f"a swap to {self._loading} is loading; the service keeps serving generation "
                                   f"{self.current.generation} ({self.current.index_dir}); retry when it has finished")
        folder = os.path.abspath(index_dir)  # relative paths: the server's working directory
        if not self._below_a_root(folder):
            raise SwapRefused(403, f"index folder {folder} is not below the folders this service may open "
                                   "(index_roots, --index-roots; by default the parent folder of the index it "
                                   "started with); the service keeps serving")
        if (problem := _not_an_index(folder)) is not None:
            raise SwapRefused(422, f"index folder {folder}: {problem}; the service keeps serving generation "
                                   f"{self.current.generation} ({self.current.index_dir})")
        self._loading = folder
        started = time.perf_counter()
        try:
            index = await asyncio.to_thread(open_index, folder, gpu=self.index_gpu,
                                            query_precision=self.query_precision)
        except Exception as error:
            raise SwapRefused(422, f"index folder {folder} could not be opened ({type(error).__name__}: {error}); "
                                   f"the service keeps serving generation {self.current.generation} "
                                   f"({self.current.index_dir})") from error
        finally:
            self._loading = None
        previous = self.current
        self.current = ServedIndex(index, previous.generation + 1, index.index_dir or folder,
                                   time.perf_counter() - started)
        log.info("now serving generation %d: %s (%d passages, opened in %.2f s); generation %d (%s) is dropped "
                 "once its requests are answered", self.current.generation, self.current.index_dir, len(index),
                 self.current.load_s, previous.generation, previous.index_dir)
        return {"previous": previous.describe(), "new": self.current.describe(), "generation": self.current.generation,
                "load_s": round(self.current.load_s, 3)}


    def _below_a_root(self, folder: str) -> bool:
        real = os.path.realpath(folder)
        return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in self.index_roots)


def _not_an_index(folder: str) -> str | None:
    """Why `folder` cannot be an index (missing, not a folder, no manifest), or None."""
    if not os.path.exists(folder):
        return "no such folder"
    if not os.path.isdir(folder):
        return "not a folder"
    if not os.path.isfile(os.path.join(folder, MANIFEST_FILE)):
        return f"not a complete index ({MANIFEST_FILE} is missing: build it with `agentic-retriever index build`)"
    return None
