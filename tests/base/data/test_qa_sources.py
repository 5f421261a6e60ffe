"""QA sets in the field's formats: FlashRAG JSONL, Search-R1 parquet, hub folders, merged sets (`qa_sources`)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentic_retriever.app.cli import main
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.base.qa_sources import parse_qa_sources, read_qa_source_rows
from agentic_retriever.base.qa_sources import read_qa_rows
from tests.fakes import write_jsonl

SEARCH_R1_TEMPLATE = ("Answer the given question. You must conduct reasoning inside <think> and </think> first every "
                      "time you get new information. ... For example, <answer> Beijing </answer>. Question: {q}\n")


def flashrag_rows(prefix: str, questions: list[str], split: str = "train") -> list[dict]:
    """Rows as FlashRAG's datasets hold them: ids numbered per split, metadata beside the answers."""
    return [{"id": f"{split}_{i}", "question": q, "golden_answers": [f"{prefix} answer {i}"],
             "metadata": {"source": prefix}} for i, q in enumerate(questions)]


def write_search_r1_parquet(path, data_source: str, rows: list[dict], keep_flashrag_columns: bool) -> None:
    """Search-R1's nq_search.py output: FlashRAG's columns (kept by datasets.map) plus its own fields."""
    records = []
    for index, row in enumerate(rows):
        question = row["question"].strip() + ("" if row["question"].strip().endswith("?") else "?")
        record = {"data_source": data_source,
                  "prompt": [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(q=question)}],
                  "ability": "fact-reasoning",
                  "reward_model": {"style": "rule", "ground_truth": {"target": row["golden_answers"]}},
                  "extra_info": {"split": "train", "index": index}}
        if keep_flashrag_columns:
            record |= {"id": row["id"], "question": question, "golden_answers": row["golden_answers"]}
        records.append(record)
    pq.write_table(pa.Table.from_pylist(records), path)


def test_one_flashrag_file_is_read_as_it_is(tmp_path):
    path = write_jsonl(tmp_path / "nq_dev.jsonl", flashrag_rows("nq", ["who is a?", "what is b?"], "dev"))
    rows = read_qa_rows(path)
    assert [(r.id, r.question, r.dataset) for r in rows] == [("dev_0", "who is a?", None), ("dev_1", "what is b?", None)]


def test_two_flashrag_files_merge_with_ids_namespaced_by_their_dataset(tmp_path):
    trivia = write_jsonl(tmp_path / "triviaqa" / "train.jsonl", flashrag_rows("tq", ["t0?", "t1?"]))
    hotpot = write_jsonl(tmp_path / "hotpotqa" / "train.jsonl", flashrag_rows("hp", ["h0?"]))
    rows = read_qa_rows(f"{trivia},{hotpot}")
    assert [(r.id, r.dataset) for r in rows] == [
        ("triviaqa/train_0", "triviaqa"), ("triviaqa/train_1", "triviaqa"), ("hotpotqa/train_0", "hotpotqa")]
    assert rows[2].golden_answers == ("hp answer 0",)


def test_named_sources_and_a_repeated_id_within_one_dataset(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", flashrag_rows("x", ["q0?"]))
    b = write_jsonl(tmp_path / "b.jsonl", flashrag_rows("y", ["q1?"]))
    named = read_qa_rows(f"nq={a},popqa={b}")
    assert [(r.id, r.dataset) for r in named] == [("nq/train_0", "nq"), ("popqa/train_0", "popqa")]
    with pytest.raises(DataFormatError, match="repeats") as error:
        read_qa_rows(f"nq={a},nq={b}")
    assert (error.value.path, error.value.line, error.value.field) == (str(b), 1, "id")


@pytest.mark.parametrize("keep_flashrag_columns", [True, False])
def test_search_r1_parquet_reads_question_answers_and_dataset(tmp_path, keep_flashrag_columns):
    path = tmp_path / "train.parquet"
    nq = flashrag_rows("nq", ["who sang hey jude", "capital of peru?"])
    hotpot = flashrag_rows("hp", ["Which band formed first?"])
    records_nq, records_hp = tmp_path / "nq.parquet", tmp_path / "hp.parquet"
    write_search_r1_parquet(records_nq, "nq", nq, keep_flashrag_columns)
    write_search_r1_parquet(records_hp, "hotpotqa", hotpot, keep_flashrag_columns)
    # qa_search_train_merge.py concatenates the datasets' rows into one train.parquet
    pq.write_table(pa.concat_tables([pq.read_table(records_nq), pq.read_table(records_hp)]), path)
    rows = read_qa_rows(path)
    assert [(r.id, r.question, r.golden_answers, r.dataset) for r in rows] == [
        ("nq/train_0", "who sang hey jude?", ("nq answer 0",), "nq"),
        ("nq/train_1", "capital of peru?", ("nq answer 1",), "nq"),
        ("hotpotqa/train_0", "Which band formed first?", ("hp answer 0",), "hotpotqa")]


def test_a_search_r1_row_without_its_answers_names_the_row_and_field(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "nq", "prompt": [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(q="a?")}],
         "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}}, "extra_info": {"split": "train", "index": 0}},
        {"data_source": "nq", "prompt": [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(q="b?")}],
         "reward_model": {"style": "rule", "ground_truth": None}, "extra_info": {"split": "train", "index": 1}},
    ]), path)
    with pytest.raises(DataFormatError) as error:
        read_qa_rows(path)
    assert (error.value.path, error.value.line, error.value.field) == (str(path), 2, "reward_model.ground_truth.target")


