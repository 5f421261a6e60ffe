"""A local index's identity for cache keys (`index_identity`): what decides its results, read from its manifest's
content (backend, index type, rows, corpus sha256, encoder fingerprint with the dtype of the passages' encoding when
it was a half precision) and the parameters that change what a search returns (the index type's structural fields
and its search beam / probes; not threads, GPU, memory mapping or build chunking). Models and services are
identified in `agentic_retriever.base.fingerprint`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .dense import STRUCTURE_FIELDS, half_precision

__all__ = ["index_identity"]

#: Parameters that change how an index is built or searched but not what a search returns.
_NOT_RESULTS = ("threads", "gpu", "mmap", "chunk_size", "keep_embeddings", "embeddings_dir")
#: Search-time parameters that do change what an approximate index returns, per index type.
_SEARCH_KNOBS = {"hnsw": ("ef_search",), "ivfpq": ("nprobe",)}


def index_identity(manifest, params: Mapping[str, Any] | None = None) -> dict:
    """What decides a local index's results (see module): `manifest` is its `IndexManifest`, `params` the
    parameters it was opened with (default: the manifest's)."""
    params = dict(manifest.params if params is None else params)
    if manifest.backend == "dense":
        kind = params.get("type", manifest.index_type)
        kept = ("type", *STRUCTURE_FIELDS.get(kind, ()), *_SEARCH_KNOBS.get(kind, ()))
        params = {k: params.get(k) for k in kept}
    else:
        params = {k: v for k, v in params.items() if k not in _NOT_RESULTS}
    encoder = manifest.encoder or {}
    half = half_precision(encoder.get("dtype"))
    return {"kind": "index", "backend": manifest.backend, "index_type": manifest.index_type, "rows": manifest.rows,
            "corpus_sha256": manifest.corpus_sha256, "encoder": encoder.get("fingerprint"), "params": params} | (
        {"encoder_dtype": half} if half else {})
