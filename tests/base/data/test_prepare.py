import json

import pytest

from agentic_retriever.base.data.prepare import (PrepareConfig, answer_parts, answer_strings, assert_disjoint,
                                             fanoutqa_rows, prepare_defaults)
from agentic_retriever.base.corpus import Corpus


@pytest.mark.parametrize("answer, expected", [
    ("Right", ["Right"]), (42, ["42"]), (3.0, ["3"]), (2.5, ["2.5"]), (True, ["yes"]), (False, ["no"]),
    (["A", "B"], ["A, B"]), ({"Apple": 161000, "IBM": 1.0}, ["Apple: 161000, IBM: 1"]),
])
def test_answers_become_one_golden_string(answer, expected):
    assert answer_strings(answer) == expected


def test_an_answer_of_several_parts_keeps_its_parts_for_answer_recall():
    assert answer_parts(["Pat Burrell", 5, True]) == [["Pat Burrell"], ["5"], ["yes"]]
    assert answer_parts({"Steve Chen": 45, "Macau": 680000.0}) == [["Steve Chen", "45"], ["Macau", "680000"]]
    assert answer_parts("Paris") is None and answer_parts(3) is None
    tree = {"id": "q", "question": "q?", "answer": "x", "decomposition": [
        {"id": "q-a", "question": "Who were the picks?", "answer": ["A", "B"], "decomposition": []},
        {"id": "q-b", "question": "Where?", "answer": "C", "decomposition": []}]}
    leaves, _ = fanoutqa_rows([tree], {}, 0.5)
    rows = {r["id"]: r for r in leaves["train"] + leaves["dev"]}
    assert rows["q-a"]["golden_answers"] == ["A, B"] and rows["q-a"]["answer_parts"] == [["A"], ["B"]]
    assert "answer_parts" not in rows["q-b"]


def test_split_keeps_every_leaf_with_its_top_level_question():
    tree = lambda qid: {"id": qid, "question": f"{qid}?", "answer": "x", "decomposition": [  # noqa: E731
        {"id": f"{qid}-a", "question": f"{qid} a?", "answer": "1", "decomposition": [], "evidence": {"title": "T1"}},
        {"id": f"{qid}-b", "question": f"{qid} b?", "answer": 2, "decomposition": [
            {"id": f"{qid}-b1", "question": f"{qid} b1?", "answer": "3", "decomposition": [], "evidence": {"title": "T2"}}]},
    ]}
    leaves, multihop = fanoutqa_rows([tree(f"q{i}") for i in range(40)], {"T1": '"T1"\nIt is 1 of 12.'}, 0.5)
    assert leaves["train"] and leaves["dev"]
    for split in ("train", "dev"):
        parents = {r["parent_id"] for r in leaves[split]}
        assert parents == {r["id"] for r in multihop[split]}
    assert not {r["parent_id"] for r in leaves["train"]} & {r["parent_id"] for r in leaves["dev"]}
    leaf = next(r for r in leaves["train"] + leaves["dev"] if r["id"] == "q0-b1")
    assert leaf["supporting_titles"] == ["T2"] and leaf["evidence_in_corpus"] is False
    assert leaf["answer_in_evidence"] is False
    in_corpus = next(r for r in leaves["train"] + leaves["dev"] if r["id"] == "q0-a")
    assert in_corpus["evidence_in_corpus"] is True and in_corpus["answer_in_evidence"] is True  # "1", not "12"
    top = next(r for r in multihop["train"] + multihop["dev"] if r["id"] == "q0")
    assert top["supporting_titles"] == ["T1", "T2"] and top["leaf_ids"] == ["q0-a", "q0-b1"]


def test_shared_leaves_appear_once_and_never_in_train_when_dev_has_them():
    shared = {"id": "cap", "question": "What is the capital of China?", "answer": "Beijing", "decomposition": [],
              "evidence": {"title": "China"}}
    questions = [{"id": f"q{i}", "question": f"q{i}?", "answer": "x", "decomposition": [
        dict(shared), {"id": f"own{i}", "question": f"own {i}?", "answer": "y", "decomposition": []}]}
        for i in range(40)]
    leaves, multihop = fanoutqa_rows(questions, {}, 0.5)
    assert [r["id"] for r in leaves["dev"]].count("cap") == 1
    assert "cap" not in [r["id"] for r in leaves["train"]]
    assert all(len({r["id"] for r in rows}) == len(rows) for rows in leaves.values())
    assert all("cap" in r["leaf_ids"] for r in multihop["train"] + multihop["dev"])  # multi-hop rows keep it
    assert {r["id"] for r in leaves["train"]} == {f"own{i}" for i in range(40) if f"q{i}" in
                                                  {r["id"] for r in multihop["train"]}}