def write_hub_folder(root, datasets: dict[str, dict[str, list[dict]]]):
    """A local copy of RUC-NLPIR/FlashRAG_datasets: DATASET/SPLIT.jsonl, the configs declared in README.md."""
    lines = ["---", "configs:"]
    for name, splits in datasets.items():
        lines.append(f"- config_name: {name}\n  data_files:")
        for split, rows in splits.items():
            write_jsonl(root / name / f"{split}.jsonl", rows)
            lines.append(f"  - split: {split}\n    path: \"{name}/{split}.jsonl\"")
    (root / "README.md").write_text("\n".join(lines + ["---", "", "# FlashRAG datasets (local copy)", ""]))
    return root


def test_a_hub_dataset_loads_through_datasets_from_a_folder_of_the_hub_layout(tmp_path):
    hub = write_hub_folder(tmp_path / "FlashRAG_datasets", {
        "nq": {"train": flashrag_rows("nq", ["n0?", "n1?"]), "test": flashrag_rows("nq", ["nt?"], "test")},
        "triviaqa": {"train": flashrag_rows("tq", ["t0?"])}})
    rows = read_qa_rows(f"hf:{hub}:nq:test")
    assert [(r.id, r.question, r.dataset) for r in rows] == [("test_0", "nt?", "nq")]
    merged = read_qa_rows(f"hf:{hub}:triviaqa:train,hf:{hub}:nq:train")
    assert [r.id for r in merged] == ["triviaqa/train_0", "nq/train_0", "nq/train_1"]
    with pytest.raises(FileNotFoundError, match="load_dataset"):
        read_qa_rows(f"hf:{hub}:nq:dev")


@pytest.mark.parametrize("spec, message", [
    ("", "at least one source"), ("a.jsonl,,b.jsonl", "empty source"), ("hf:RUC-NLPIR/FlashRAG_datasets:nq", "hf:NAME:CONFIG:SPLIT"),
])
def test_bad_specs_say_how_to_write_them(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_qa_sources(spec)


def test_spec_parsing_keeps_paths_with_equal_signs_and_names_hub_configs():
    sources = parse_qa_sources("runs/x=1/train.jsonl, tq=hf:RUC-NLPIR/FlashRAG_datasets:triviaqa:train")
    assert [(s.kind, s.location, s.name, s.default_dataset) for s in sources] == [
        ("flashrag", "runs/x=1/train.jsonl", None, "x=1"),
        ("hub", "RUC-NLPIR/FlashRAG_datasets", "tq", "tq")]


def test_a_malformed_row_of_a_merged_set_names_its_own_file(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", flashrag_rows("g", ["q?"]))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "x", "golden_answers": ["a"]}])
    with pytest.raises(DataFormatError) as error:
        read_qa_source_rows(f"{good},{bad}")
    assert (error.value.path, error.value.line, error.value.field) == (str(bad), 1, "question")


def test_data_qa_writes_the_merged_set_the_readers_read(tmp_path, capsys):
    trivia = write_jsonl(tmp_path / "triviaqa" / "train.jsonl", flashrag_rows("tq", ["t0?", "t1?"]))
    hotpot = write_jsonl(tmp_path / "hotpotqa" / "train.jsonl", flashrag_rows("hp", ["h0?"]))
    out = tmp_path / "merged.jsonl"
    main(["data", "qa", "--qa", f"{trivia},{hotpot}", "--out", str(out)])
    assert "triviaqa: 2, hotpotqa: 1" in capsys.readouterr().out
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["dataset"], r["metadata"]["source"]) for r in written] == [
        ("triviaqa/train_0", "triviaqa", "tq"), ("triviaqa/train_1", "triviaqa", "tq"), ("hotpotqa/train_0", "hotpotqa", "hp")]
    assert [r.id for r in read_qa_rows(out)] == [r["id"] for r in written]
