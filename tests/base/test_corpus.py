import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentic_retriever.base import corpus as corpus_module
from agentic_retriever.base.corpus import Corpus, split_contents
from agentic_retriever.base.jsonl import DataFormatError
from tests.fakes import write_jsonl


def test_both_jsonl_formats_load_into_the_same_passages(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"id": "0", "contents": '"Paris"\nParis is the capital of France.'},
        {"id": 1, "title": "Berlin", "text": "Berlin is in Germany."},
    ])
    corpus = Corpus.open(path)
    assert len(corpus) == 2
    paris, berlin = corpus.get(["0", "1"])
    assert (paris.title, paris.text) == ("Paris", "Paris is the capital of France.")
    assert paris.contents == '"Paris"\nParis is the capital of France.'
    assert berlin.contents == '"Berlin"\nBerlin is in Germany.'
    assert corpus.passages_at([1])[0] == berlin


def test_parquet_corpus_loads(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "title": ["A", "B"], "text": ["alpha", "beta"]}), path)
    corpus = Corpus.open(path)
    assert [p.contents for p in corpus.get(["b", "a"])] == ['"B"\nbeta', '"A"\nalpha']


def test_string_ids_are_found_through_the_hash_lookup(tmp_path):
    rows = [{"id": f"doc-{i}", "title": f"T{i}", "text": f"text {i}"} for i in range(1000)]
    corpus = Corpus.open(write_jsonl(tmp_path / "c.jsonl", rows))
    assert corpus.rows_of(["doc-999", "doc-0", "doc-500"]).tolist() == [999, 0, 500]
    with pytest.raises(KeyError, match="doc-1000"):
        corpus.get(["doc-1", "doc-1000"])


def test_row_number_ids_reject_unknown_and_non_canonical_ids(tmp_path):
    corpus = Corpus.open(write_jsonl(tmp_path / "c.jsonl", [{"id": str(i), "title": "t", "text": "x"} for i in range(3)]))
    assert corpus.rows_of(["2", "0"]).tolist() == [2, 0]
    for bad in ("3", "01", "-1", "x"):
        with pytest.raises(KeyError, match=repr(bad)):
            corpus.rows_of([bad])


def test_duplicate_ids_are_an_error_naming_the_id(tmp_path):
    rows = [{"id": "a", "title": "t", "text": "x"}, {"id": "b", "title": "t", "text": "y"}, {"id": "a", "title": "t", "text": "z"}]
    with pytest.raises(DataFormatError, match=r"duplicate passage id 'a' \(rows 1 and 3\)"):
        Corpus.open(write_jsonl(tmp_path / "c.jsonl", rows))


@pytest.mark.parametrize("bad_line, expected", [
    ("{not json", r"c\.jsonl:3: invalid JSON"),
    ('["a list"]', r"c\.jsonl:3: expected a JSON object"),
    ('{"contents": "x"}', r"c\.jsonl:3: field 'id': missing"),
    ('{"id": "9", "title": "only a title"}', r"c\.jsonl:3: field 'text': missing"),
    ('{"id": "9", "contents": 5}', r"c\.jsonl:3: field 'contents': expected a string"),
])
def test_malformed_line_error_names_file_line_and_problem(tmp_path, bad_line, expected):
    path = tmp_path / "c.jsonl"
    good = json.dumps({"id": "0", "title": "t", "text": "x"})
    path.write_text(f"{good}\n{good.replace('0', '1')}\n{bad_line}\n")
    with pytest.raises(DataFormatError, match=expected):
        Corpus.open(path)


