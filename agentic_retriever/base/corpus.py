"""Passage corpus: JSONL, parquet or DPR's TSV, read through a memory-mapped Arrow copy.

Accepted rows (docs/data-formats.md, "Corpus"):

* Search-R1 / FlashRAG: ``{"id": "0", "contents": "\\"Title\\"\\ntext"}``
* ``{"id": "0", "title": "Title", "text": "text"}``, or BEIR's ``{"_id": "0", "title": "Title", "text": "text"}``
* DPR's ``psgs_w100.tsv`` (a ``.tsv`` file): a header naming ``id``, ``text`` and ``title``, then one
  tab-separated, CSV-quoted row per passage, as DPR writes and reads it (``csv`` with a tab delimiter)

The first open converts the file once, streaming, into an Arrow IPC file in the cache folder (default
``~/.cache/agentic_retriever/corpus``, or ``$AGENTIC_RETRIEVER_CACHE``). Later opens memory-map it: a
21M-passage corpus costs no Python object per row. Ids that are the row numbers ("0", "1", ...; the
wiki-18 dump) are looked up arithmetically; other ids through a sorted 64-bit hash array, also
memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from .jsonl import DataFormatError, atomic_write, read_json, write_json

_SCHEMA = pa.schema([("id", pa.string()), ("title", pa.string()), ("text", pa.string())])
_BATCH_ROWS = 50_000
_FORMAT_VERSION = "1"


@dataclass(frozen=True)
class Passage:
    """One corpus passage; `contents` is the Search-R1 rendering ``"Title"\\ntext``."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class ScoredPassage(Passage):
    """A retrieved passage with its retrieval score (what indexes return and retrieval clients hand agents)."""

    score: float = 0.0


def split_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1 ``contents`` into (title, text): the first line, minus one pair of quotes, is the title."""
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def hash_ids(ids: Sequence[str]) -> np.ndarray:
    """Stable 64-bit hashes of string ids (blake2b), used for the id -> row lookup."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(i.encode("utf-8"), digest_size=8).digest(), "little") for i in ids),
        dtype=np.uint64,
        count=len(ids),
    )


def default_cache_dir() -> Path:
    root = os.environ.get("AGENTIC_RETRIEVER_CACHE") or Path.home() / ".cache" / "agentic_retriever"
    return Path(root) / "corpus"