def test_train_leaves_that_dev_has_after_qa_normalisation_are_left_out():
    def tree(qid, leaf_id, text):
        return {"id": qid, "question": f"{qid}?", "answer": "x", "decomposition": [
            {"id": leaf_id, "question": text, "answer": "Washington, D.C.", "decomposition": []}]}

    questions = [tree(f"q{i}", f"l{i}", "What is the capital of the United States?" if i % 2 else
                      "What is the capital of United States") for i in range(40)]
    leaves, _ = fanoutqa_rows(questions, {}, 0.5)
    assert leaves["dev"] and not leaves["train"]  # articles and punctuation do not make a new question


def test_a_train_question_asked_under_two_parents_is_one_question_so_no_slice_shares_it():
    """Two train parents with the same sub-question (other leaf ids, other casing): one train row, so the held-out
    slice, drawn by parent afterwards, can never hold a question that the mining questions hold too."""
    def tree(qid, leaves):
        return {"id": qid, "question": f"{qid}?", "answer": "x", "decomposition": [
            {"id": leaf_id, "question": text, "answer": "Paris", "decomposition": []} for leaf_id, text in leaves]}

    questions = [tree("q1", [("l1", "What is the capital of France?"), ("o1", "Who founded Paris?")]),
                 tree("q2", [("l2", "what is the capital of france"), ("o2", "Where is the Louvre?")])]
    leaves, _ = fanoutqa_rows(questions, {}, 1e-12)  # every question in train
    assert [r["id"] for r in leaves["train"]] == ["l1", "o1", "o2"] and not leaves["dev"]


def test_splits_that_share_an_id_a_parent_or_a_normalised_question_are_refused():
    row = {"id": "a", "question": "What is the capital of France?", "parent_id": "p1"}
    assert_disjoint([row], [{"id": "b", "question": "Who wrote Hamlet?", "parent_id": "p2"}], "held-out", "dev")
    for other in ({"id": "a", "question": "x?", "parent_id": "p2"}, {"id": "b", "question": "x?", "parent_id": "p1"},
                  {"id": "b", "question": "what is the capital of france", "parent_id": "p2"}):
        with pytest.raises(ValueError, match="held-out and dev share 1 question keys"):
            assert_disjoint([row], [other], "held-out", "dev")


def test_answer_in_evidence_matches_on_word_boundaries_only():
    tree = {"id": "q", "question": "q?", "answer": "x", "decomposition": [
        {"id": "q-a", "question": "a?", "answer": "4", "decomposition": [], "evidence": {"title": "T"}}]}
    leaves, _ = fanoutqa_rows([tree], {"T": '"T"\nFounded in 1234.'}, 0.5)
    (leaf,) = leaves["train"] + leaves["dev"]
    assert leaf["evidence_in_corpus"] is True and leaf["answer_in_evidence"] is False


