"""The retriever's checkpoints and export under real faults: a `retriever train` process SIGKILLed at points inside
its checkpoint saves and its export, or given a full disk, then the same training again. The rerun finishes with
the weights an uninterrupted run exports (resumed from the last whole checkpoint, never from a partial one), and
leaves no partial folder behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.fakes import write_training_corpus
from tests.faults.harness import as_literal, killed, run_child, succeeded

pytestmark = pytest.mark.slow

def _inputs(folder: Path) -> tuple[Path, Path]:
    corpus = write_training_corpus(folder / "corpus.jsonl")
    rows = folder / "retriever_train.jsonl"
    rows.write_text("".join(json.dumps({
        "dataset": "t", "query_id": str(i), "question": f"Question {i}?", "round_index": 1, "history_queries": [],
        "query_text": f"topic {i % 7} words", "passage_ids": [str(i), *(str(12 + 3 * i + k) for k in range(3))],
        "scores": [{"em": 1, "local_utility": 0.9}] + [{"em": 0, "local_utility": 0.1}] * 3}) + "\n"
        for i in range(12)))
    return corpus, rows


def _train_code(model: str, corpus: Path, rows: Path, out: Path, learning_rate: float = 5e-4,
                lora_rank: int = 0) -> str:
    """`retriever train` as a library call: 2 epochs of 3 updates, a checkpoint every 3 (checkpoint-3, -6); with
    `lora_rank`, a LoRA adapter of that rank, exported alone."""
    settings = dict(data=str(rows), corpus=str(corpus), out=str(out), per_device_batch_size=4,
                    learning_rate=learning_rate, epochs=2, temperature=0.05, warmup_ratio=0.0, save_steps=3,
                    logging_steps=1, progress=False)
    return f"""
        import logging
        logging.basicConfig(level=logging.INFO)
        from agentic_retriever.base.encoder import EncoderConfig
        from agentic_retriever.training.config import LoraSettings, RetrieverTrainConfig
        from agentic_retriever.training.trainer import train_retriever
        encoder = EncoderConfig(model={model!r}, composition="question_sep_query", query_prefix="query: ",
                                passage_prefix="passage: ")
        lora = LoraSettings(rank={lora_rank}, alpha=8.0, dropout=0.0, merge=False)
        print(train_retriever(RetrieverTrainConfig(**{as_literal(settings)}, encoder=encoder, lora=lora)))
    """


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir) -> dict[str, np.ndarray]:
    folder = tmp_path_factory.mktemp("uninterrupted")
    corpus, rows = _inputs(folder)
    succeeded(run_child(_train_code(tiny_model_dir, corpus, rows, folder / "retriever")))
    return load_file(folder / "retriever" / "model.safetensors")


def _assert_same_weights(out: Path, expected: dict[str, np.ndarray], weights: str = "model.safetensors") -> None:
    got = load_file(out / weights)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5, err_msg=name)


def _leftovers(folder: Path) -> list[str]:
    """What a finished run should not leave beside its output: checkpoints, temporary or set-aside folders."""
    return sorted(p.name for p in folder.iterdir()
                  if p.name.endswith((".checkpoints", ".tmp", ".replaced")) or p.name.startswith(".retriever"))


@pytest.mark.parametrize("kill_at, nth, reached", [
    # the case: killed while checkpoint-3 has its weights but no trainer_state.json yet
    ("transformers.trainer_callback:TrainerState.save_to_json", 1, "checkpoint-3 without trainer_state.json"),
    # checkpoint-3 whole and marked, checkpoint-6 written but killed before its marker: resume from 3
    ("agentic_retriever.base.hf_checkpoints:write_json", 2, "checkpoint-6 without its marker"),
    # training done, the export folder filled but not yet renamed in
    ("agentic_retriever.base.jsonl:give_new_file_modes", 1, "the export not yet renamed in"),
], ids=["mid-checkpoint", "before-the-marker", "before-the-export-rename"])
def test_a_training_killed_while_saving_resumes_to_the_uninterrupted_weights(
        kill_at, nth, reached, tmp_path, tiny_model_dir, uninterrupted):
    corpus, rows = _inputs(tmp_path)
    out = tmp_path / "retriever"
    code = _train_code(tiny_model_dir, corpus, rows, out)
    assert killed(run_child(code, kill_at=kill_at, nth=nth)), reached
    checkpoints = tmp_path / "retriever.checkpoints"
    if nth == 1 and "save_to_json" in kill_at:
        assert (checkpoints / "checkpoint-3").is_dir() and not (checkpoints / "checkpoint-3/trainer_state.json").exists()
    if "hf_checkpoints" in kill_at:
        assert (checkpoints / "checkpoint-3/checkpoint_complete.json").is_file()
        assert not (checkpoints / "checkpoint-6/checkpoint_complete.json").exists()
    assert not (out / "train_manifest.json").exists()

    again = succeeded(run_child(code))
    if "hf_checkpoints" in kill_at:
        assert "resuming retriever training from" in again.stderr and "checkpoint-3" in again.stderr
    _assert_same_weights(out, uninterrupted)
    assert _leftovers(tmp_path) == []


def test_a_kill_between_the_exports_renames_leaves_the_output_whole_or_absent(tmp_path, tiny_model_dir, uninterrupted):
    """An older export in OUT, a new training with other settings killed after OUT was renamed aside and before the
    new folder took its place: OUT is absent (not half-deleted with its manifest), and the rerun writes the new
    export whole."""
    corpus, rows = _inputs(tmp_path)
    out = tmp_path / "retriever"
    succeeded(run_child(_train_code(tiny_model_dir, corpus, rows, out, learning_rate=1e-4)))
    code = _train_code(tiny_model_dir, corpus, rows, out)
    assert killed(run_child(code, kill_at="pathlib:Path.rename", nth=2))
    assert not out.exists()
    assert [p.name for p in tmp_path.glob(".retriever.*.replaced")]  # the old export, set aside whole
    succeeded(run_child(code))
    _assert_same_weights(out, uninterrupted)
    assert _leftovers(tmp_path) == []


def test_a_full_disk_while_checkpointing_names_the_disk_and_the_rerun_finishes(tmp_path, tiny_model_dir,
                                                                                uninterrupted):
    """A file-size limit below the optimiser state's size (the disk that fills during a checkpoint): the run
    stops with an error that says the disk is full and names the checkpoint folder; with space back, the same
    training resumes and exports the uninterrupted run's weights."""
    corpus, rows = _inputs(tmp_path)
    out = tmp_path / "retriever"
    code = _train_code(tiny_model_dir, corpus, rows, out)
    weights = sum(array.nbytes for array in uninterrupted.values())
    full = run_child(code, fsize=weights + 4096)  # the weights fit, the optimiser's two moments do not
    assert full.returncode != 0 and not killed(full)
    assert "DiskFullError" in full.stderr and "no space left while writing" in full.stderr
    assert str(tmp_path / "retriever.checkpoints") in full.stderr
    succeeded(run_child(code))
    _assert_same_weights(out, uninterrupted)
    assert _leftovers(tmp_path) == []


