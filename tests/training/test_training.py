"""Contrastive retriever training: data, the warm-up schedule, no-duplicate batches, resume, export (the losses:
test_losses.py; held-out selection: test_checkpoint_selection.py)."""

import json

import numpy as np
import pytest
import torch

from agentic_retriever.base.corpus import Corpus
from agentic_retriever.base.encoder import Encoder, EncoderConfig
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.training.data import passage_utility, read_training_examples
from agentic_retriever.training.losses import build_infonce_loss
from tests.fakes import (TRAINING_PASSAGES, RecordingSummaryWriter, kill_training_after_first_checkpoint,
                         write_training_corpus)

# ------------------------------------------------------------------------------------------------ data

PASSAGES = TRAINING_PASSAGES


@pytest.fixture()
def corpus_path(tmp_path):
    return write_training_corpus(tmp_path / "corpus.jsonl")


def agentic_row(query_id: int, pos: int, negs: list[int], question: str = "Q?") -> dict:
    return {"dataset": "t", "query_id": str(query_id), "question": question, "round_index": 1, "history_queries": [],
            "query_text": f"topic {pos % 7} words", "passage_ids": [str(pos), *map(str, negs)],
            "scores": [{"em": 1, "local_utility": 0.9}] + [{"em": 0, "local_utility": 0.1}] * len(negs)}


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def compose(q, question, history):
    return f"query: {question} [SEP] {q}" if question else f"query: {q}"


def test_agentic_r_rows_become_composed_examples(tmp_path, corpus_path):
    data = write_rows(tmp_path / "rows.jsonl", [agentic_row(1, 3, [4, 5, 6]), agentic_row(2, 7, [8, 9, 10])])
    examples, counts = read_training_examples(data, Corpus.open(corpus_path), compose, lambda t: "passage: " + t)
    assert counts["rows"] == 2 and counts["examples"] == 2
    assert examples[0].query == "query: Q? [SEP] topic 3 words"
    assert examples[0].positive == f'passage: "Title 3"\n{PASSAGES[3]}'
    assert len(examples[0].negatives) == 3 and len(examples[1].negatives) == 3  # every one of the row's negatives
    assert examples[1].negatives[-1].endswith(PASSAGES[10])


def test_an_unknown_passage_id_names_file_line_and_id_or_is_skipped(tmp_path, corpus_path):
    data = write_rows(tmp_path / "rows.jsonl", [agentic_row(1, 3, [4, 5]), agentic_row(2, 7, [999, 9])])
    corpus = Corpus.open(corpus_path)
    with pytest.raises(DataFormatError, match=r"rows.jsonl:2: field 'passage_ids': passage id '999' is not in"):
        read_training_examples(data, corpus, compose, str)
    examples, counts = read_training_examples(data, corpus, compose, str, skip_bad_rows=True)
    assert len(examples) == 1 and counts["skipped_missing_passage"] == 1


def test_another_number_of_negatives_and_malformed_rows_are_errors(tmp_path, corpus_path):
    corpus = Corpus.open(corpus_path)
    data = write_rows(tmp_path / "few.jsonl", [agentic_row(1, 3, [4, 5, 6]), agentic_row(2, 7, [8])])
    with pytest.raises(DataFormatError, match=r"few.jsonl:2: field 'passage_ids': 1 negatives where the first row "
                                              r"has 3: .*mine_run.mining.selection.num_negatives"):
        read_training_examples(data, corpus, compose, str)
    more = write_rows(tmp_path / "more.jsonl", [agentic_row(1, 3, [4, 5]), agentic_row(2, 7, [8, 9, 10])])
    with pytest.raises(DataFormatError, match=r"more.jsonl:2: .*3 negatives where the first row has 2"):
        read_training_examples(more, corpus, compose, str)  # extra negatives are refused, not dropped
    examples, counts = read_training_examples(more, corpus, compose, str, skip_bad_rows=True)
    assert len(examples) == 1 and counts["skipped_other_negatives_count"] == 1
    bad = write_rows(tmp_path / "bad.jsonl", [{"query_text": "x"}])
    with pytest.raises(DataFormatError, match=r"bad.jsonl:1: .*neither an Agentic-R row"):
        read_training_examples(bad, corpus, compose, str)
    with pytest.raises(DataFormatError, match="need the corpus"):
        read_training_examples(data, None, compose, str)


