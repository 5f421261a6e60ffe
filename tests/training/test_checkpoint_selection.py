"""Held-out model selection (base vs. epochs, on a fixed re-ranking pool) and the settings search."""

import json
import logging

import numpy as np
import pytest
import torch

from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.training.checkpoint_selection import HeldOutPool, build_heldout_pool, evaluate_on_pool
from tests.fakes import kill_training_after_first_checkpoint
from tests.training.test_training import _config  # the trainer tests' settings: one tiny, fast configuration

PASSAGES = [f"Passage number {i} about topic {i % 7} and some words {i * 13 % 11}." for i in range(60)]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def corpus_path(tmp_path):
    return write_rows(tmp_path / "corpus.jsonl", [{"id": str(i), "contents": f'"Title {i}"\n{t}'}
                                                  for i, t in enumerate(PASSAGES)])


@pytest.fixture()
def index_dir(tmp_path, corpus_path, tiny_model_dir):
    from agentic_retriever.index import IndexBuildConfig, build_index

    out = tmp_path / "index"
    build_index(IndexBuildConfig(corpus=str(corpus_path), out=str(out), encoder=EncoderConfig(model=tiny_model_dir)))
    return str(out)


@pytest.fixture()
def heldout(tmp_path):
    rows = [{"id": f"h{i}", "question": f"What is about topic {i % 7} number {i}?", "golden_answers": [str(i)],
             "supporting_titles": [f"Title {i}"]} for i in (1, 9, 17, 30)]
    rows.append({"id": "gone", "question": "Where is the lost page?", "golden_answers": ["x"],
                 "supporting_titles": ["Not In The Corpus"]})
    return write_rows(tmp_path / "heldout.jsonl", rows)


@pytest.fixture()
def train_rows(tmp_path):
    rows = [{"dataset": "t", "query_id": str(i), "question": f"Question {i}?", "round_index": 1, "history_queries": [],
             "query_text": f"topic {i % 7} words", "passage_ids": [str(i), *(str(12 + 3 * i + k) for k in range(3))],
             "scores": [{"em": 1, "local_utility": 0.9}] + [{"em": 0, "local_utility": 0.1}] * 3} for i in range(12)]
    return write_rows(tmp_path / "retriever_train.jsonl", rows)


class _FakeModel:
    """Fixed 2-d embeddings per text (what `evaluate_on_pool` needs of a SentenceTransformer)."""

    def __init__(self, vectors: dict[str, list[float]]):
        self.vectors, self.training = vectors, True

    def encode(self, texts, normalize_embeddings, **_):
        rows = np.array([self.vectors[t] for t in texts], dtype=np.float32)
        self.training = False  # like SentenceTransformer.encode, which switches to eval mode
        return rows / np.linalg.norm(rows, axis=1, keepdims=True) if normalize_embeddings else rows

    def train(self, mode: bool):
        self.training = mode


def test_evaluate_on_pool_ranks_the_whole_pool_by_cosine_and_judges_by_title():
    pool = HeldOutPool(["a", "b"], ["qa", "qb"], [{"T1"}, {"T2", "T3"}], ["p1", "p2", "p3", "p1bis"],
                       ["T1", "T2", "T3", "T1"])
    model = _FakeModel({"qa": [1, 0], "qb": [0, 1], "p1": [1, 1], "p2": [0, 1], "p3": [1, 0], "p1bis": [1, 0.9]})
    # qa ranks p3 (cos 1), p1bis, p1, p2: T1 first at rank 2. qb ranks p2 (T2) first, then p1, p1bis, p3 (T3) 4th.
    assert evaluate_on_pool(model, pool, "mrr@10") == pytest.approx((1 / 2 + 1) / 2)
    assert evaluate_on_pool(model, pool, "mrr@1") == pytest.approx(0.5)
    assert evaluate_on_pool(model, pool, "recall@3") == pytest.approx((1 + 1 / 2) / 2)
    assert evaluate_on_pool(model, pool, "recall@4") == pytest.approx(1.0)
    assert model.training  # the training mode is restored
    with pytest.raises(ValueError, match="mrr@k, recall@k or ndcg@k"):
        evaluate_on_pool(model, pool, "map@10")


