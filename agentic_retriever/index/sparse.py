"""Sparse BM25 indexes: bm25s (default, pure Python + numpy) and pyserini/Lucene (optional extra).

Defaults k1=0.9, b=0.4 with English stemming and stop words, as pyserini's BM25 that Search-R1 and
FlashRAG used as their sparse baseline. Passages are indexed as their Search-R1 ``contents`` (title
line and text). A build writes its ``bm25/`` (or ``lucene/``) and ``rows.npy`` into a new generation folder that
the manifest then names in one atomic switch (`generations`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from agentic_retriever.base.corpus import Corpus
from agentic_retriever.base.jsonl import atomic_write
from .base import SearchIndex, kept_rows, write_row_map
from .generations import BM25_DIR, LUCENE_COLLECTION_DIR, LUCENE_DIR, NewGeneration
from .manifest import IndexManifest


@dataclass
class BM25Params:
    engine: Literal["bm25s", "pyserini"] = dataclasses.field(default="bm25s", metadata={"help": "BM25 implementation"})
    k1: float = dataclasses.field(default=0.9, metadata={"help": "BM25 term-frequency saturation"})
    b: float = dataclasses.field(default=0.4, metadata={"help": "BM25 length normalisation"})
    stemmer: str | None = dataclasses.field(default="english", metadata={"help": "Snowball stemmer language, or none"})
    stopwords: str | None = dataclasses.field(default="en", metadata={"help": "stop-word list, or none"})
    threads: int = dataclasses.field(default=0, metadata={"help": "search threads (0 = one)"})


@contextlib.contextmanager
def _jax_hidden():
    """Make ``import jax.lax`` fail while bm25s is imported. bm25s's top-k module imports JAX when it can and runs a
    JAX op at import, and JAX then reserves most of a GPU in the process (three quarters by default, seen at 105
    GiB on one H200): a BM25 search must stay on the CPU. JAX modules already imported are put back afterwards."""
    saved = {name: sys.modules.get(name) for name in ("jax", "jax.lax")}
    if saved["jax"] is None:
        sys.modules["jax"] = None  # type: ignore[assignment]  # None in sys.modules: the import raises ImportError
    sys.modules["jax.lax"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _bm25s():
    """bm25s, imported with JAX hidden (`_jax_hidden`) unless an earlier import already loaded it; its searches
    choose the numpy top-k explicitly (`BM25Index.search_rows`) either way."""
    if "bm25s" not in sys.modules:
        with _jax_hidden():
            import bm25s  # noqa: F401
    return sys.modules["bm25s"]


def _tokenizer(params: BM25Params):
    import Stemmer

    Tokenizer = _bm25s().tokenization.Tokenizer

    stemmer = Stemmer.Stemmer(params.stemmer) if params.stemmer else None
    return Tokenizer(stemmer=stemmer, stopwords=params.stopwords or [])


def build_bm25_index(corpus: Corpus, out_dir: str | Path, params: BM25Params, drop_rows: np.ndarray | None = None,
                     empty_passages: dict | None = None) -> IndexManifest:
    """Tokenise the corpus in a stream and build a BM25 index in `out_dir`, leaving out `drop_rows` (ascending
    corpus rows; ``rows.npy`` then maps bm25s document numbers to corpus rows, Lucene's doc ids are the rows).
    The index is written into a new generation folder and committed with the manifest (`generations`)."""
    started = time.perf_counter()
    keep, rows = kept_rows(corpus, drop_rows)
    with NewGeneration(out_dir) as generation:
        if params.engine == "pyserini":
            _build_lucene(corpus, generation.path / LUCENE_DIR, params, keep)
        else:
            _build_bm25s(corpus, generation.path / BM25_DIR, params, keep, rows)
            write_row_map(generation.path, keep)
        manifest = IndexManifest(
            backend="bm25", index_type=params.engine, rows=rows, corpus_path=str(corpus.source),
            corpus_sha256=corpus.sha256, params=dataclasses.asdict(params),
            build_seconds=round(time.perf_counter() - started, 2), empty_passages=empty_passages,
        )
        generation.commit(manifest)
    return manifest


def _build_bm25s(corpus: Corpus, bm25_dir: Path, params: BM25Params, keep: np.ndarray | None, rows: int) -> None:
    """Tokenise the `keep` rows of the corpus (`rows` of them) in a stream and save a bm25s index and its
    vocabulary in `bm25_dir`."""
    tokenizer = _tokenizer(params)
    ids = tokenizer.tokenize(_kept_contents(corpus, keep), update_vocab=True, return_as="ids", length=rows,
                             show_progress=True)
    retriever = _bm25s().BM25(k1=params.k1, b=params.b)
    retriever.index(tokenizer.to_tokenized_tuple(ids), show_progress=True)
    retriever.save(str(bm25_dir), show_progress=False)
    tokenizer.save_vocab(str(bm25_dir))


def _kept_contents(corpus: Corpus, keep: np.ndarray | None):
    """The Search-R1 contents of the rows kept (all rows without `keep`), in row order, as a stream."""
    row = 0
    for batch in corpus.iter_contents():
        for text in batch:
            if keep is None or keep[row]:
                yield text
            row += 1


class BM25Index(SearchIndex):
    """BM25 over the corpus; questions and histories are ignored (the query is searched as written)."""

    def __init__(self, index_dir: str | Path, manifest: IndexManifest, corpus: Corpus, overrides: dict | None = None):
        # Lucene's doc ids are corpus rows already; bm25s numbers the indexed documents
        super().__init__(manifest, corpus, index_dir, positions_are_rows=manifest.index_type == "pyserini")
        self.params = BM25Params(**{**manifest.params, **(overrides or {})})
        data = manifest.data_folder(index_dir)
        if self.params.engine == "pyserini":
            self._searcher = _lucene_searcher(data / LUCENE_DIR, self.params)
        else:
            self._retriever = _bm25s().BM25.load(str(data / BM25_DIR), mmap=True, show_progress=False)
            self._tokenizer = _tokenizer(self.params)
            self._tokenizer.load_vocab(str(data / BM25_DIR))

    def search_rows(self, queries: Sequence[str], k: int, questions=None, histories=None) -> tuple[np.ndarray, np.ndarray]:
        if self.params.engine == "pyserini":
            return self._search_lucene(queries, k)
        ids = self._tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        rows, scores = self._retriever.retrieve(self._tokenizer.to_tokenized_tuple(ids), k=k, show_progress=False,
                                                n_threads=self.params.threads, backend_selection="numpy")
        return scores.astype(np.float32), rows.astype(np.int64)

    def _search_lucene(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        keys = [str(i) for i in range(len(queries))]
        hits = self._searcher.batch_search(list(queries), keys, k=k, threads=max(1, self.params.threads))
        scores = np.zeros((len(queries), k), dtype=np.float32)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        for i, key in enumerate(keys):
            for j, hit in enumerate(hits[key][:k]):
                rows[i, j], scores[i, j] = int(hit.docid), hit.score
        return scores, rows


def _import_pyserini():
    try:
        import pyserini  # noqa: F401
    except ImportError as error:
        raise ImportError("the pyserini BM25 engine needs the extra: pip install 'agentic-retriever[pyserini]' "
                          "(and Java 21)") from error


def _build_lucene(corpus: Corpus, lucene_dir: Path, params: BM25Params, keep: np.ndarray | None = None) -> None:
    """Write the corpus (its `keep` rows) as a pyserini JsonCollection (doc id = row number) and run pyserini's
    indexer."""
    _import_pyserini()
    collection = lucene_dir.parent / LUCENE_COLLECTION_DIR
    collection.mkdir(parents=True, exist_ok=True)
    with atomic_write(collection / "docs.jsonl") as handle:
        row = 0
        for batch in corpus.iter_contents():
            for contents in batch:
                if keep is None or keep[row]:
                    handle.write(json.dumps({"id": str(row), "contents": contents}) + "\n")
                row += 1
    subprocess.run([sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
                    "--input", str(collection), "--index", str(lucene_dir), "--generator", "DefaultLuceneDocumentGenerator",
                    "--threads", str(max(1, params.threads)), "--storeRaw"], check=True)


def _lucene_searcher(lucene_dir: Path, params: BM25Params):
    _import_pyserini()
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(lucene_dir))
    searcher.set_bm25(params.k1, params.b)
    return searcher