def test_flag_embedding_rows_give_one_example_per_positive(tmp_path):
    data = write_rows(tmp_path / "fe.jsonl", [{"query": "who", "pos": ["a", "b"], "neg": ["n1", "n2", "n3"]}])
    examples, counts = read_training_examples(data, None, compose, lambda t: "p: " + t)
    assert [e.positive for e in examples] == ["p: a", "p: b"]
    assert examples[0].query == "query: who" and examples[0].negatives == ("p: n1", "p: n2", "p: n3")
    assert counts["format_flag_embedding"] == 1


def test_exact_duplicate_examples_are_dropped_and_counted(tmp_path, corpus_path):
    rows = [agentic_row(1, 3, [4, 5, 6]), agentic_row(1, 3, [4, 5, 6]),  # the same round mined twice
            agentic_row(2, 3, [4, 5, 7]),                                  # same query and positive, other negatives
            agentic_row(3, 3, [4, 5, 6], question="Other?")]               # same passages, other query input
    data = write_rows(tmp_path / "rows.jsonl", rows)
    examples, counts = read_training_examples(data, Corpus.open(corpus_path), compose, str)
    assert counts["rows"] == 4 and counts["examples"] == 3 and counts["duplicates_removed"] == 1
    assert len({(e.query, e.positive, e.negatives) for e in examples}) == 3
    _, counts = read_training_examples(write_rows(tmp_path / "one.jsonl", rows[:1]), Corpus.open(corpus_path),
                                       compose, str)
    assert counts["duplicates_removed"] == 0


def test_utilities_come_from_gac_with_em_fallback_local_utility_or_their_sum(tmp_path, corpus_path):
    assert passage_utility({"em": 1, "local_utility": 0.25, "gac": 0.5}, "gac") == 0.5
    assert passage_utility({"em": 1, "local_utility": 0.25}, "gac") == 1.0  # older files: no gac
    assert passage_utility({"em": 0, "local_utility": 0.25, "gac": None}, "gac") == 0.0
    assert passage_utility({"em": 1, "local_utility": 0.25, "gac": 0.5}, "local_utility") == 0.25
    assert passage_utility({"em": 1, "local_utility": 0.25, "gac": 0.5}, "gac+lr") == 0.75
    row = agentic_row(1, 3, [4, 5, 6, 7])
    row["scores"] = [{"em": 1, "local_utility": 0.9, "gac": 0.8}, {"em": 0, "local_utility": 0.5},
                     {"em": 0, "local_utility": 0.1, "gac": 0.3}, {"em": 1, "local_utility": 0.0, "gac": None},
                     {"em": 0, "local_utility": 0.7, "gac": 0.9}]
    data = write_rows(tmp_path / "rows.jsonl", [row])
    examples, _ = read_training_examples(data, Corpus.open(corpus_path), compose, str, soft_label_key="gac+lr")
    assert examples[0].utilities == pytest.approx((1.7, 0.5, 0.4, 1.0, 1.6))  # positive first
    examples, _ = read_training_examples(data, Corpus.open(corpus_path), compose, str)
    assert examples[0].utilities is None  # read only for the soft-label loss


def test_soft_labels_without_per_passage_scores_are_clear_errors(tmp_path, corpus_path):
    corpus = Corpus.open(corpus_path)
    flag = write_rows(tmp_path / "fe.jsonl", [{"query": "who", "pos": ["a"], "neg": ["n1", "n2"]}])
    with pytest.raises(DataFormatError, match=r"fe.jsonl:1: field 'scores': the soft-label loss needs .*FlagEmbedding"):
        read_training_examples(flag, None, compose, str, soft_label_key="gac")
    row = agentic_row(1, 3, [4, 5])
    del row["scores"]
    with pytest.raises(DataFormatError, match=r"noscores.jsonl:1: field 'scores': .*one score per passage"):
        read_training_examples(write_rows(tmp_path / "noscores.jsonl", [row]), corpus, compose, str,
                               soft_label_key="gac")
    row = agentic_row(1, 3, [4, 5])
    row["scores"][2] = {"local_utility": 0.1}
    with pytest.raises(DataFormatError, match=r"scores\[2\] has no 'gac' or 'em'"):
        read_training_examples(write_rows(tmp_path / "nogac.jsonl", [row]), corpus, compose, str,
                               soft_label_key="gac")
    from agentic_retriever.training.config import RetrieverTrainConfig

    with pytest.raises(ValueError, match="KL term alone"):
        RetrieverTrainConfig(data="d", out="o", loss="soft_label", soft_label_weight=0.5).validate()