def test_the_pool_is_the_union_of_the_base_index_top_k(tmp_path, index_dir, heldout):
    from agentic_retriever.index import open_index

    questions = [json.loads(line)["question"] for line in heldout.open()]
    index = open_index(index_dir)
    top = index.search(questions, 3)
    union = sorted({i for ids in top.ids for i in ids}, key=int)
    titles_found = {index.corpus.get([i])[0].title for ids in top.ids for i in ids}
    # make two questions judgeable: their evidence is among the top 3 of some question
    rows = [json.loads(line) for line in heldout.open()]
    rows[0]["supporting_titles"] = [sorted(titles_found)[0], "Title 39"]
    rows[1]["supporting_titles"] = [sorted(titles_found)[-1]]
    write_rows(heldout, rows)

    def query_input(query, question):
        return f"query: {question} [SEP] {query}" if question else f"query: {query}"

    pool = build_heldout_pool(str(heldout), index_dir, 3, query_input, lambda t: "passage: " + t)
    assert pool.passages == [f"passage: {p.contents}" for p in index.corpus.get(union)]
    assert pool.titles == [p.title for p in index.corpus.get(union)]
    judged = [r for r in rows if set(r["supporting_titles"]) & titles_found]
    assert pool.question_ids == [r["id"] for r in judged]
    assert pool.queries == [f"query: {r['question']} [SEP] {r['question']}" for r in judged]
    assert pool.relevant[0] == {sorted(titles_found)[0], "Title 39"}  # in the corpus, even if not in the pool
    assert pool.counts == {"questions": 5, "questions_judged": len(judged), "inputs": 1,
                           "questions_skipped_no_relevant_in_pool": 5 - len(judged), "pool_passages": len(union)}

    # scored on the inputs one reports: the bare question, then composed with its parent question
    parents = tmp_path / "parents.jsonl"
    write_rows(parents, [{"id": f"p{i}", "question": f"Parent {i}?", "golden_answers": ["x"]} for i in range(5)])
    write_rows(heldout, [{**row, "parent_id": f"p{i}"} for i, row in enumerate(rows)])
    both = build_heldout_pool(str(heldout), index_dir, 3, query_input, lambda t: "passage: " + t,
                              compose_with=("none", "parent"), parent_qa=str(parents))
    parent_of = {r["id"]: f"Parent {i}?" for i, r in enumerate(rows)}
    assert both.question_ids == pool.question_ids * 2 and both.relevant == pool.relevant * 2
    assert both.queries == ([f"query: {r['question']}" for r in judged]
                            + [f"query: {parent_of[r['id']]} [SEP] {r['question']}" for r in judged])
    assert both.passages == pool.passages and both.counts["inputs"] == 2 and both.fingerprint != pool.fingerprint
    write_rows(heldout, rows)  # no parent_id: composing with the parent names the file, line and field
    with pytest.raises(DataFormatError, match="parent_id"):
        build_heldout_pool(str(heldout), index_dir, 3, query_input, str, compose_with=("parent",),
                           parent_qa=str(parents))

    write_rows(heldout, [rows[-1]])  # evidence nowhere: the score could not tell encoders apart
    with pytest.raises(ValueError, match="no held-out question .* has a relevant passage"):
        build_heldout_pool(str(heldout), index_dir, 3, str, str)


def _scripted_scores(monkeypatch, scores: list[float]) -> list[dict]:
    """Replace the held-out evaluation by `scores`, in call order; return the weights each call saw (copied to the
    CPU, where the exported weights are read: tensors on two devices cannot be compared)."""
    from agentic_retriever.training import checkpoint_selection

    seen = []

    def scripted(model, pool, metric, batch_size=64):
        seen.append({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()} | {"pool": pool})
        return scores[len(seen) - 1]

    monkeypatch.setattr(checkpoint_selection, "evaluate_on_pool", scripted)
    return seen


def _weights(path) -> dict:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").state_dict()


def test_when_no_epoch_beats_the_base_the_base_weights_are_exported_unchanged(
        tmp_path, tiny_model_dir, train_rows, corpus_path, index_dir, heldout, monkeypatch, caplog):
    from agentic_retriever.training.trainer import train_retriever

    seen = _scripted_scores(monkeypatch, [0.5, 0.4, 0.5])  # base, epoch 1, epoch 2 (a tie keeps the base)
    with caplog.at_level(logging.WARNING):
        out = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r", select_on=str(heldout),
                                      select_index=index_dir, select_pool=60))
    assert len(seen) == 3
    manifest = json.loads((out / "train_manifest.json").read_text())
    selection = manifest["selection"]
    assert selection["kept"] == "base" and selection["metric"] == "mrr@10" and selection["pool"] == 60
    assert selection["per_checkpoint"] == {"base": 0.5, "epoch-1": 0.4, "epoch-2": 0.5}
    assert selection["questions_judged"] == 4 and manifest["updates"] == 6
    assert "KEPT THE BASE ENCODER" in caplog.text
    assert "the base encoder, unchanged" in (out / "README.md").read_text()
    base, exported = _weights(tiny_model_dir), _weights(out)
    for name in base:
        torch.testing.assert_close(exported[name], base[name], rtol=0, atol=0)
    assert any(not torch.equal(seen[2][name], base[name]) for name in base)  # training did change the model
    assert not (tmp_path / "r.checkpoints").exists()


