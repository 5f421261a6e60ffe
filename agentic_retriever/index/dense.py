"""Dense FAISS indexes (Flat inner product, HNSW, IVF-PQ), built from a resumable embedding stream.

Build: the corpus is encoded chunk by chunk into ``embeddings-<corpus>-<encoder>.npy`` (a memmap) and a
small state file beside it records how many rows are done, so a killed build resumes at the last finished
chunk (by default a tenth of the corpus, 256 to 16,384 passages: every corpus gets resume points). FAISS is
then filled from the memmap (in chunks; Flat in one add of the file-backed memmap): peak memory is the FAISS
index plus one chunk, whatever the corpus size. The FAISS file goes into the build's own generation folder, which
the manifest then names in one atomic switch (`generations`). Search on GPUs (with faiss-gpu)
shards the index over all visible GPUs in fp16, as Search-R1's server does for the 64.6 GB fp32 wiki-18
Flat index.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm.auto import tqdm

from agentic_retriever.base.corpus import Corpus
from agentic_retriever.base.encoder import Encoder
from agentic_retriever.base.jsonl import naming_disk_full, read_json, reserve_disk, write_json
from agentic_retriever.base.writer_lock import WriterLock, lock_beside
from .base import SearchIndex, kept_rows, write_row_map
from .generations import FAISS_FILE, NewGeneration
from .manifest import IndexManifest

log = logging.getLogger(__name__)

_PROGRESS_STEP = 1024  # passages per encode call inside a chunk (progress-bar granularity)
MIN_AUTO_CHUNK, MAX_AUTO_CHUNK = 256, 16_384  # bounds of the default chunk, a tenth of the corpus


@dataclass
class DenseParams:
    """FAISS index choice and its knobs; search-time knobs (ef_search, nprobe, gpu) can change at open."""

    type: Literal["flat", "hnsw", "ivfpq"] = dataclasses.field(default="flat", metadata={"help": "FAISS index type"})
    hnsw_m: int = dataclasses.field(default=64, metadata={"help": "HNSW neighbours per node (Search-R1 compared HNSW64)"})
    ef_construction: int = dataclasses.field(default=200, metadata={"help": "HNSW build beam"})
    ef_search: int = dataclasses.field(default=128, metadata={"help": "HNSW search beam"})
    nlist: int = dataclasses.field(default=4096, metadata={"help": "IVF cells (clamped to corpus/39)"})
    pq_m: int = dataclasses.field(default=64, metadata={"help": "PQ sub-quantisers (must divide the dimension)"})
    pq_nbits: int = dataclasses.field(default=8, metadata={"help": "bits per PQ code"})
    nprobe: int = dataclasses.field(default=64, metadata={"help": "IVF cells visited per query"})
    train_size: int = dataclasses.field(default=262_144, metadata={"help": "vectors sampled to train IVF-PQ"})
    chunk_size: int | None = dataclasses.field(
        default=None, metadata={"help": "passages encoded per resumable chunk (default: a tenth of the corpus, "
                                        "at least 256 and at most 16,384)"})
    keep_embeddings: bool = dataclasses.field(default=False, metadata={"help": "keep the passage embeddings after the build"})
    embeddings_dir: str | None = dataclasses.field(
        default=None, metadata={"help": "where passage embeddings are streamed (default: the index folder); "
                                        "indexes of several types sharing it encode the corpus once"})
    gpu: Literal["auto", "on", "off"] = dataclasses.field(default="auto", metadata={"help": "search on GPUs with faiss-gpu"})
    mmap: bool = dataclasses.field(default=False, metadata={"help": "memory-map a Flat index instead of loading it"})


#: The fields that decide what a built index contains; the others only change how it is built or searched.
#: The build parameters that shape each index type (search-time knobs and the other types' fields do not).
STRUCTURE_FIELDS = {"flat": (), "hnsw": ("hnsw_m", "ef_construction"), "ivfpq": ("nlist", "pq_m", "pq_nbits", "train_size")}


def same_structure(a: dict, b: dict) -> bool:
    """Whether two parameter sets build the same index: the same type and that type's structural fields (a Flat
    index built with ``hnsw_m`` 32 in its settings is the Flat index built with 64)."""
    return a.get("type") == b.get("type") and all(a.get(f) == b.get(f) for f in STRUCTURE_FIELDS.get(a.get("type"), ()))


#: FAISS 1.15's default ``distance_compute_blas_threshold``: exact search (Flat, IVF's coarse quantizer) takes the
#: BLAS path from nq x d = 128,000 (334 queries of 768 dimensions), a crossover tuned on many-core servers.
FAISS_DEFAULT_BLAS_THRESHOLD = 128_000
#: The crossover per OpenMP thread measured by FAISS's own sweep (facebookresearch/faiss#5109: BLAS wins from
#: nq x d of about 640-1,280 with one thread, 25-64K with twenty) and here: on 2 cores, BLAS is 0.7x the
#: sequential kernel at nq x d = 1,536 and 1.4-1.9x at 3,072 (RESULTS.md, "Exact search in batches").
BLAS_THRESHOLD_PER_THREAD = 800


def import_faiss():
    """The faiss module, with exact search's BLAS crossover scaled to its OpenMP threads (`tune_blas_threshold`)."""
    try:
        import faiss
    except ImportError as error:
        raise ImportError("FAISS is not installed: pip install 'agentic-retriever[faiss-cpu]' "
                          "(or '[faiss-gpu]' on a CUDA machine)") from error
    tune_blas_threshold(faiss)
    return faiss


