"""QA sets in the formats the field distributes them, read as FlashRAG rows (docs/data-formats.md, "QA sets").

A QA source is written as one string, in a config (``agent_rollout.qa``, ``loop.mining_qa``, ...) or on the
command line:

* ``PATH.jsonl``: FlashRAG's JSONL, ``{"id", "question", "golden_answers", "metadata"}`` (our extra fields,
  ``supporting_titles``, ``dataset``, ``parent_id``..., ride along);
* ``PATH.parquet``: Search-R1's training parquet (its ``scripts/data_process/nq_search.py`` and
  ``qa_search_train_merge.py``): ``data_source``, ``prompt`` (the chat message holding the question),
  ``reward_model.ground_truth.target`` (the golden answers) and ``extra_info.{split, index}``. Search-R1 maps
  FlashRAG's rows without removing their columns, so ``id``, ``question`` and ``golden_answers`` are read
  from those columns when present, and from the Search-R1 fields otherwise;
* ``hf:NAME:CONFIG:SPLIT``: a dataset through ``datasets.load_dataset(NAME, CONFIG, split=SPLIT)``, e.g.
  ``hf:RUC-NLPIR/FlashRAG_datasets:triviaqa:train`` (the hub, for users with network) or a local folder of
  the same layout (``NAME`` a path whose README declares the configs, as the hub repository's does).

Several sources joined by ``,`` form one set (the paper's TriviaQA + HotpotQA train questions), and
``DATASET=SOURCE`` names a source's dataset. Each row of a set keeps its dataset in ``dataset`` (for
per-dataset tables): the name given, else the row's own ``dataset``, the parquet's ``data_source``, the hub
config, the folder of FlashRAG's ``DATASET/SPLIT.jsonl`` layout, or the file's stem. FlashRAG numbers rows
per split (``train_0``, ...), so when a set holds more than one dataset every id becomes ``DATASET/ID``; ids
that still repeat are an error naming both places. A single JSONL source without a name is read as it is.

The rows as the agent reads them are `QARow`s (`read_qa_rows`): ``id``, ``question``, ``golden_answers`` flattened
to strings, and the optional ``supporting_titles`` and ``dataset`` (docs/data-formats.md, "QA rows").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .jsonl import DataFormatError, iter_jsonl
from .qa_metrics import golden_strings

__all__ = ["QARow", "QASource", "QASourceRow", "as_qa_rows", "iter_search_r1_file", "parse_qa_sources", "qa_set_name",
           "qa_set_sha256", "question_after_marker", "read_qa_rows", "read_qa_source_rows", "search_r1_qa_row"]

#: File stems that name a split, not a dataset (FlashRAG's ``nq/train.jsonl`` layout).
SPLIT_STEMS = frozenset({"train", "dev", "test", "val", "validation"})
HUB_PREFIX = "hf:"


@dataclass(frozen=True)
class QASource:
    """One source of a QA set, as written (``spec``) and parsed."""

    spec: str
    kind: Literal["flashrag", "search_r1", "hub"]
    location: str  # a file path, or the dataset name / folder of a hub source
    name: str | None = None  # the dataset named with DATASET=SOURCE
    config: str | None = None
    split: str | None = None

    @property
    def default_dataset(self) -> str | None:
        """The dataset a row of this source belongs to when neither the spec nor the row says."""
        if self.name:
            return self.name
        if self.kind == "hub":
            return self.config
        path = Path(self.location)
        return path.parent.name if path.stem.lower() in SPLIT_STEMS and path.parent.name else path.stem


@dataclass(frozen=True)
class QASourceRow:
    """One row as a FlashRAG row, with where it was read (``where`` and ``line`` for error messages)."""

    row: dict[str, Any]
    where: str
    line: int


def parse_qa_sources(spec: str) -> list[QASource]:
    """The sources of a QA set spec (``a.jsonl``, ``triviaqa=a.jsonl,hf:NAME:CONFIG:SPLIT``, ...)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("a QA set needs at least one source (a JSONL or parquet file, or hf:NAME:CONFIG:SPLIT)")
    sources = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            raise ValueError(f"QA set {spec!r}: an empty source between commas")
        name, location = None, part
        head, eq, tail = part.partition("=")
        if eq and head and "/" not in head and ":" not in head:
            name, location = head.strip(), tail.strip()
        if location.startswith(HUB_PREFIX):
            fields = location[len(HUB_PREFIX):].split(":")
            if len(fields) != 3 or not all(fields):
                raise ValueError(f"QA source {part!r}: a hub dataset is written hf:NAME:CONFIG:SPLIT, e.g. "
                                 "hf:RUC-NLPIR/FlashRAG_datasets:triviaqa:train")
            sources.append(QASource(part, "hub", fields[0], name, fields[1], fields[2]))
        elif location.endswith(".parquet"):
            sources.append(QASource(part, "search_r1", location, name))
        else:
            sources.append(QASource(part, "flashrag", location, name))
    return sources