def test_a_lora_training_killed_before_its_second_checkpoint_is_marked_resumes_to_the_uninterrupted_adapter(
        tmp_path, tiny_decoder_embedder_dir):
    """LoRA on a decoder embedder: its checkpoints hold the adapter alone, and a SIGKILL after checkpoint-6 was
    written, before its marker, resumes from checkpoint-3's adapter to the adapter an uninterrupted run exports."""
    expected_folder = tmp_path / "uninterrupted"
    expected_folder.mkdir()
    corpus, rows = _inputs(expected_folder)
    succeeded(run_child(_train_code(tiny_decoder_embedder_dir, corpus, rows, expected_folder / "retriever",
                                    learning_rate=5e-3, lora_rank=4)))
    expected = load_file(expected_folder / "retriever" / "adapter_model.safetensors")
    assert expected and all("lora_" in name for name in expected)

    corpus, rows = _inputs(tmp_path)
    out = tmp_path / "retriever"
    code = _train_code(tiny_decoder_embedder_dir, corpus, rows, out, learning_rate=5e-3, lora_rank=4)
    assert killed(run_child(code, kill_at="agentic_retriever.base.hf_checkpoints:write_json", nth=2))
    checkpoint = tmp_path / "retriever.checkpoints" / "checkpoint-3"
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    again = succeeded(run_child(code))
    assert "resuming retriever training from" in again.stderr and "checkpoint-3" in again.stderr
    _assert_same_weights(out, expected, "adapter_model.safetensors")
    assert _leftovers(tmp_path) == []
