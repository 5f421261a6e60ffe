"""One search API for every backend: a batch of queries -> ids and scores (FAISS-style small surface)."""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentic_retriever.base.corpus import Corpus, ScoredPassage
from .generations import ROW_MAP_FILE
from .manifest import IndexManifest


def write_row_map(data_folder: Path, keep: np.ndarray | None) -> None:
    """Write ``rows.npy`` (the corpus row of each index position) into a build's new generation folder when rows were
    left out (`keep` not None)."""
    if keep is not None:
        np.save(data_folder / ROW_MAP_FILE, np.flatnonzero(keep).astype(np.int64))


@dataclass
class SearchResult:
    """Per query, the ids and scores of the hits, best first (ragged: an index may return fewer than k)."""

    ids: list[list[str]]
    scores: list[list[float]]
    rows: list[np.ndarray]


class SearchIndex(abc.ABC):
    """Base of the dense and sparse indexes. Subclasses implement `search_rows` only."""

    #: where the index is searched: ``cpu`` (host memory), or the GPUs a dense index was sharded over
    device: str = "cpu"
    #: where queries are encoded (a dense index's encoder device); None for an index without an encoder
    query_device: str | None = None

    def __init__(self, manifest: IndexManifest, corpus: Corpus, index_dir: str | Path | None = None,
                 positions_are_rows: bool = False):
        """`index_dir`'s data folder (`IndexManifest.data_folder`) holds ``rows.npy`` when passages were left out of
        the index, unless the index's own positions are corpus rows anyway (`positions_are_rows`)."""
        self.manifest = manifest
        self.corpus = corpus
        self.index_dir = os.path.abspath(index_dir) if index_dir is not None else None
        self._row_map = None
        if manifest.dropped and not positions_are_rows:
            if index_dir is None:
                raise ValueError("an index that left passages out needs its folder (for rows.npy)")
            self._row_map = np.load(manifest.data_folder(index_dir) / ROW_MAP_FILE, mmap_mode="r")

    def __len__(self) -> int:
        return self.manifest.rows

    @property
    def composition(self) -> str:
        """The query composition the index's encoder expects (``query`` for sparse indexes)."""
        return self.manifest.composition

    @abc.abstractmethod
    def search_rows(self, queries: Sequence[str], k: int, questions: Sequence[str | None] | None = None,
                    histories: Sequence[Sequence[str] | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) arrays of shape (len(queries), k'); rows are index positions (the corpus rows unless
        passages were left out of the index), -1 marks an empty slot."""

    def search(self, queries: Sequence[str], k: int, questions: Sequence[str | None] | None = None,
               histories: Sequence[Sequence[str] | None] | None = None) -> SearchResult:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if not queries:
            return SearchResult([], [], [])
        scores, rows = self.search_rows(list(queries), min(k, len(self)), questions, histories)
        if self._row_map is not None:
            rows = np.where(rows >= 0, self._row_map[np.maximum(rows, 0)], -1)
        kept = [r[r >= 0] for r in rows]
        ids_flat = self.corpus.ids_at(np.concatenate(kept)) if sum(len(r) for r in kept) else []
        ids, start = [], 0
        for r in kept:
            ids.append(ids_flat[start:start + len(r)])
            start += len(r)
        return SearchResult(ids, [s[r >= 0].astype(float).tolist() for s, r in zip(scores, rows)], kept)

    def retrieve(self, queries: Sequence[str], k: int, questions: Sequence[str | None] | None = None,
                 histories: Sequence[Sequence[str] | None] | None = None) -> list[list[ScoredPassage]]:
        """Search and fetch the passages (what an agent's search tool returns)."""
        result = self.search(queries, k, questions, histories)
        flat_rows = np.concatenate(result.rows) if result.rows else np.zeros(0, dtype=np.int64)
        passages = self.corpus.passages_at(flat_rows) if len(flat_rows) else []
        out, start = [], 0
        for scores in result.scores:
            chunk = passages[start:start + len(scores)]
            out.append([ScoredPassage(p.id, p.title, p.text, s) for p, s in zip(chunk, scores)])
            start += len(scores)
        return out


def kept_rows(corpus: Corpus, drop_rows) -> tuple[np.ndarray | None, int]:
    """(mask of the corpus rows an index keeps, or None for all; how many it keeps) when `drop_rows` (corpus rows,
    e.g. the empty passages) are left out; an error when none is left."""
    keep = None
    if drop_rows is not None and len(drop_rows):
        keep = np.ones(len(corpus), dtype=bool)
        keep[drop_rows] = False
    rows = len(corpus) if keep is None else int(keep.sum())
    if rows == 0:
        raise ValueError(f"no passage of {corpus.source} is left to index: all {len(corpus)} have empty text")
    return keep, rows