def read_qa_source_rows(spec: str | os.PathLike) -> list[QASourceRow]:
    """Every row of the QA set `spec` as a FlashRAG row, in source order, with datasets and ids as the module
    docstring says. A row without an id or question, or whose source cannot be read, raises DataFormatError
    (file, line, field) or FileNotFoundError."""
    sources = parse_qa_sources(os.fspath(spec))
    if len(sources) == 1 and sources[0].kind == "flashrag" and not sources[0].name:
        return [QASourceRow(row, sources[0].location, line) for line, row in _flashrag_rows(sources[0].location)]
    rows = []
    for source in sources:
        for where, line, row in _source_rows(source):
            for needed in ("id", "question"):
                if needed not in row:
                    raise DataFormatError(where, line, "missing", field=needed)
            dataset = source.name or row.get("dataset") or source.default_dataset
            rows.append(QASourceRow({**row, "dataset": str(dataset)}, where, line))
    if len({r.row["dataset"] for r in rows}) > 1:
        rows = [QASourceRow({**r.row, "id": f"{r.row['dataset']}/{r.row['id']}"}, r.where, r.line) for r in rows]
    first_seen: dict[str, QASourceRow] = {}
    for r in rows:
        earlier = first_seen.setdefault(str(r.row["id"]), r)
        if earlier is not r:
            raise DataFormatError(r.where, r.line, f"id {r.row['id']!r} repeats {earlier.where}:{earlier.line} in "
                                  f"QA set {os.fspath(spec)!r} (name the sources apart with DATASET=SOURCE)", field="id")
    return rows


def qa_set_name(spec: str | os.PathLike) -> str:
    """What a report calls the rows of `spec` that name no dataset: its one source's dataset (the folder of
    FlashRAG's ``hotpotqa/dev.jsonl``, else the file's stem), or ``all`` for several sources."""
    sources = parse_qa_sources(os.fspath(spec))
    return (sources[0].default_dataset or "all") if len(sources) == 1 else "all"


