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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..corpus import Corpus
from ..encoder import Encoder, EncoderConfig
from .base import ScoredPassage, SearchIndex, SearchResult
from .dense import DenseIndex, DenseParams, build_dense_index, portable_config, same_structure
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
    corpus_cache: str | None = field(default=None, metadata={"help": "folder for the corpus Arrow cache"})


def build_index(config: IndexBuildConfig) -> IndexManifest:
    """Build (or resume building) an index; an index already complete with the same inputs is kept."""
    if not config.corpus or not config.out:
        raise ValueError("index build needs both a corpus file and an output folder")
    corpus = Corpus.open(config.corpus, config.corpus_cache)
    existing = _complete_manifest(config.out)
    if config.backend == "bm25":
        if existing and existing.corpus_sha256 == corpus.sha256 and existing.params == dataclasses.asdict(config.bm25):
            log.info("index %s is already built", config.out)
            return existing
        return build_bm25_index(corpus, config.out, config.bm25)
    encoder = Encoder(config.encoder)
    if (existing and existing.corpus_sha256 == corpus.sha256 and same_structure(existing.params, dataclasses.asdict(config.dense))
            and (existing.encoder or {}).get("fingerprint") == encoder.settings.fingerprint):
        log.info("index %s is already built", config.out)
        if existing.encoder.get("config") != portable_config(encoder):
            # the same weights from another folder (a moved or re-exported encoder): open it from there from now on
            existing.encoder["config"] = portable_config(encoder)
            existing.save(config.out)
            log.info("index %s now opens its encoder from %s (same weights)", config.out, config.encoder.model)
        return existing
    return build_dense_index(corpus, encoder, config.out, config.dense)


def _complete_manifest(index_dir: str) -> IndexManifest | None:
    try:
        return IndexManifest.load(index_dir)
    except FileNotFoundError:
        return None


def open_index(index_dir: str | Path, encoder: EncoderConfig | Encoder | None = None, corpus: str | None = None,
               corpus_cache: str | None = None, **overrides) -> SearchIndex:
    """Open a built index. The encoder and corpus default to the ones in its manifest; passing others
    that differ from the build's raises IndexMismatchError. `overrides` change search-time parameters
    (ef_search, nprobe, gpu, mmap for dense; threads for bm25)."""
    manifest = IndexManifest.load(index_dir)
    corpus_obj = Corpus.open(corpus or manifest.corpus_path, corpus_cache)
    manifest.check_corpus(corpus_obj.sha256, str(corpus_obj.source))
    if manifest.backend == "bm25":
        return BM25Index(index_dir, manifest, corpus_obj, overrides)
    if not isinstance(encoder, Encoder):
        encoder = Encoder(encoder or EncoderConfig.from_dict((manifest.encoder or {})["config"]))
    return DenseIndex(index_dir, manifest, corpus_obj, encoder, overrides)