# ------------------------------------------------------------------------------------------------ trainer


@pytest.fixture()
def train_rows(tmp_path, corpus_path):
    """12 rows that share no passage (so 3 batches of 4 per epoch; shared passages: the sampler test)."""
    rows = [agentic_row(i, pos=i, negs=[12 + 3 * i + k for k in range(3)], question=f"Question {i}?")
            for i in range(12)]
    return write_rows(tmp_path / "retriever_train.jsonl", rows)


def _config(tiny_model_dir, data, corpus, out, **overrides):
    from agentic_retriever.training.config import RetrieverTrainConfig

    settings = dict(data=str(data), corpus=str(corpus), out=str(out), per_device_batch_size=4,
                    learning_rate=5e-4, epochs=2, temperature=0.05, warmup_ratio=0.0, save_steps=3, logging_steps=1,
                    progress=False, encoder=EncoderConfig(model=tiny_model_dir, composition="question_sep_query",
                                                          query_prefix="query: ", passage_prefix="passage: "))
    return RetrieverTrainConfig(**(settings | overrides))


def _fixed_batch_loss(model_path: str, data, corpus) -> float:
    from agentic_retriever.training.trainer import examples_dataset

    encoder = Encoder(EncoderConfig(model=model_path, composition="question_sep_query", query_prefix="query: ",
                                    passage_prefix="passage: "))
    examples, _ = read_training_examples(data, Corpus.open(corpus), lambda q, qu, h: encoder.compose([q], [qu])[0],
                                         lambda t: encoder.settings.passage_prefix + t, 3)
    dataset = examples_dataset(examples)
    embeddings = [torch.from_numpy(encoder._encode(dataset[column], False)) for column in dataset.column_names]
    return build_infonce_loss(encoder.model, 0.05, False).compute_loss_from_embeddings(embeddings, None).item()


def test_training_lowers_the_loss_and_exports_a_drop_in_encoder(tmp_path, tiny_model_dir, train_rows, corpus_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from agentic_retriever.training.trainer import train_retriever

    before = _fixed_batch_loss(tiny_model_dir, train_rows, corpus_path)
    out = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "retriever"))
    after = _fixed_batch_loss(str(out), train_rows, corpus_path)
    assert after < before - 0.1, (before, after)

    manifest = json.loads((out / "train_manifest.json").read_text())
    assert manifest["updates"] == 6 and manifest["passages_per_query"] == 4 and manifest["data"]["examples"] == 12
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert any("in_batch_accuracy" in m for m in metrics) and (out / "training_curves.png").stat().st_size > 0
    card = (out / "README.md").read_text()
    assert "library_name: sentence-transformers" in card and "Q [SEP] q" in card
    assert not (tmp_path / "retriever.checkpoints").exists()

    # loads without our code, encodes the same as our Encoder, and keeps the composition for our tools
    plain = SentenceTransformer(str(out), device="cpu")
    ours = Encoder(EncoderConfig(model=str(out), device="cpu"))  # as `plain`: one device, fp32
    assert ours.settings.composition == "question_sep_query" and ours.settings.query_prefix == "query: "
    assert ours.compose(["capital"], ["Where is X?"]) == ["query: Where is X? [SEP] capital"]
    np.testing.assert_allclose(plain.encode_query(["Where is X? [SEP] capital"], normalize_embeddings=True),
                               ours.encode_queries(["capital"], ["Where is X?"]), atol=1e-5)
    assert AutoModel.from_pretrained(str(out)).config.hidden_size == 32

    # the same data and settings: the finished folder is reused, not retrained
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert train_retriever(_config(tiny_model_dir, train_rows, corpus_path, out)) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_bf16_training_runs_under_autocast_learns_and_exports_fp32_weights(tmp_path, tiny_model_dir, train_rows,
                                                                           corpus_path):
    """bf16 on any device (on a CPU: what ``native`` picks where AMX multiplies it in hardware): the losses are
    bf16's (close to fp32's, not equal), the exported weights fp32, and its result cache apart from fp32's."""
    from safetensors.torch import load_file

    from agentic_retriever.training.trainer import train_retriever

    def first_losses(out):
        return [m["loss"] for m in map(json.loads, (out / "metrics.jsonl").open()) if "loss" in m][:3]

    before = _fixed_batch_loss(tiny_model_dir, train_rows, corpus_path)
    bf16 = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "bf16", precision="bf16"))
    fp32 = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "fp32", precision="fp32"))
    assert _fixed_batch_loss(str(bf16), train_rows, corpus_path) < before - 0.1
    assert {t.dtype for t in load_file(bf16 / "model.safetensors").values()} == {torch.float32}
    assert first_losses(bf16) != first_losses(fp32)
    np.testing.assert_allclose(first_losses(bf16), first_losses(fp32), rtol=0.05)
    fingerprint = json.loads((bf16 / "train_manifest.json").read_text())["fingerprint"]
    assert fingerprint != json.loads((fp32 / "train_manifest.json").read_text())["fingerprint"]