def test_the_best_epoch_is_exported_even_when_it_is_not_the_last(
        tmp_path, tiny_model_dir, train_rows, corpus_path, index_dir, heldout, monkeypatch):
    from agentic_retriever.training.trainer import train_retriever

    seen = _scripted_scores(monkeypatch, [0.1, 0.6, 0.3])
    # selected on the inputs reported: the bare question and the question composed with its parent
    write_rows(heldout, [{**json.loads(line), "parent_id": "p"} for line in heldout.open()])
    parents = write_rows(tmp_path / "parents.jsonl", [{"id": "p", "question": "The parent?", "golden_answers": ["x"]}])
    out = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r", select_on=str(heldout),
                                  select_index=index_dir, select_pool=60, select_compose_with=["none", "parent"],
                                  select_parents=str(parents)))
    selection = json.loads((out / "train_manifest.json").read_text())["selection"]
    assert selection["kept"] == "epoch-1" and selection["compose_with"] == ["none", "parent"]
    pool = seen[0]["pool"]
    questions = [json.loads(line)["question"] for line in heldout.open()][:4]  # the last has no evidence in the pool
    assert pool.queries == ([f"query: {q}" for q in questions]  # the encoder's prefix, then the input
                            + [f"query: The parent? [SEP] {q}" for q in questions])
    exported = _weights(out)
    for name in exported:
        torch.testing.assert_close(exported[name], seen[1][name])
    assert any(not torch.equal(exported[name], seen[2][name]) for name in exported)
    with pytest.raises(ValueError, match="needs --select-parents"):
        train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r2", select_on=str(heldout),
                                select_index=index_dir, select_compose_with=["parent"]))
    # without selection the selection inputs are not read: no parents needed
    _config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r3", select_compose_with=["parent"]).validate()


@pytest.mark.slow
def test_selection_survives_a_kill_and_curves_show_the_held_out_metric(
        tmp_path, tiny_model_dir, train_rows, corpus_path, index_dir, heldout, monkeypatch):
    """Killed right after the checkpoint that ends epoch 1 (before its evaluation): the rerun scores epoch 1
    from that checkpoint and ends with the same held-out scores as an uninterrupted run."""
    from agentic_retriever.training.trainer import train_retriever

    def config(out):
        return _config(tiny_model_dir, train_rows, corpus_path, out, select_on=str(heldout), select_index=index_dir,
                       select_pool=10)

    uninterrupted = train_retriever(config(tmp_path / "a"))
    expected = json.loads((uninterrupted / "train_manifest.json").read_text())["selection"]["per_checkpoint"]
    assert list(expected) == ["base", "epoch-1", "epoch-2"]
    curve = [m for m in map(json.loads, (uninterrupted / "metrics.jsonl").open()) if "heldout_mrr@10" in m]
    assert [m["step"] for m in curve] == [0, 3, 6] and [m["heldout_mrr@10"] for m in curve] == list(expected.values())

    saved_at = kill_training_after_first_checkpoint(monkeypatch)  # the process dies right after checkpoint-3
    with pytest.raises(KeyboardInterrupt):
        train_retriever(config(tmp_path / "b"))
    record = json.loads((tmp_path / "b.checkpoints" / "selection.json").read_text())
    assert list(record["per_checkpoint"]) == ["base"]
    resumed = train_retriever(config(tmp_path / "b"))
    got = json.loads((resumed / "train_manifest.json").read_text())["selection"]["per_checkpoint"]
    assert saved_at == [3, 6] and got.keys() == expected.keys()
    for name in expected:
        assert got[name] == pytest.approx(expected[name], abs=1e-6)


@pytest.mark.slow
def test_settings_search_trains_each_combination_once_and_returns_the_best(
        tmp_path, tiny_model_dir, train_rows, corpus_path, index_dir, heldout):
    from agentic_retriever.training.settings_search import choose_training_settings

    base = _config(tiny_model_dir, train_rows, corpus_path, tmp_path / "search", select_on=str(heldout),
                   select_index=index_dir, select_pool=10, epochs=1)
    best, table = choose_training_settings(base, {"learning_rate": [1e-7, 2e-3], "temperature": [0.05]})
    assert [(row["learning_rate"], row["temperature"]) for row in table] == [(1e-7, 0.05), (2e-3, 0.05)]
    for row in table:
        manifest = json.loads((tmp_path / "search" / row["out"].split("/")[-1] / "train_manifest.json").read_text())
        assert manifest["settings"]["learning_rate"] == row["learning_rate"]
        assert row["score"] == max(row["per_checkpoint"].values()) and row["kept"] in row["per_checkpoint"]
    top = max(table, key=lambda row: row["score"])
    assert best.learning_rate == top["learning_rate"] and best.out == top["out"]
    assert table[0]["base_score"] == table[1]["base_score"]  # the same base on the same pool
    summary = json.loads((tmp_path / "search" / "settings_search.json").read_text())
    assert summary["best"]["score"] == top["score"] and len(summary["runs"]) == 2

    stamps = [(tmp_path / "search" / row["out"].split("/")[-1] / "model.safetensors").stat().st_mtime_ns
              for row in table]
    again, table_again = choose_training_settings(base, {"learning_rate": [1e-7, 2e-3], "temperature": [0.05]})
    assert [row["score"] for row in table_again] == [row["score"] for row in table] and again.out == best.out
    assert stamps == [(tmp_path / "search" / row["out"].split("/")[-1] / "model.safetensors").stat().st_mtime_ns
                      for row in table]  # reused, not retrained
    with pytest.raises(ValueError, match="not a top-level training setting"):
        choose_training_settings(base, {"lr": [1e-5]})
    with pytest.raises(ValueError, match="needs held-out model selection"):
        choose_training_settings(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "x"), {"epochs": [1]})