def test_failed_conversion_leaves_no_cache_files(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "title": "t", "text": "x"}\n{broken\n')
    cache = tmp_path / "cache"
    with pytest.raises(DataFormatError):
        Corpus.open(path, cache_dir=cache)
    assert list(cache.iterdir()) == []


def test_rows_spread_over_record_batches_come_back_in_the_asked_order(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "_BATCH_ROWS", 4)  # 23 passages: 6 record batches, the last of 3
    rows = [{"id": f"doc-{i}", "title": f"T{i}", "text": f"text {i}"} for i in range(23)]
    corpus = Corpus.open(write_jsonl(tmp_path / "c.jsonl", rows))
    assert len(corpus._batches) == 6
    asked = [22, 0, 7, 7, 3, 4, 19, 8, 0]  # across batches, unsorted, repeated, batch edges
    assert [p.id for p in corpus.passages_at(asked)] == [f"doc-{i}" for i in asked]
    assert [p.text for p in corpus.passages_at(asked)] == [f"text {i}" for i in asked]
    assert corpus.ids_at(asked) == [f"doc-{i}" for i in asked] and corpus.titles_at([5, 1]) == ["T5", "T1"]
    assert corpus.passages_at([]) == []
    for bad in (23, -1):
        with pytest.raises(IndexError, match=f"row {bad} is outside corpus .*c.jsonl \\(23 rows\\)"):
            corpus.passages_at([1, bad])


def test_reopening_uses_the_arrow_cache_without_reconverting(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "0", "title": "t", "text": "x"}])
    first = Corpus.open(path)
    monkeypatch.setattr(corpus_module, "_convert", lambda *a: pytest.fail("converted twice"))
    again = Corpus.open(path)
    assert again.sha256 == first.sha256 and again.get(["0"]) == first.get(["0"])


def test_iter_contents_yields_search_r1_contents_in_row_order(corpus_file):
    corpus = Corpus.open(corpus_file)
    batches = list(corpus.iter_contents(start=5, stop=25, batch_size=8))
    assert [len(b) for b in batches] == [8, 8, 4]
    assert batches[0][0] == corpus.passages_at([5])[0].contents


def test_split_contents_handles_missing_title_line():
    assert split_contents('"A"\nbody') == ("A", "body")
    assert split_contents("no title") == ("", "no title")
    assert split_contents('"Quoted "inner""\nx') == ('Quoted "inner"', "x")


def test_empty_rows_finds_passages_with_blank_text_and_those_with_a_blank_title_too(tmp_path):
    rows = [
        {"id": "0", "title": "T", "text": "x"},
        {"id": "1", "title": "T", "text": ""},
        {"id": "2", "title": "", "text": " \n\t"},
        {"id": "3", "title": "\u00a0", "text": "\u2003"},   # Unicode spaces are blank too
        {"id": "4", "contents": '"Only a title"\n'},
        {"id": "5", "contents": ""},
        {"id": "6", "title": "", "text": "body without a title"},
    ]
    corpus = Corpus.open(write_jsonl(tmp_path / "c.jsonl", rows))
    for batch_rows in (1 << 20, 2):  # the same across batch boundaries
        text, title_and_text = corpus.empty_rows(batch_rows=batch_rows)
        assert text.tolist() == [1, 2, 3, 4, 5] and title_and_text.tolist() == [2, 3, 5]
    clean = Corpus.open(write_jsonl(tmp_path / "clean.jsonl", rows[:1]))
    assert [r.tolist() for r in clean.empty_rows()] == [[], []]


def _write_dpr_tsv(path, passages):
    """A psgs_w100.tsv as DPR writes it: csv with a tab delimiter, so quotes inside a text are doubled."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["id", "text", "title"])
        writer.writerows(passages)
    return path


def test_dpr_tsv_corpus_loads_with_its_quoting_and_one_based_ids(tmp_path):
    path = _write_dpr_tsv(tmp_path / "psgs_w100.tsv", [
        ("1", 'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest.', "Aaron"),
        ("2", "Second passage\twith a tab inside", "Aaron"),
        ("3", "Plain text.", "Abraham"),
    ])
    assert '""Ahärôn""' in path.read_text(encoding="utf-8")  # the file holds DPR's doubled quotes
    corpus = Corpus.open(path)
    assert len(corpus) == 3
    aaron, tab, abraham = corpus.get(["1", "2", "3"])
    assert aaron.title == "Aaron" and aaron.text == 'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest.'
    assert tab.text == "Second passage\twith a tab inside"
    assert abraham.contents == '"Abraham"\nPlain text.'
    with pytest.raises(KeyError, match="'0'"):  # ids from 1 are ids, not row numbers
        corpus.get(["0"])


@pytest.mark.parametrize("content, line, field", [
    ("id\ttext\n1\tx\n", 1, "title"),
    ("id\ttext\ttitle\n1\tfine\tT\n2\tshort\n", 3, "title"),
    ("id\ttext\ttitle\n1\tfine\tT\n\tempty id\tT\n", 3, "id"),
])
def test_a_malformed_tsv_row_names_file_line_and_field(tmp_path, content, line, field):
    path = tmp_path / "psgs.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError) as error:
        Corpus.open(path)
    assert (error.value.path, error.value.line, error.value.field) == (str(path.resolve()), line, field)