class Corpus:
    """A read-only, memory-mapped passage collection with id -> passage and row -> passage lookup."""

    def __init__(self, source: Path, arrow_path: Path):
        self.source = source
        self._table = pa.ipc.open_file(pa.memory_map(str(arrow_path), "r")).read_all()
        self._batches = self._table.to_batches()
        #: The first row of each record batch, and the row count after the last: where `_take` looks rows up.
        self._batch_starts = np.cumsum([0] + [batch.num_rows for batch in self._batches])
        meta = read_json(_sidecar(arrow_path, "meta", ".json"))
        self.sha256: str = meta["content_sha256"]
        self._ids_are_rows: bool = meta["ids_are_row_numbers"]
        self._id_hash = self._id_order = None
        if not self._ids_are_rows:
            self._id_hash = np.load(_sidecar(arrow_path, "idhash"), mmap_mode="r")
            self._id_order = np.load(_sidecar(arrow_path, "idorder"), mmap_mode="r")

    @classmethod
    def open(cls, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Corpus:
        """Open a corpus file, converting it into the Arrow cache on first use."""
        source = Path(path).resolve()
        if not source.is_file():
            raise FileNotFoundError(f"corpus file not found: {source}")
        stat = source.stat()
        key = hashlib.sha256(f"{_FORMAT_VERSION}|{source}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:20]
        arrow_path = Path(cache_dir or default_cache_dir()) / f"{source.stem}-{key}.arrow"
        if not _sidecar(arrow_path, "meta", ".json").exists():  # written last: marks a complete conversion
            _convert(source, arrow_path)
        return cls(source, arrow_path)

    def __len__(self) -> int:
        return self._table.num_rows

    @property
    def titles(self) -> pa.ChunkedArray:
        return self._table.column("title")

    @property
    def id_column(self) -> pa.ChunkedArray:
        return self._table.column("id")

    def ids_at(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        return self._take(rows, ("id",))[0]

    def titles_at(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        return self._take(rows, ("title",))[0]

    def passages_at(self, rows: Sequence[int] | np.ndarray) -> list[Passage]:
        return [Passage(*values) for values in zip(*self._take(rows, ("id", "title", "text")))]

    def _take(self, rows: Sequence[int] | np.ndarray, columns: Sequence[str]) -> list[list]:
        """The values of `columns` at `rows` (any order, repeats allowed), each column a list in the order of `rows`.

        Taken from the record batches the rows fall in, so the cost follows the rows asked for: Arrow's ``take`` on
        the whole table costs time in proportion to the table (64 random rows of a 1M-passage corpus: 113 ms, about
        0.9 ms this way; benchmarks/RESULTS.md, "How cost grows with the corpus"), which a retrieval service pays on
        every request."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            bad = int(rows[(rows < 0) | (rows >= len(self))][0])
            raise IndexError(f"row {bad} is outside corpus {self.source} ({len(self)} rows)")
        batch_of = np.searchsorted(self._batch_starts, rows, side="right") - 1
        values: list[list] = [[None] * rows.size for _ in columns]
        for batch in np.unique(batch_of):
            where = np.flatnonzero(batch_of == batch)
            taken = self._batches[batch].take(pa.array(rows[where] - self._batch_starts[batch]))
            for column, out in zip(columns, values):
                for position, value in zip(where.tolist(), taken.column(column).to_pylist()):
                    out[position] = value
        return values

    def rows_of(self, ids: Sequence[str]) -> np.ndarray:
        """Row numbers of `ids`; KeyError naming the first unknown id."""
        if self._ids_are_rows:
            rows = np.array([int(i) if i.isdigit() and str(int(i)) == i else -1 for i in ids], dtype=np.int64)
            rows[rows >= len(self)] = -1
        else:
            rows = self._hashed_rows(ids)
        if (rows < 0).any():
            raise KeyError(f"passage id not in corpus {self.source}: {ids[int(np.argmax(rows < 0))]!r}")
        return rows

    def get(self, ids: Sequence[str]) -> list[Passage]:
        return self.passages_at(self.rows_of(ids))

    def iter_contents(self, start: int = 0, stop: int | None = None, batch_size: int = 10_000) -> Iterator[list[str]]:
        """Yield the Search-R1 ``contents`` of rows [start, stop) in batches (what dense indexes encode)."""
        stop = len(self) if stop is None else stop
        for begin in range(start, stop, batch_size):
            part = self._table.slice(begin, min(batch_size, stop - begin))
            titles, texts = part.column("title").to_pylist(), part.column("text").to_pylist()
            yield [f'"{title}"\n{text}' for title, text in zip(titles, texts)]

    def empty_rows(self, batch_rows: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
        """(rows whose text is empty or whitespace, the rows among them whose title is too), ascending.

        One pass over the memory-mapped columns in batches (Arrow kernels, no Python object per row)."""
        import pyarrow.compute as pc

        def blank(column: pa.ChunkedArray) -> np.ndarray:  # utf8_is_space stops at the first other character
            empty = pc.or_(pc.equal(pc.binary_length(column), 0), pc.utf8_is_space(column))
            return np.asarray(pc.fill_null(empty, True).to_numpy(), dtype=bool)

        text_rows, both_rows = [], []
        for start in range(0, len(self), batch_rows):
            part = self._table.slice(start, batch_rows)
            rows = np.flatnonzero(blank(part.column("text")))
            if len(rows):
                title_empty = blank(part.column("title").take(pa.array(rows)))
                text_rows.append(rows + start)
                both_rows.append(rows[title_empty] + start)
        return _concat_rows(text_rows), _concat_rows(both_rows)

    def _hashed_rows(self, ids: Sequence[str]) -> np.ndarray:
        hashes = hash_ids(ids)
        positions = np.searchsorted(self._id_hash, hashes)
        rows = np.full(len(ids), -1, dtype=np.int64)
        id_column = self.id_column
        for i, (wanted, position) in enumerate(zip(ids, positions)):
            while position < len(self._id_hash) and self._id_hash[position] == hashes[i]:
                row = int(self._id_order[position])
                if id_column[row].as_py() == wanted:
                    rows[i] = row
                    break
                position += 1
        return rows


def _concat_rows(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def _sidecar(arrow_path: Path, name: str, suffix: str = ".npy") -> Path:
    return arrow_path.with_suffix(f".{name}{suffix}")


def _row_from_json(row: dict, path: Path, line: int) -> tuple[str, str, str]:
    id_field = "id" if "id" in row else "_id"  # BEIR's corpus.jsonl names it _id
    if id_field not in row:
        raise DataFormatError(path, line, "missing (nor BEIR's '_id')", field="id")
    pid = row[id_field]
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise DataFormatError(path, line, f"expected a string or integer id, got {type(pid).__name__}", field=id_field)
    if "contents" in row:
        if not isinstance(row["contents"], str):
            raise DataFormatError(path, line, f"expected a string, got {type(row['contents']).__name__}", field="contents")
        return (str(pid), *split_contents(row["contents"]))
    for field in ("title", "text"):
        if not isinstance(row.get(field), str):
            problem = "missing (a row needs 'contents', or 'title' and 'text')" if field not in row else "expected a string"
            raise DataFormatError(path, line, problem, field=field)
    return str(pid), row["title"], row["text"]


def _json_rows(path: Path, digest) -> Iterator[tuple[str, str, str]]:
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            digest.update(raw)
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise DataFormatError(path, line_no, f"invalid JSON ({error})") from None
            if not isinstance(row, dict):
                raise DataFormatError(path, line_no, f"expected a JSON object, got {type(row).__name__}")
            yield _row_from_json(row, path, line_no)


def _parquet_rows(path: Path, digest) -> Iterator[tuple[str, str, str]]:
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    parquet = pq.ParquetFile(path)
    columns = [c for c in ("id", "_id", "contents", "title", "text") if c in parquet.schema_arrow.names]
    row_no = 0
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
        for row in batch.to_pylist():
            row_no += 1
            yield _row_from_json(row, path, row_no)


def _tsv_rows(path: Path, digest) -> Iterator[tuple[str, str, str]]:
    """DPR's ``psgs_w100.tsv``: a header with ``id``, ``text`` and ``title`` (any order, other columns ignored),
    then CSV-quoted, tab-separated rows; a row's number in errors is its first line in the file."""
    import csv

    csv.field_size_limit(1 << 30)

    def lines() -> Iterator[str]:
        with open(path, "rb") as handle:
            for raw in handle:
                digest.update(raw)
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataFormatError(path, reader.line_num + 1, f"not UTF-8 ({error})") from None

    reader = csv.reader(lines(), delimiter="\t")
    header = next(reader, None)
    if header is None:
        raise DataFormatError(path, 1, "empty file: a TSV corpus starts with a header naming id, text and title")
    columns = {name.strip(): i for i, name in enumerate(header)}
    for needed in ("id", "text", "title"):
        if needed not in columns:
            raise DataFormatError(path, 1, f"the header {header!r} has no '{needed}' column", field=needed)
    width = max(columns[c] for c in ("id", "text", "title")) + 1
    start = reader.line_num + 1
    for row in reader:
        if not row or row == [""]:
            start = reader.line_num + 1
            continue
        if len(row) < width:
            missing = next(c for c in ("id", "text", "title") if columns[c] >= len(row))
            raise DataFormatError(path, start, f"{len(row)} columns, the header names {len(header)}", field=missing)
        if not row[columns["id"]]:
            raise DataFormatError(path, start, "empty", field="id")
        yield row[columns["id"]], row[columns["title"]], row[columns["text"]]
        start = reader.line_num + 1


def _convert(source: Path, arrow_path: Path) -> None:
    """Stream `source` into an Arrow IPC file, then the id-lookup sidecars, then the metadata file (last)."""
    digest = hashlib.sha256()
    reader = {".parquet": _parquet_rows, ".tsv": _tsv_rows}.get(source.suffix, _json_rows)
    ids_are_rows, count = True, 0
    id_hashes: list[np.ndarray] = []
    arrow_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = arrow_path.with_name(f".{arrow_path.name}.{os.getpid()}.tmp")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, _SCHEMA) as writer:
            batch: list[tuple[str, str, str]] = []
            progress = tqdm(desc=f"reading {source.name}", unit=" rows", mininterval=2)

            def flush() -> None:
                nonlocal ids_are_rows, count
                ids, titles, texts = zip(*batch)
                ids_are_rows = ids_are_rows and all(i == str(count + n) for n, i in enumerate(ids))
                id_hashes.append(hash_ids(ids))
                writer.write_batch(pa.record_batch([list(ids), list(titles), list(texts)], schema=_SCHEMA))
                count += len(batch)
                progress.update(len(batch))
                batch.clear()

            for row in reader(source, digest):
                batch.append(row)
                if len(batch) >= _BATCH_ROWS:
                    flush()
            if batch:
                flush()
            progress.close()
        if count == 0:
            raise DataFormatError(source, None, "the corpus has no rows")
        if not ids_are_rows:
            _write_id_lookup(source, tmp, arrow_path, np.concatenate(id_hashes))
        os.replace(tmp, arrow_path)
        write_json(_sidecar(arrow_path, "meta", ".json"), {
            "content_sha256": digest.hexdigest(), "ids_are_row_numbers": ids_are_rows, "rows": count,
            "source": str(source), "format_version": _FORMAT_VERSION,
        })
    finally:
        tmp.unlink(missing_ok=True)


def _write_id_lookup(source: Path, tmp_arrow: Path, arrow_path: Path, hashes: np.ndarray) -> None:
    order = np.argsort(hashes, kind="stable")
    sorted_hashes = hashes[order]
    same = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
    if len(same):
        ids = pa.ipc.open_file(pa.memory_map(str(tmp_arrow), "r")).read_all().column("id")
        for position in same:
            a, b = int(order[position]), int(order[position + 1])
            if ids[a].as_py() == ids[b].as_py():
                raise DataFormatError(source, None, f"duplicate passage id {ids[a].as_py()!r} (rows {a + 1} and {b + 1})", field="id")
    for name, array in (("idhash", sorted_hashes), ("idorder", order.astype(np.int64))):
        with atomic_write(_sidecar(arrow_path, name), "wb") as handle:
            np.save(handle, array)