def test_prepare_defaults_writes_the_embedded_corpus_and_fanoutqa_splits(tmp_path):
    summary = prepare_defaults(PrepareConfig(out=str(tmp_path), dev_fraction=0.3))
    assert summary["corpus_passages"] == 10033
    assert sum(summary["leaf_questions"].values()) < 2142  # shared leaves counted once
    assert 500 < sum(summary["leaf_questions_with_evidence_in_corpus"].values()) <= 558
    assert sum(summary["multihop_questions"].values()) == 310
    answerable = summary["leaf_questions_with_answer_in_evidence"]
    assert 0 < answerable["train"] < summary["leaf_questions_with_evidence_in_corpus"]["train"]
    rows = [json.loads(line) for line in (tmp_path / "fanoutqa_leaf_train_answerable.jsonl").open()]
    assert len(rows) == answerable["train"] and all(r["answer_in_evidence"] and r["evidence_in_corpus"] for r in rows)
    def read(name):
        return [json.loads(line) for line in (tmp_path / f"fanoutqa_{name}.jsonl").open()]

    mining, mining_in_corpus, mining_all = (read(f"leaf_train_{n}") for n in ("mining", "mining_in_corpus", "mining_all"))
    heldout, warmstart = read("leaf_train_heldout"), read("leaf_train_warmstart")
    assert 0 < len(mining) == summary["leaf_questions_for_mining"] < len(rows)
    assert {r["id"] for r in mining} <= {r["id"] for r in rows} & {r["id"] for r in mining_in_corpus}
    assert len(heldout) == summary["leaf_questions_heldout"] > 30 and len(mining_in_corpus) > 2 * len(mining)
    assert {r["id"] for r in mining_in_corpus} < {r["id"] for r in mining_all}
    assert len(warmstart) == summary["leaf_questions_warmstart"] > 100
    assert sum(r["answer_in_evidence"] for r in warmstart) == summary["leaf_questions_warmstart_answerable"] > 10
    # every train leaf has one role: held out (in-corpus leaves only), mined or warm start; roles are whole
    # top-level questions, and the multi-hop files split the same way
    in_corpus = [r for r in read("leaf_train") if r["evidence_in_corpus"]]
    assert len(heldout) + len(mining_in_corpus) + sum(r["evidence_in_corpus"] for r in warmstart) == len(in_corpus)
    parents = {name: {r["parent_id"] for r in rows} for name, rows in
               (("heldout", heldout), ("mining", mining_all), ("warmstart", warmstart))}
    assert not parents["heldout"] & parents["mining"] and not parents["heldout"] & parents["warmstart"]
    assert not parents["mining"] & parents["warmstart"]
    for role, ids in parents.items():
        multihop = read(f"multihop_train_{role}")
        assert len(multihop) == summary["multihop_train_questions"][role] and ids <= {r["id"] for r in multihop}
    assert sum(summary["multihop_train_questions"].values()) == summary["multihop_questions"]["train"]
    first = json.loads((tmp_path / "corpus.jsonl").open().readline())
    assert set(first) == {"id", "contents"} and first["id"] == "0" and first["contents"].startswith('"')
    assert len(Corpus.open(tmp_path / "corpus.jsonl")) == 10033
    rows = [json.loads(line) for line in (tmp_path / "fanoutqa_leaf_dev.jsonl").open()]
    assert all(isinstance(r["golden_answers"], list) and all(isinstance(a, str) for a in r["golden_answers"]) for r in rows)
    mtime = (tmp_path / "corpus.jsonl").stat().st_mtime_ns
    assert prepare_defaults(PrepareConfig(out=str(tmp_path), dev_fraction=0.3)) == summary
    assert (tmp_path / "corpus.jsonl").stat().st_mtime_ns == mtime  # a complete folder is not rewritten


def test_prepare_defaults_rejects_a_degenerate_split(tmp_path):
    with pytest.raises(ValueError, match="dev_fraction"):
        prepare_defaults(PrepareConfig(out=str(tmp_path), dev_fraction=1.0))


@pytest.mark.parametrize("leak", ["dev_question_in_a_train_role", "question_in_two_train_roles"])
def test_prepare_defaults_stops_when_the_splits_it_made_share_a_question(tmp_path, monkeypatch, leak):
    """`fanoutqa_rows` keeps dev's questions out of train; should it ever fail to, the disjointness checks in
    `prepare_defaults` are what stop the files: a leaf asked again (new id, same question after normalisation)
    under a train question of another role, or under a train question while dev asks it."""
    import agentic_retriever.base.data.prepare as prepare

    made = prepare.fanoutqa_rows

    def leaky(questions, text, dev_fraction):
        leaves, multihop = made(questions, text, dev_fraction)
        roles = {r["id"]: prepare.train_role(r["id"], 0.5, 0.3) for r in multihop["train"]}
        mining_parent = next(qid for qid, role in roles.items() if role == "mining")
        source = leaves["dev"][0] if leak == "dev_question_in_a_train_role" else next(
            r for r in leaves["train"] if roles[r["parent_id"]] == "warmstart")
        leaves["train"].append({**source, "id": "asked-again", "parent_id": mining_parent,
                                "question": source["question"].upper() + "!"})
        return leaves, multihop

    monkeypatch.setattr(prepare, "fanoutqa_rows", leaky)
    with pytest.raises(ValueError, match="must be disjoint"):
        prepare_defaults(PrepareConfig(out=str(tmp_path), dev_fraction=0.3, mining_fraction=0.5, heldout_fraction=0.3))
    assert not (tmp_path / "prepare_summary.json").exists(), "an unfinished folder is not taken as prepared"