@pytest.mark.slow
def test_a_killed_run_resumes_on_the_same_schedule(tmp_path, tiny_model_dir, train_rows, corpus_path, monkeypatch):
    from agentic_retriever.training.trainer import train_retriever

    uninterrupted = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "a"))
    saved_at = kill_training_after_first_checkpoint(monkeypatch)  # the process dies right after checkpoint-3
    with pytest.raises(KeyboardInterrupt):
        train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "b"))
    assert not (tmp_path / "b").exists(), "an interrupted run leaves no model folder"
    resumed = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "b"))
    assert saved_at == [3, 6]  # the rerun went on from step 3
    from safetensors.torch import load_file

    a, b = load_file(uninterrupted / "model.safetensors"), load_file(resumed / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


def test_the_cached_loss_gives_the_same_loss_and_gradients(tiny_model_dir):
    from sentence_transformers import SentenceTransformer

    def loss_and_grads(cached: bool):
        torch.manual_seed(0)
        model = SentenceTransformer(tiny_model_dir, device="cpu")
        model.eval()  # no dropout: both passes see the same network
        texts = [[f"query {i}" for i in range(6)], [f"positive passage {i}" for i in range(6)],
                 [f"negative passage {i} words" for i in range(6)]]
        features = [model.tokenize(column) for column in texts]
        loss = build_infonce_loss(model, 0.05, False, cached=cached, mini_batch_size=2)
        value = loss(features, None)
        value.backward()
        return value.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain_loss, plain_grads = loss_and_grads(False)
    cached_loss, cached_grads = loss_and_grads(True)
    assert cached_loss == pytest.approx(plain_loss, rel=1e-5)
    assert plain_grads.keys() == cached_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(cached_grads[name], plain_grads[name], rtol=1e-3, atol=1e-6)


def test_deepspeed_without_the_extra_names_it(tmp_path, tiny_model_dir, train_rows, corpus_path):
    from agentic_retriever.training.trainer import train_retriever

    try:
        import deepspeed  # noqa: F401
        pytest.skip("deepspeed is installed here")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"agentic-retriever\[deepspeed\]"):
        train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r", deepspeed="configs/x.json"))


