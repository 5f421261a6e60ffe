"""LoRA retriever training (`retriever_train.lora`) on a decoder embedder: the adapter alone trains, the merged
export is a plain folder that loads without PEFT and encodes as the adapter model does, the adapter-only export
loads through PEFT, and a run started from an adapter-only export trains that adapter on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from agentic_retriever.base.encoder import Encoder, EncoderConfig
from agentic_retriever.training.config import LoraSettings
from tests.fakes import write_training_corpus
from tests.training.test_training import agentic_row, write_rows

ROOT = Path(__file__).resolve().parents[2]
QUERIES = (["topic 3 words", "topic 5 words"], ["Question 3?", "Question 5?"])
PASSAGES = ['"Title 3"\nPassage number 3 about topic 3 and some words 6.', '"Title 9"\nPassage number 9 about topic 2.']


@pytest.fixture()
def corpus_path(tmp_path):
    return write_training_corpus(tmp_path / "corpus.jsonl")


@pytest.fixture()
def rows(tmp_path):
    return write_rows(tmp_path / "rows.jsonl", [agentic_row(i, pos=i, negs=[12 + 3 * i + k for k in range(3)],
                                                            question=f"Question {i}?") for i in range(12)])


def _config(model: str, rows, corpus, out, **overrides):
    from agentic_retriever.training.config import RetrieverTrainConfig

    settings = dict(data=str(rows), corpus=str(corpus), out=str(out), per_device_batch_size=4, learning_rate=5e-3,
                    epochs=2, temperature=0.05, warmup_ratio=0.0, save_steps=3, logging_steps=1, progress=False,
                    precision="fp32",  # on a GPU too (auto: fp16 there): the two exports compare at fp32's rounding
                    encoder=EncoderConfig(model=model, composition="question_sep_query"),
                    lora=LoraSettings(rank=4, alpha=8.0, dropout=0.0))
    return RetrieverTrainConfig(**(settings | overrides))


def _embeddings(model: str) -> np.ndarray:
    encoder = Encoder(EncoderConfig(model=model, device="cpu"))
    return np.concatenate([encoder.encode_queries(*QUERIES), encoder.encode_passages(PASSAGES)])


def test_lora_trains_the_adapter_alone_and_exports_it_merged_or_alone(tmp_path, tiny_decoder_embedder_dir, rows,
                                                                      corpus_path):
    from agentic_retriever.training.trainer import train_retriever

    base = _embeddings(tiny_decoder_embedder_dir)
    merged = train_retriever(_config(tiny_decoder_embedder_dir, rows, corpus_path, tmp_path / "merged"))
    alone = train_retriever(_config(tiny_decoder_embedder_dir, rows, corpus_path, tmp_path / "alone",
                                    lora=LoraSettings(rank=4, alpha=8.0, dropout=0.0, merge=False)))

    manifest = json.loads((merged / "train_manifest.json").read_text())
    counts = manifest["parameters"]
    assert 0 < counts["trainable_parameters"] < 0.2 * counts["parameters"]
    assert manifest["lora"]["adapter_exported"] is False
    assert manifest["updates"] == 6
    # the merged export: plain weights at the root, no adapter files; the adapter-only export: LoRA weights alone
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    assert not any("lora" in name for name in load_file(merged / "model.safetensors"))
    adapter = load_file(alone / "adapter_model.safetensors")
    assert adapter and all("lora_" in name for name in adapter) and not (alone / "model.safetensors").exists()
    assert json.loads((alone / "train_manifest.json").read_text())["lora"]["adapter_exported"] is True
    assert "merged into the weights" in (merged / "README.md").read_text()
    assert "holds the adapter alone" in (alone / "README.md").read_text()

    # the merged folder and the adapter encode alike, both differ from the base (training moved them)
    trained = _embeddings(str(merged))
    np.testing.assert_allclose(_embeddings(str(alone)), trained, atol=1e-5)
    assert np.abs(trained - base).max() > 1e-3

    # plain sentence-transformers loads the merged folder with PEFT made unimportable, and encodes the same
    code = (f"import sys, json; sys.modules['peft'] = None\n"
            f"from sentence_transformers import SentenceTransformer\n"
            f"m = SentenceTransformer({str(merged)!r}, device='cpu')\n"
            f"print(json.dumps(m.encode_document({PASSAGES!r}).tolist()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(np.array(json.loads(done.stdout.splitlines()[-1])), trained[2:], atol=1e-5)


def test_a_run_from_an_adapter_only_export_trains_that_adapter_on(tmp_path, tiny_decoder_embedder_dir, rows,
                                                                  corpus_path):
    """The loop's Agentic-R_{i-1} exported adapter-only is the start of iteration i: its adapter trains on (not a
    second one stacked on it), and a rank other than its own is refused before training."""
    from agentic_retriever.training.trainer import train_retriever

    alone = LoraSettings(rank=4, alpha=8.0, dropout=0.0, merge=False)
    first = train_retriever(_config(tiny_decoder_embedder_dir, rows, corpus_path, tmp_path / "it1", lora=alone))
    second = train_retriever(_config(str(first), rows, corpus_path, tmp_path / "it2", lora=alone))
    before, after = load_file(first / "adapter_model.safetensors"), load_file(second / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    assert max(np.abs(after[name] - before[name]).max() for name in before) > 0
    config = json.loads((second / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]).resolve() == Path(tiny_decoder_embedder_dir).resolve()

    with pytest.raises(ValueError, match="rank 4; lora.rank 8 would stack a second one"):
        train_retriever(_config(str(first), rows, corpus_path, tmp_path / "it2b",
                                lora=LoraSettings(rank=8, merge=False)))


def test_lora_under_gradient_checkpointing_and_bf16_autocast_still_moves_the_adapter(
        tmp_path, tiny_decoder_embedder_dir, rows, corpus_path):
    """With the base frozen, recomputed activations need inputs that require gradients (transformers sets that for
    adapters): the adapter's B matrices, zero at the start, are not zero after two updates."""
    from agentic_retriever.training.trainer import train_retriever

    out = train_retriever(_config(tiny_decoder_embedder_dir, rows, corpus_path, tmp_path / "gc", max_steps=2,
                                  gradient_checkpointing=True, precision="bf16",
                                  lora=LoraSettings(rank=4, alpha=8.0, dropout=0.0, merge=False)))
    adapter = load_file(out / "adapter_model.safetensors")
    updates = [np.abs(weights).max() for name, weights in adapter.items() if "lora_B" in name]
    assert updates and min(updates) > 0


def test_lora_settings_are_checked():
    for settings, message in ((LoraSettings(rank=-1), "at least 0"), (LoraSettings(rank=4, alpha=0), "alpha"),
                              (LoraSettings(rank=4, dropout=1.0), "dropout"),
                              (LoraSettings(rank=4, target_modules=[]), "target_modules")):
        with pytest.raises(ValueError, match=message):
            settings.validate()
    LoraSettings().validate()  # rank 0: no adapter, nothing else checked