def tune_blas_threshold(faiss) -> None:
    """Set ``faiss.cvar.distance_compute_blas_threshold`` (process-wide) to `BLAS_THRESHOLD_PER_THREAD` x FAISS's
    OpenMP threads when it holds FAISS 1.15's default, which keeps batches of up to 333 queries of 768 dimensions
    on the sequential kernel: on 2 cores that costs 4.7x at 32 queries over 10k passages and 12x at 64 queries
    over 1M. Any other value is left as it is: a user's own, or an older FAISS's (which counts queries, not
    query x dimension, and already takes BLAS from 20 queries)."""
    if faiss.cvar.distance_compute_blas_threshold == FAISS_DEFAULT_BLAS_THRESHOLD:
        faiss.cvar.distance_compute_blas_threshold = BLAS_THRESHOLD_PER_THREAD * faiss.omp_get_max_threads()


def chunk_rows(params: DenseParams, rows: int) -> int:
    """Passages per resumable chunk: `params.chunk_size`, or by default a tenth of the corpus within
    [256, 16,384], so a killed build of any corpus resumes past its start."""
    if params.chunk_size is not None:
        if params.chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {params.chunk_size}")
        return params.chunk_size
    return min(MAX_AUTO_CHUNK, max(MIN_AUTO_CHUNK, math.ceil(rows / 10)))


