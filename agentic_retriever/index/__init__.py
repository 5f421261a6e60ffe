"""Indexes: build and open dense (FAISS) and sparse (BM25) indexes behind one search API.

    from agentic_retriever.index import IndexBuildConfig, build_index, open_index
    build_index(IndexBuildConfig(corpus="corpus.jsonl", out="idx/minilm-flat"))
    index = open_index("idx/minilm-flat")
    index.search(["who wrote hamlet"], k=3)          # ids and scores
    index.retrieve(["who wrote hamlet"], k=3)        # passages with scores
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from agentic_retriever.base.corpus import Corpus
from agentic_retriever.base.defaults import DEFAULT_ENCODER
from agentic_retriever.base.encoder import Encoder, EncoderConfig
from .base import ScoredPassage, SearchIndex, SearchResult
from .dense import DenseIndex, DenseParams, build_dense_index, portable_config, same_structure
from .generations import remove_superseded
from .manifest import IndexManifest, IndexMismatchError
from .sparse import BM25Index, BM25Params, build_bm25_index

__all__ = [
    "BM25Params", "DenseParams", "IndexBuildConfig", "IndexManifest", "IndexMismatchError", "ScoredPassage",
    "SearchIndex", "SearchResult", "build_index", "open_index",
]

log = logging.getLogger(__name__)


@dataclass
class IndexBuildConfig:
    """Everything `agentic-retriever index build` needs (the ``index_build`` section of a config file)."""

    corpus: str = field(default="", metadata={"help": "corpus file (JSONL or parquet)",
                                              "derive": "{workdir}/data/corpus.jsonl"})
    out: str = field(default="", metadata={"help": "index folder to write (default: the shared retrieval index)",
                                           "derive": "{index}", "required": True})
    backend: Literal["dense", "bm25"] = field(default="dense", metadata={"help": "dense (FAISS) or bm25"})
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    dense: DenseParams = field(default_factory=DenseParams)
    bm25: BM25Params = field(default_factory=BM25Params)
    drop_empty: bool = field(default=False, metadata={
        "help": "leave passages with empty text out of the index (a build counts and logs them either way)"})
    corpus_cache: str | None = field(default=None, metadata={"help": "folder for the corpus Arrow cache"})


#: Empty passages named in the build's warning and manifest.
EMPTY_IDS_SHOWN = 5


def build_index(config: IndexBuildConfig) -> IndexManifest:
    """Build (or resume building) an index; an index already complete with the same inputs is kept (its
    manifest is pointed at the corpus and encoder given, and an earlier version's manifest gets portable paths)."""
    if not config.corpus or not config.out:
        raise ValueError("index build needs both a corpus file and an output folder")
    corpus = Corpus.open(config.corpus, config.corpus_cache)
    existing = _complete_manifest(config.out)
    empty = _empty_passages(corpus, config.drop_empty) if config.drop_empty else None
    wanted_dropped = empty[0]["dropped"] if empty else 0
    same_corpus = bool(existing) and existing.corpus_sha256 == corpus.sha256 and existing.dropped == wanted_dropped
    if config.backend == "bm25":
        if same_corpus and existing.params == dataclasses.asdict(config.bm25):
            return _reuse(existing, config.out, corpus)
        summary, drop_rows = empty or _empty_passages(corpus, False)
        return build_bm25_index(corpus, config.out, config.bm25, drop_rows, summary)
    encoder = Encoder(config.encoder)
    if (same_corpus and same_structure(existing.params, dataclasses.asdict(config.dense))
            and (existing.encoder or {}).get("fingerprint") == encoder.settings.fingerprint):
        return _reuse(existing, config.out, corpus, encoder)
    summary, drop_rows = empty or _empty_passages(corpus, False)
    return build_dense_index(corpus, encoder, config.out, config.dense, drop_rows, summary)


def _empty_passages(corpus: Corpus, drop: bool) -> tuple[dict, np.ndarray | None]:
    """Count (and log) the passages with empty text: the manifest's ``empty_passages``, and the rows to drop."""
    text_rows, both_rows = corpus.empty_rows()
    summary = {"empty_text": int(len(text_rows)), "empty_title_and_text": int(len(both_rows)),
               "first_ids": corpus.ids_at(text_rows[:EMPTY_IDS_SHOWN]) if len(text_rows) else [],
               "dropped": int(len(text_rows)) if drop else 0}
    if len(text_rows):
        log.warning("%s: %d of %d passages have empty text (%d of them an empty title too), ids %s%s; %s",
                    corpus.source, len(text_rows), len(corpus), len(both_rows), ", ".join(summary["first_ids"]),
                    ", ..." if len(text_rows) > EMPTY_IDS_SHOWN else "",
                    "they are left out of the index (drop_empty)" if drop
                    else "they are indexed as they are (drop_empty leaves them out)")
    return summary, (text_rows if drop and len(text_rows) else None)


def _reuse(existing: IndexManifest, out: str, corpus: Corpus, encoder: Encoder | None = None) -> IndexManifest:
    """Keep a complete index; point its manifest at this build's corpus and encoder when they moved (the same
    content: same sha256, same fingerprint), and write an earlier version's manifest with portable paths."""
    log.info("index %s is already built", out)
    if existing.data_dir is not None:  # what a build killed after its commit left (`generations`)
        remove_superseded(Path(out), keep=existing.data_dir)
    changed = existing.path_base is None
    if _where(existing.corpus_path) != _where(str(corpus.source)):
        existing.set_path("corpus_path", str(corpus.source))
        log.info("index %s now opens its corpus from %s (same content)", out, corpus.source)
        changed = True
    if encoder is not None:
        config = portable_config(encoder)
        stored = dict(existing.encoder.get("config") or {})
        if {**stored, "model": _where(stored.get("model"))} != {**config, "model": _where(config["model"])}:
            # the same weights from another folder (a moved or re-exported encoder): open it from there from now on
            existing.encoder["config"] = config
            existing.set_path("encoder.config.model", config["model"])
            existing.set_path("encoder.model", encoder.settings.model)
            log.info("index %s now opens its encoder from %s (same weights)", out, config["model"])
            changed = True
    if changed:
        existing.save(out)
    return existing


def _where(path: str | None) -> str | None:
    """An existing local path made absolute (so two spellings of one place compare equal); else as it is."""
    return os.path.abspath(path) if path and os.path.exists(path) else path


def _complete_manifest(index_dir: str) -> IndexManifest | None:
    try:
        return IndexManifest.load(index_dir)
    except FileNotFoundError:
        return None


def open_index(index_dir: str | Path, encoder: EncoderConfig | Encoder | None = None, corpus: str | None = None,
               corpus_cache: str | None = None, gpu: str | None = None, query_precision: str | None = None,
               **overrides) -> SearchIndex:
    """Open a built index, from any working directory. The encoder and corpus default to the ones in its
    manifest (found relative to the index folder; see `IndexManifest`); passing others that differ from the
    build's raises IndexMismatchError. `gpu` (auto, on, off; None: as the build's manifest says) places a dense
    index in host memory or sharded over the visible GPUs; a BM25 index is searched on the host whatever it says.
    `query_precision` (None: ``auto``, fp32 on a CPU) is the precision the manifest's encoder encodes queries in
    (`precision.Precision`; the service's is ``native``: bf16 where the CPU computes bf16 in hardware).
    `overrides` change other search-time parameters (ef_search, nprobe, mmap for dense; threads for bm25)."""
    manifest = IndexManifest.load(index_dir)
    corpus_file = corpus or manifest.require_path("corpus_path", index_dir, (
        "Put the corpus file back at one of those paths, open the index with its corpus given "
        "(open_index(DIR, corpus=FILE)), or run `agentic-retriever index build` for this folder with the corpus and "
        "the index's settings once: an index complete with the same corpus is not rebuilt, only its manifest is "
        "pointed at the file."))
    corpus_obj = Corpus.open(corpus_file, corpus_cache)
    manifest.check_corpus(corpus_obj.sha256, str(corpus_obj.source))
    if manifest.backend == "bm25":
        return BM25Index(index_dir, manifest, corpus_obj, overrides)
    if not isinstance(encoder, Encoder):
        encoder = Encoder(encoder) if encoder is not None else _manifest_encoder(manifest, index_dir, query_precision)
    return DenseIndex(index_dir, manifest, corpus_obj, encoder, {**overrides, **({"gpu": gpu} if gpu else {})})


def _manifest_encoder(manifest: IndexManifest, index_dir: str | Path, precision: str | None = None) -> Encoder:
    remedy = ("Put the encoder folder back at one of those paths, open the index with its encoder given "
              "(open_index(DIR, encoder=EncoderConfig(model=FOLDER))), or run `agentic-retriever index build` for "
              "this folder with --encoder.model FOLDER, its corpus and settings once: an index complete with the same "
              "weights is not rebuilt, only its manifest is pointed at the folder.")
    model = manifest.require_path("encoder.config.model", index_dir, remedy)
    try:
        config = EncoderConfig.from_dict((manifest.encoder or {})["config"])
        return Encoder(dataclasses.replace(config, precision=precision) if precision else config)
    except Exception as error:
        if manifest.path_base is not None or model == DEFAULT_ENCODER or os.path.exists(model):
            raise
        # an earlier version's manifest stores a relative folder as typed, which may look like a hub name
        raise FileNotFoundError(
            f"index {index_dir}: manifest field 'encoder.config.model' is {model!r}: no such folder relative to the "
            f"index folder or to the current directory (an index written by an earlier version stores the path "
            f"relative to the folder the build ran in), and loading it as a hub name failed "
            f"({type(error).__name__}: {error}). {remedy}") from error