def qa_set_sha256(spec: str | os.PathLike) -> str:
    """A content key of the QA set `spec` (what caches and the loop's records key on): the file's bytes for a
    single JSONL file read as it is, else the rows as read (ids, datasets and all), so a merged set, a parquet
    or a hub split changes its key when its content does, whatever its path."""
    sources = parse_qa_sources(os.fspath(spec))
    digest = hashlib.sha256()
    if len(sources) == 1 and sources[0].kind == "flashrag" and not sources[0].name:
        with open(sources[0].location, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    for r in read_qa_source_rows(spec):
        digest.update(json.dumps(r.row, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8") + b"\n")
    return digest.hexdigest()


def _flashrag_rows(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"QA file not found: {path}")
    return iter_jsonl(path)


def _source_rows(source: QASource) -> Iterator[tuple[str, int, dict[str, Any]]]:
    if source.kind == "flashrag":
        for line, row in _flashrag_rows(source.location):
            yield source.location, line, row
    elif source.kind == "search_r1":
        yield from _search_r1_rows(source.location)
    else:
        yield from _hub_rows(source)


def _search_r1_rows(path: str) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Search-R1's parquet rows as FlashRAG rows; ``line`` is the 1-based row number."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"QA file not found: {path}")
    for number, row in iter_search_r1_file(path):
        yield path, number, search_r1_qa_row(row, path, number)


def iter_search_r1_file(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) of a Search-R1 data file: its parquet, or JSONL rows of the same fields."""
    if Path(path).suffix != ".parquet":
        yield from iter_jsonl(path)
        return
    import pyarrow.parquet as pq

    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=10_000):
        for row in batch.to_pylist():
            number += 1
            yield number, row


def search_r1_qa_row(row: dict[str, Any], path: str, line: int) -> dict[str, Any]:
    """One row of Search-R1's parquet as a FlashRAG row (``id``, ``question``, ``golden_answers``, ``dataset``)."""
    if "data_source" not in row or not isinstance(row["data_source"], str):
        raise DataFormatError(path, line, "missing or not a string (Search-R1 rows name their dataset)",
                              field="data_source")
    question = row.get("question")
    if not isinstance(question, str):
        question = _question_from_prompt(row.get("prompt"), path, line)
    golden = row.get("golden_answers")
    if golden is None:
        ground_truth = (row.get("reward_model") or {}).get("ground_truth")
        if not isinstance(ground_truth, dict) or "target" not in ground_truth:
            raise DataFormatError(path, line, "missing (and no golden_answers column)",
                                  field="reward_model.ground_truth.target")
        golden = ground_truth["target"]
    row_id = row.get("id")
    if row_id is None:
        extra = row.get("extra_info") or {}
        if not isinstance(extra, dict) or "index" not in extra:
            raise DataFormatError(path, line, "missing (and no id column)", field="extra_info.index")
        row_id = f"{extra.get('split') or 'row'}_{extra['index']}"
    return {"id": str(row_id), "question": question, "golden_answers": golden, "dataset": row["data_source"]}


def _question_from_prompt(prompt: Any, path: str, line: int) -> str:
    """The question of Search-R1's prompt: what follows its last ``Question: `` in the first message, up to the
    newline the template ends with."""
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[0], dict) \
            or not isinstance(prompt[0].get("content"), str):
        raise DataFormatError(path, line, "expected a list of chat messages (and no question column)", field="prompt")
    return question_after_marker(prompt[0]["content"], path, line, "prompt")


def question_after_marker(text: str, path: str, line: int, field: str) -> str:
    """The question of a Search-R1 prompt, decoded or not: what follows its last ``Question: ``, up to the end of
    that line; DataFormatError naming `field` when there is none."""
    head, marker, tail = text.rpartition("Question: ")
    question = tail.split("\n", 1)[0].strip()
    if not marker or not question:
        raise DataFormatError(path, line, "holds no Search-R1 'Question: ...'", field=field)
    return question


def _hub_rows(source: QASource) -> Iterator[tuple[str, int, dict[str, Any]]]:
    try:
        import datasets
    except ImportError as error:  # a core dependency; named in case an environment lacks it
        raise ImportError("hf: QA sources need the datasets package (pip install datasets)") from error
    root = os.environ.get("AGENTIC_RETRIEVER_CACHE")
    cache_dir = str(Path(root) / "datasets") if root else None
    where = source.spec
    try:
        rows = datasets.load_dataset(source.location, source.config, split=source.split, cache_dir=cache_dir)
    except (FileNotFoundError, ValueError) as error:
        raise FileNotFoundError(f"QA source {where!r}: datasets.load_dataset({source.location!r}, "
                                f"{source.config!r}, split={source.split!r}) failed: {error}") from error
    for number, row in enumerate(rows, start=1):
        yield where, number, dict(row)


@dataclass(frozen=True)
class QARow:
    """One question with its golden answers (flattened to strings) and, when known, its evidence titles and the
    dataset it comes from (a merged evaluation set reports per dataset, as the paper's tables)."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    supporting_titles: tuple[str, ...] | None = None
    dataset: str | None = None

    @classmethod
    def from_json(cls, row: dict[str, Any], path: str | os.PathLike = "<qa rows>", line: int | None = None) -> QARow:
        """Parse one row; a missing or mistyped field raises DataFormatError naming file, line and field."""
        for name in ("id", "question", "golden_answers"):
            if name not in row:
                raise DataFormatError(path, line, "missing", field=name)
        if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
            raise DataFormatError(path, line, f"expected str/int, got {type(row['id']).__name__}", field="id")
        if not isinstance(row["question"], str) or not row["question"].strip():
            raise DataFormatError(path, line, "expected a non-empty string", field="question")
        try:
            golden = tuple(golden_strings(row["golden_answers"]))
        except TypeError as error:
            raise DataFormatError(path, line, str(error), field="golden_answers") from None
        titles = row.get("supporting_titles")
        if titles is not None and (not isinstance(titles, list) or not all(isinstance(t, str) for t in titles)):
            raise DataFormatError(path, line, "expected a list of strings", field="supporting_titles")
        dataset = row.get("dataset")
        if dataset is not None and (not isinstance(dataset, str) or not dataset.strip()):
            raise DataFormatError(path, line, "expected a non-empty string", field="dataset")
        return cls(str(row["id"]), row["question"], golden, tuple(titles) if titles is not None else None, dataset)


def read_qa_rows(path: str | os.PathLike) -> list[QARow]:
    """All rows of a QA set (a JSONL file, or any spec of `agentic_retriever.base.qa_sources`); bad rows raise
    DataFormatError naming file, line and field."""
    return [QARow.from_json(r.row, r.where, r.line) for r in read_qa_source_rows(path)]


def as_qa_rows(rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike) -> list[QARow]:
    """QA rows from a QA set spec (a JSONL path, ...), `QARow`s, or dicts (a bad dict is named by its 1-based position)."""
    if isinstance(rows, (str, os.PathLike)):
        return read_qa_rows(rows)
    return [r if isinstance(r, QARow) else QARow.from_json(r, "<qa rows>", i) for i, r in enumerate(rows, start=1)]