def build_dense_index(corpus: Corpus, encoder: Encoder, out_dir: str | Path, params: DenseParams,
                      drop_rows: np.ndarray | None = None, empty_passages: dict | None = None) -> IndexManifest:
    """Encode `corpus` with `encoder` into a FAISS index in `out_dir`, resuming an interrupted build.

    `drop_rows` (ascending corpus rows) are left out of the index; the corpus is still encoded whole (the
    embeddings file stays shareable between indexes) and ``rows.npy`` maps index positions to corpus rows.
    ``index.faiss`` and ``rows.npy`` are written into a new generation folder and committed with the manifest
    (`generations`): the folder opens as the old index until the new one is complete. One build at a time writes
    an embeddings file (``NAME.npy.lock`` beside it): a second is refused with WriterLockedError."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    chunk = chunk_rows(params, len(corpus))
    log.info("encoding %d passages in resumable chunks of %d", len(corpus), chunk)
    half = half_precision(encoder.weights_dtype)
    embeddings_path = (Path(params.embeddings_dir or out)
                       / f"embeddings-{corpus.sha256[:12]}-{encoder.settings.fingerprint[:12]}{half and '-' + half}.npy")
    lock = WriterLock(lock_beside(embeddings_path), f"the passage embeddings {embeddings_path}").acquire()
    try:  # the embeddings' one writer until they are in the index (and removed, unless kept)
        try:
            embeddings = _encode_resumable(corpus, encoder, embeddings_path, chunk)
        finally:
            encoder.close()  # several devices: their processes end with the encoding
        keep, rows = kept_rows(corpus, drop_rows)
        faiss = import_faiss()
        index = fill_faiss_index(params, embeddings, chunk, keep)
        with NewGeneration(out) as generation:
            faiss.write_index(index, str(generation.path / FAISS_FILE))
            write_row_map(generation.path, keep)
            manifest = IndexManifest(
                backend="dense", index_type=params.type, rows=rows, corpus_path=str(corpus.source),
                corpus_sha256=corpus.sha256, params=dataclasses.asdict(params),
                encoder=dataclasses.asdict(encoder.settings) | {"config": portable_config(encoder),
                                                                "dtype": encoder.weights_dtype}, dim=encoder.dim,
                build_seconds=round(time.perf_counter() - started, 2), empty_passages=empty_passages,
            )
            generation.commit(manifest)
        del embeddings
        if not params.keep_embeddings:
            embeddings_path.unlink(missing_ok=True)
            _state_path(embeddings_path).unlink(missing_ok=True)
            lock.remove()
    finally:
        lock.release()
    return manifest


def portable_config(encoder: Encoder) -> dict:
    """The encoder config minus machine-specific fields, enough to load the same encoder again."""
    return {k: v for k, v in dataclasses.asdict(encoder.config).items() if k not in encoder.config.MACHINE_FIELDS}


def half_precision(dtype: str | None) -> str:
    """`dtype` when passages were encoded in a half precision (bf16 on an AMX CPU, fp16 on a GPU), else "": it keys
    the embeddings cache and the index identity, so fp32 and half-precision embeddings are never mixed, while
    caches and identities made in fp32 (before the dtype was recorded) stay valid."""
    return dtype if dtype not in (None, "float32") else ""


def _state_path(embeddings_path: Path) -> Path:
    return embeddings_path.with_suffix(".state.json")


def _encode_resumable(corpus: Corpus, encoder: Encoder, path: Path, chunk_size: int) -> np.ndarray:
    """Stream passage embeddings into a memmap at `path`; its state file says how many rows are final. The file's
    blocks are reserved before the first row is written (`reserve_disk`): a memmap write to a sparse file on a full
    disk is a SIGBUS that kills the process without a word, a reservation is an error naming the file."""
    state_path = _state_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    identity = {"encoder_fingerprint": encoder.settings.fingerprint, "corpus_sha256": corpus.sha256,
                "rows": len(corpus), "dim": encoder.dim}
    if half_precision(encoder.weights_dtype):
        identity["dtype"] = encoder.weights_dtype
    state = read_json(state_path) if state_path.is_file() else {}
    if state and {k: state.get(k) for k in identity} == identity and path.is_file():
        embeddings = np.load(path, mmap_mode="r+")
        done = int(state["rows_done"])
        log.info("resuming %s at row %d of %d", path, done, len(corpus))
        reserve_disk(path)  # a file of an earlier version may be sparse
    else:
        with naming_disk_full(path):
            embeddings = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                                   shape=(len(corpus), encoder.dim))
        done = 0
        reserve_disk(path)
        write_json(state_path, identity | {"rows_done": 0})
    # several devices: calls big enough to keep each process busy (the pool cuts a call into chunks for them)
    step = max(_PROGRESS_STEP, 16 * encoder.config.batch_size * len(encoder.passage_devices))
    with tqdm(total=len(corpus), initial=done, desc="encoding passages", unit=" passages") as progress:
        for start in range(done, len(corpus), chunk_size):
            stop = min(start + chunk_size, len(corpus))
            row = start
            for texts in corpus.iter_contents(start, stop, batch_size=step):
                embeddings[row:row + len(texts)] = encoder.encode_passages(texts)
                row += len(texts)
                progress.update(len(texts))
            embeddings.flush()
            write_json(state_path, identity | {"rows_done": stop})
    return embeddings


def fill_faiss_index(params: DenseParams, embeddings: np.ndarray, chunk: int, keep: np.ndarray | None = None):
    """A new FAISS index of `params.type` trained (IVF-PQ: on `params.train_size` evenly spaced rows) and filled with
    the rows of `embeddings` (an array or a memmap) that `keep` marks (None: all), `chunk` rows per add.
    What every dense build runs once its embeddings are written; `benchmarks/bench_scale.py` times it alone."""
    faiss = import_faiss()
    rows = len(embeddings) if keep is None else int(keep.sum())
    index = _new_faiss_index(faiss, params, embeddings.shape[1], rows)
    if not index.is_trained:
        index.train(_training_sample(embeddings, params.train_size, keep))
    if params.type == "flat":
        # A Flat index stores the vectors as they are: one add of the whole (contiguous, file-backed) memmap sizes
        # its storage once, where chunked adds would grow it geometrically and briefly hold old and new copies.
        # Dropped rows are then removed in place (the others keep their order).
        index.add(np.ascontiguousarray(embeddings))
        if keep is not None:
            index.remove_ids(np.flatnonzero(~keep).astype(np.int64))
    else:
        for start in tqdm(range(0, len(embeddings), chunk), desc=f"adding to {params.type}", unit=" chunks"):
            part = embeddings[start:start + chunk]
            index.add(np.ascontiguousarray(part if keep is None else part[keep[start:start + chunk]]))
    return index


def set_search_knobs(index, params: DenseParams) -> None:
    """Apply the search-time knobs of `params` to a CPU FAISS index: HNSW's ``ef_search``, IVF's ``nprobe``."""
    if params.type == "hnsw":
        index.hnsw.efSearch = params.ef_search
    elif params.type == "ivfpq":
        import_faiss().extract_index_ivf(index).nprobe = params.nprobe


def _new_faiss_index(faiss, params: DenseParams, dim: int, rows: int):
    if params.type == "flat":
        return faiss.IndexFlatIP(dim)
    if params.type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params.ef_construction
        return index
    if params.type == "ivfpq":
        if dim % params.pq_m:
            raise ValueError(f"pq_m={params.pq_m} must divide the embedding dimension {dim}")
        nlist = max(1, min(params.nlist, rows // 39))
        return faiss.index_factory(dim, f"IVF{nlist},PQ{params.pq_m}x{params.pq_nbits}", faiss.METRIC_INNER_PRODUCT)
    raise ValueError(f"unknown dense index type {params.type!r}; choose flat, hnsw or ivfpq")


def _training_sample(embeddings: np.ndarray, size: int, keep: np.ndarray | None = None) -> np.ndarray:
    """Evenly spaced rows among the indexed ones (deterministic, and reads the memmap in order)."""
    rows = np.arange(len(embeddings)) if keep is None else np.flatnonzero(keep)
    picks = np.linspace(0, len(rows) - 1, num=min(size, len(rows))).astype(np.int64)
    return np.ascontiguousarray(embeddings[rows[np.unique(picks)]])


class DenseIndex(SearchIndex):
    """A FAISS index plus the encoder that produced it; queries are composed as the encoder dictates."""

    def __init__(self, index_dir: str | Path, manifest: IndexManifest, corpus: Corpus, encoder: Encoder,
                 overrides: dict | None = None):
        super().__init__(manifest, corpus, index_dir)
        faiss = import_faiss()
        manifest.check_encoder(encoder.settings.fingerprint, encoder.settings.model)
        self.encoder = encoder
        self.query_device = str(encoder.model.device)
        self.params = DenseParams(**{**manifest.params, **(overrides or {})})
        flags = faiss.IO_FLAG_MMAP if self.params.mmap else 0
        self.index = faiss.read_index(str(manifest.data_folder(index_dir) / FAISS_FILE), flags)
        self.device = "cpu"
        set_search_knobs(self.index, self.params)
        gpu_index = _to_all_gpus(faiss, self.index, self.params)
        if gpu_index is not None:
            self.index, self.device = gpu_index, f"{faiss.get_num_gpus()} GPU(s), fp16, sharded"

    def search_rows(self, queries: Sequence[str], k: int, questions=None, histories=None) -> tuple[np.ndarray, np.ndarray]:
        vectors = self.encoder.encode_queries(queries, questions, histories)
        scores, rows = self.index.search(vectors, k)
        return scores, rows


def _to_all_gpus(faiss, index, params: DenseParams):
    """Shard `index` over all visible GPUs in fp16, or None when it stays on the CPU."""
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    supported = params.type in ("flat", "ivfpq")
    if params.gpu == "off" or (params.gpu == "auto" and (gpus == 0 or not supported)):
        return None
    if gpus == 0:
        raise RuntimeError("gpu=on but FAISS sees no GPU: install 'agentic-retriever[faiss-gpu]' on a CUDA machine")
    if not supported:
        raise ValueError(f"FAISS cannot search a {params.type} index on GPU; use flat or ivfpq, or gpu=off")
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True
    options.useFloat16 = True
    return faiss.index_cpu_to_all_gpus(index, co=options)
