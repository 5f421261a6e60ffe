"""Content fingerprints for cache keys: what a model or a retriever *is*, not where it lies or what it is called.

Caches keyed by names and paths serve stale results when weights are retrained in place, or miss when a folder
moves. The caches of mining (`agentic_retriever.mining`) and of the agent's warm start (`agent.sft`) key on these
fingerprints instead:

* `model_fingerprint(path_or_name)`: a local model folder (or single weights file) -> ``sha256:<hex>`` of its
  config, weights and tokenizer files (`MODEL_FILES`; not training leftovers such as ``training_args.bin`` or
  ``sft_manifest.json``). Hashing a large model takes a while, so the result is stored beside the weights in
  ``.agentic_retriever_fingerprint.json`` with each file's size, modification time and inode, and reused while
  those are unchanged; a folder that cannot be written keeps it under ``cache_root()/fingerprints/``. As git does
  for its index ("racy git"), a stored fingerprint is trusted only for files last modified at least
  `RACY_SECONDS` before it was computed: a file rewritten within the same timestamp tick keeps its modification
  time, so recent files are hashed again. ``default`` is the embedded SmolLM2 folder. A Hugging Face hub name
  cached locally -> ``hf:<repo>@<commit>`` (a hub snapshot is named by its commit, which pins every file, so
  nothing is hashed and a partly downloaded snapshot has the same identity as a complete one). Anything else (a
  served model's name, an unknown name) is the name itself, with a warning: the cache cannot see new weights
  behind an unchanged name.
* `llm_fingerprint(llm)`: the same for a loaded LLM backend (its ``fingerprint`` attribute when it has one; an
  OpenAI-compatible server's served model name, with a warning; else `model_fingerprint` of its name).
* a local index is identified by its manifest's content: `agentic_retriever.index.identity.index_identity`, on
  the retriever's side, which knows the index types.
* `stable_hash(obj)`: 32 hex digits of BLAKE2b over the canonical JSON of `obj` (`canonical_json`): the one
  content hash of the project (mining's stage stores, an HTTP LLM's stored replies, the loop's step keys, the
  demo's caches, s3's naive-RAG cache and the warm-started agents).
* `service_identity(url, health)`: a retrieval service by its ``GET /health`` document: its fingerprints when it
  reports them, else its URL and self-description, with a warning that a changed service behind the same URL
  and description is not noticed.

    model_fingerprint("runs/agent-sft")   # 'sha256:5f0c...' (stored in runs/agent-sft/.agentic_retriever_fingerprint.json)
    model_fingerprint("default")          # the embedded SmolLM2 folder's fingerprint
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .defaults import DEFAULT_LLM, cache_root, resolve_llm_name
from .jsonl import write_json

__all__ = ["MODEL_FILES", "RACY_SECONDS", "SIDECAR", "canonical_json", "llm_fingerprint", "model_fingerprint",
           "service_identity", "stable_hash"]

log = logging.getLogger(__name__)


def canonical_json(obj: Any) -> str:
    """`obj` as canonical JSON: sorted keys, no spaces, UTF-8 text as is; dataclasses as their fields."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_jsonable)