def test_the_first_warmup_update_already_learns(tmp_path, tiny_model_dir, train_rows, corpus_path):
    """4 updates, warmup_ratio 0.1: ceil(0.4) = 1 warm-up update at half the peak (Hugging Face's schedule, which
    transformers 5 reads a float warmup_steps < 1 for as a ratio, runs it at 0), the peak, then linear decay."""
    from transformers import TrainingArguments
    from transformers.optimization import _get_linear_schedule_with_warmup_lr_lambda as hf_linear

    from agentic_retriever.training.trainer import train_retriever

    hf_warmup = TrainingArguments(output_dir=str(tmp_path / "hf"), warmup_steps=0.1).get_warmup_steps(4)
    assert hf_warmup == 1 and hf_linear(0, num_warmup_steps=1, num_training_steps=4) == 0.0  # the bug we avoid
    out = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r", max_steps=4,
                                  warmup_ratio=0.1, learning_rate=1e-3))
    rates = [m["learning_rate"] for m in map(json.loads, (out / "metrics.jsonl").open()) if "learning_rate" in m]
    assert rates == pytest.approx([1e-3 / 2, 1e-3, 1e-3 * 2 / 3, 1e-3 / 3])  # the rate each update ran at


def test_rows_sharing_a_passage_never_share_a_batch_and_every_row_trains_each_epoch(
        tmp_path, tiny_model_dir, corpus_path, monkeypatch):
    """Three questions of four rounds each; a question's rounds share their positive. With the default
    no-duplicates sampler they never meet in a batch (each would be the other's false in-batch negative), so a
    batch of 4 holds at most 3 rows and a pass needs 4 batches, not ceil(12 / 4) = 3: every epoch takes them
    all (sentence-transformers' own length, 3, would leave rows out of every epoch)."""
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    from agentic_retriever.training.trainer import train_retriever

    rows = []
    for question in range(3):
        for round_index in range(4):
            row = agentic_row(4 * question + round_index, 10 + question, [20 + 4 * question + round_index],
                              question=f"Question {question}?")
            row["query_text"] = f"round {round_index} query"
            rows.append(row)
    data = write_rows(tmp_path / "rows.jsonl", rows)
    batches = []
    original = NoDuplicatesBatchSampler.__iter__

    def recording(self):
        counting = getattr(self, "_length", None) == 0  # the sampler measuring its passes, not training
        for batch in original(self):
            if not counting:
                batches.append((self.epoch, [self.dataset[i]["anchor"] + self.dataset[i]["negative_1"] for i in batch],
                                [text for i in batch for text in self.dataset[i].values()]))
            yield batch

    monkeypatch.setattr(NoDuplicatesBatchSampler, "__iter__", recording)
    out = train_retriever(_config(tiny_model_dir, data, corpus_path, tmp_path / "r", epochs=2))
    updates_per_epoch = json.loads((out / "train_manifest.json").read_text())["updates"] // 2
    assert updates_per_epoch >= 4
    for _, _, texts in batches:
        assert len(texts) == len(set(texts))
    for epoch in (0, 1):
        trained = [batch for e, batch, _ in batches if e == epoch][:updates_per_epoch]
        assert sorted(key for batch in trained for key in batch) == sorted(
            f"query: {r['question']} [SEP] {r['query_text']}passage: \"Title {r['passage_ids'][1]}\"\n"
            f"{PASSAGES[int(r['passage_ids'][1])]}" for r in rows)  # each row exactly once


def test_soft_label_training_logs_the_kl_and_names_the_loss(tmp_path, tiny_model_dir, corpus_path):
    from agentic_retriever.training.trainer import train_retriever

    rows = [agentic_row(i, pos=i, negs=[12 + 3 * i + k for k in range(3)], question=f"Question {i}?")
            for i in range(8)]
    for row in rows:
        row["scores"] = [{"em": 1, "local_utility": 0.9, "gac": 0.7}, {"em": 0, "local_utility": 0.6, "gac": 0.4},
                         {"em": 0, "local_utility": 0.2}, {"em": 0, "local_utility": 0.0, "gac": 0.1}]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    out = train_retriever(_config(tiny_model_dir, data, corpus_path, tmp_path / "r", loss="infonce",
                                  soft_label_weight=0.5, soft_label_key="gac+lr", epochs=1))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert any(m.get("soft_label_kl", 0) > 0 for m in metrics)
    manifest = json.loads((out / "train_manifest.json").read_text())
    assert manifest["settings"]["soft_label_weight"] == 0.5 and manifest["selection"] is None
    assert "0.5 x KL to softmax(gac+lr utility / 0.1)" in (out / "README.md").read_text()