def stable_hash(obj: Any, digits: int = 32, algorithm: str = "blake2b") -> str:
    """`digits` hex digits of a hash of `canonical_json(obj)`: equal inputs, equal hashes, on every machine.

    BLAKE2b (its digest sized to `digits`) keys everything new; ``sha256`` (its first `digits`) keys the caches
    first written with it (s3's naive-RAG accuracies, the warm-started agents), so theirs stay valid."""
    text = canonical_json(obj).encode("utf-8")
    if algorithm == "blake2b":
        if digits % 2 or not 2 <= digits <= 128:
            raise ValueError(f"BLAKE2b gives an even number of hex digits from 2 to 128, not {digits}")
        return hashlib.blake2b(text, digest_size=digits // 2).hexdigest()
    if algorithm == "sha256":
        return hashlib.sha256(text).hexdigest()[:digits]
    raise ValueError(f"stable_hash knows blake2b and sha256, not {algorithm!r}")


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict
        return asdict(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"cannot hash a {type(obj).__name__}")


#: The sidecar file beside the weights that stores a folder's fingerprint.
SIDECAR = ".agentic_retriever_fingerprint.json"
#: Bump when what is hashed changes, so stored fingerprints are recomputed.
_VERSION = 1
#: Files modified less than this before their fingerprint was computed are hashed again on the next call.
RACY_SECONDS = 2.0
#: The files of a model folder that decide what the model computes (top level only, glob patterns).
MODEL_FILES = (
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json",
    "*.pt", "*.pth", "*.gguf", "*.h5", "*.msgpack", "adapter_config.json", "tokenizer.json", "tokenizer_config.json",
    "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
    "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
)
#: Files matching MODEL_FILES that are training leftovers, not the model.
_NOT_MODEL = ("training_args.bin", "optimizer.*", "scheduler.*", "rng_state*", "scaler.*")
_CHUNK = 8 << 20
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


# --------------------------------------------------------------------------------------------------- models


def model_fingerprint(path_or_name: str | os.PathLike) -> str:
    """The content fingerprint of a model folder, a weights file, ``default`` or a cached hub name (see module)."""
    name = str(path_or_name)
    path = Path(resolve_llm_name(name) if name == DEFAULT_LLM else name).expanduser()
    if path.is_dir() or path.is_file():
        return _folder_fingerprint(path.resolve())
    hub = _hub_snapshot(name)
    if hub is not None:
        return hub
    _warn_once(name, "model %r is neither a local folder nor a cached hub model: cache keys use its name, so new "
               "weights under the same name are not noticed (give them a new name)", name)
    return name


def llm_fingerprint(llm) -> str:
    """The content fingerprint of a loaded LLM backend (see module)."""
    own = getattr(llm, "fingerprint", None)
    if isinstance(own, str) and own:
        return own
    from .llm.openai import OpenAILLM

    if isinstance(llm, OpenAILLM):
        _warn_once(f"served:{llm.name}", "model %r is served over HTTP: cache keys use its served name, so a server "
                   "that serves new weights under the same name is not noticed (serve them under a new name)",
                   llm.name)
        return llm.name
    return model_fingerprint(llm.name)


def _model_files(folder: Path) -> list[Path]:
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")]
    chosen = [p for p in files if any(fnmatch.fnmatch(p.name, pattern) for pattern in MODEL_FILES)
              and not any(fnmatch.fnmatch(p.name, pattern) for pattern in _NOT_MODEL)]
    return chosen or files  # a folder of other files: all of them


def _stats(files: list[Path], root: Path) -> dict[str, list[int]]:
    out = {}
    for path in files:
        stat = path.stat()  # follows symlinks (hub snapshots link to their blobs)
        out[str(path.relative_to(root)) if path != root else path.name] = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    return out


def _hash(files: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update((str(path.relative_to(root)) if path != root else path.name).encode() + b"\0")
        digest.update(str(path.stat().st_size).encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _sidecars(target: Path) -> list[Path]:
    """Where the fingerprint of `target` is stored: beside it, else (unwritable) under the cache root."""
    beside = target / SIDECAR if target.is_dir() else target.with_name(f".{target.name}{SIDECAR}")
    fallback = cache_root() / "fingerprints" / f"{hashlib.sha256(str(target).encode()).hexdigest()[:24]}.json"
    return [beside, fallback]


def _folder_fingerprint(target: Path) -> str:
    files = _model_files(target) if target.is_dir() else [target]
    if not files:
        raise FileNotFoundError(f"{target} holds no files: not a model")
    stats = _stats(files, target)
    places = _sidecars(target)
    for place in places:
        stored = _read(place)
        if (stored and stored.get("version") == _VERSION and stored.get("files") == stats
                and all(mtime <= stored.get("hashed_at_ns", 0) - RACY_SECONDS * 1e9 for _, mtime, _ in stats.values())):
            return stored["fingerprint"]
    started = time.time_ns()
    log.info("hashing the model files of %s (once: the fingerprint is stored beside them)", target)
    fingerprint = _hash(files, target)
    if _stats(files, target) != stats:
        raise RuntimeError(f"the model files of {target} changed while they were hashed: try again once they are written")
    record = {"version": _VERSION, "fingerprint": fingerprint, "hashed_at_ns": started, "files": stats}
    for place in places:
        try:
            write_json(place, record)
            break
        except OSError as error:
            log.info("cannot store the fingerprint of %s in %s (%s)", target, place, error)
    return fingerprint


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _hub_snapshot(name: str) -> str | None:
    """``hf:<repo>@<commit>`` of a hub model cached locally (its ``main`` snapshot), else None."""
    if name.count("/") > 1 or name.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # an invalid repo id, or no huggingface_hub: not a hub model
        return None
    if not isinstance(found, str):
        return None
    return f"hf:{name}@{Path(found).parent.name}"


# ------------------------------------------------------------------------------------------------ services

#: Fields of a ``/health`` document that identify the service's content when it reports them.
_HEALTH_FINGERPRINTS = ("fingerprint", "model_fingerprint", "encoder_fingerprint", "index_fingerprint", "corpus_sha256")
#: Fields of a ``/health`` document that describe the service (not its load: uptime, stats).
_HEALTH_DESCRIPTION = ("backend", "index_type", "model", "composition", "index_size", "dim")


def service_identity(url: str, health: Mapping[str, Any] | None) -> dict:
    """What decides a retrieval service's results (see module), from its ``/health`` document (None: it has none)."""
    health = health if isinstance(health, Mapping) else {}
    described = {k: health[k] for k in _HEALTH_DESCRIPTION if k in health}
    reported = {k: health[k] for k in _HEALTH_FINGERPRINTS if health.get(k)}
    if reported:
        return {"kind": "service", **described, **reported}
    _warn_once(f"service:{url}", "the retrieval service %s reports no model fingerprint in /health: cache keys use "
               "its URL%s, so a service restarted with another index or encoder behind them is not noticed (use "
               "another mining folder)", url, " and self-description" if described else "")
    return {"kind": "service", "url": url, **described}