# ------------------------------------------------------------------------------------------------ report_to


@pytest.fixture()
def fake_tensorboard(monkeypatch):
    """TensorBoard 'installed': our check and transformers' see it, and SummaryWriter is the recording one."""
    import sys
    import types

    import agentic_retriever.base.curves as curves

    made: list = []
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = lambda *args, **kwargs: RecordingSummaryWriter(made, *args, **kwargs)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    monkeypatch.setattr(curves, "integration_installed", lambda name: name == "tensorboard")
    monkeypatch.setattr("transformers.integrations.integration_utils.is_tensorboard_available", lambda: True)
    return made


def test_report_to_auto_none_and_names_of_missing_packages(monkeypatch, tmp_path):
    import agentic_retriever.base.curves as curves
    from transformers import TrainingArguments

    monkeypatch.setattr(curves, "integration_installed", lambda name: False)
    assert curves.resolve_report_to(["auto"]) == [] and curves.resolve_report_to(["none"]) == []
    with pytest.raises(ImportError, match=r"report_to wandb needs the wandb package: pip install 'agentic-retriever\[wandb\]'"):
        curves.resolve_report_to(["wandb"])
    with pytest.raises(ImportError, match=r"pip install 'agentic-retriever\[tensorboard\]'"):
        curves.resolve_report_to(["tensorboard"])
    with pytest.raises(ValueError, match=r"unknown 'mlflow'"):
        curves.resolve_report_to(["mlflow"])
    with pytest.raises(ValueError, match=r"'none' turns reporting off"):
        curves.resolve_report_to(["none", "wandb"])
    monkeypatch.setattr(curves, "integration_installed", lambda name: True)
    assert curves.resolve_report_to(["auto"]) == ["tensorboard"]
    assert curves.resolve_report_to(["wandb", "auto"]) == ["wandb", "tensorboard"]
    args = TrainingArguments(output_dir=str(tmp_path / "ckpt"),
                             **curves.hf_reporting(TrainingArguments, ["wandb"], tmp_path / "logs", run_name="r"))
    assert args.report_to == ["wandb"] and args.run_name == "r"


def test_retriever_training_reports_its_logs_to_tensorboard_in_out_logs(tmp_path, tiny_model_dir, train_rows,
                                                                         corpus_path, fake_tensorboard):
    from agentic_retriever.training.trainer import train_retriever

    out = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r", max_steps=2,
                                  report_to=["tensorboard"]))
    (writer,) = fake_tensorboard
    assert writer.log_dir == str(tmp_path / "r.logs") and writer.closed
    assert json.loads(writer.texts["args"])["report_to"] == ["tensorboard"]  # the TrainingArguments it was given
    tags = {tag for tag, _, _ in writer.scalars}
    assert {"train/loss", "train/in_batch_accuracy", "train/learning_rate"} <= tags
    assert sorted({step for tag, _, step in writer.scalars if tag == "train/loss"}) == [1, 2]
    manifest = json.loads((out / "train_manifest.json").read_text())
    assert manifest["report_to"] == ["tensorboard"] and manifest["logs"] == str(tmp_path / "r.logs")
    assert (out / "metrics.jsonl").is_file() and (out / "training_curves.png").is_file()  # as before


def test_retriever_training_without_the_asked_for_package_names_it_before_training(
        tmp_path, tiny_model_dir, train_rows, corpus_path, monkeypatch):
    import agentic_retriever.base.curves as curves
    from agentic_retriever.training.trainer import train_retriever

    monkeypatch.setattr(curves, "integration_installed", lambda name: False)
    with pytest.raises(ImportError, match=r"pip install 'agentic-retriever\[wandb\]'"):
        train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r", report_to=["wandb"]))
    with pytest.raises(ValueError, match=r"report_to: unknown 'tensorbord'"):
        _config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r", report_to=["tensorbord"]).validate()
    out = train_retriever(_config(tiny_model_dir, train_rows, corpus_path, tmp_path / "r", max_steps=1))
    assert json.loads((out / "train_manifest.json").read_text())["report_to"] == []  # auto, nothing installed
    assert not (tmp_path / "r.logs").exists()
