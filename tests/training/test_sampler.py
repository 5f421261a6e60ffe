"""Batches for several processes (agentic_retriever/training/sampler.py, `StepNoDuplicatesBatchSampler`), read
through accelerate's own `BatchSamplerShard` as the Hugging Face trainer shards them over processes: a step's
batches share no text (the loss gathers them), every batch is full, every row is in every epoch."""

from __future__ import annotations

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard
from datasets import Dataset

from agentic_retriever.training.sampler import StepNoDuplicatesBatchSampler


def _rounds(questions: int, rounds: int) -> Dataset:
    """Rows of mined rounds: the rounds of a question share their positive (the case that defers rows)."""
    return Dataset.from_list([{"anchor": f"q{q} round {r}", "positive": f"positive of {q}",
                               "negative_1": f"negative {q}-{r}"} for q in range(questions) for r in range(rounds)])


def _steps(sampler, processes: int, epoch: int) -> list[list[list[int]]]:
    """Per step, each process's batch, as accelerate gives them out."""
    sampler.set_epoch(epoch)
    per_process = [list(BatchSamplerShard(sampler, processes, rank)) for rank in range(processes)]
    assert len({len(batches) for batches in per_process}) == 1  # every process takes as many steps
    return [list(step) for step in zip(*per_process)]


@pytest.mark.parametrize("processes, batch_size", [(2, 2), (3, 1), (2, 3)])
def test_a_steps_batches_share_no_text_are_full_and_every_row_trains_each_epoch(processes, batch_size):
    dataset = _rounds(questions=7, rounds=4)
    generator = torch.Generator().manual_seed(0)
    sampler = StepNoDuplicatesBatchSampler(dataset, batch_size, processes, generator=generator, seed=0, epochs=2)
    for epoch in range(2):
        steps = _steps(sampler, processes, epoch)
        assert len(steps) * processes == len(sampler)
        for step in steps:
            assert all(len(batch) == batch_size for batch in step)
            texts = [text for batch in step for i in batch for text in dataset[i].values()]
            assert len(texts) == len(set(texts))  # no false negative gathered from another process
        assert {i for step in steps for batch in step for i in batch} == set(range(len(dataset)))


def test_every_process_computes_the_same_batches_from_the_seed():
    dataset = _rounds(questions=5, rounds=3)
    samplers = [StepNoDuplicatesBatchSampler(dataset, 2, 2, generator=torch.Generator().manual_seed(7), seed=7)
                for _ in range(2)]  # one per process, each with its own generator seeded as the trainer does
    assert list(samplers[0]) == list(samplers[1])


def test_a_step_that_cannot_be_filled_without_a_duplicate_is_refused():
    dataset = _rounds(questions=2, rounds=4)  # 2 distinct positives: no step of 3 rows without a duplicate
    sampler = StepNoDuplicatesBatchSampler(dataset, 3, 2, generator=torch.Generator().manual_seed(0), seed=0)
    with pytest.raises(ValueError, match="lower per_device_batch_size"):
        len(sampler)


def _train_as_rank(rank: int, world: int, port: int, config, out: str) -> None:
    """One process of a torchrun-like job (the environment torchrun sets) training with `train_retriever`; the
    batches its sampler yields (every process computes all of them) are recorded with their epoch."""
    import json
    import os

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      CUDA_VISIBLE_DEVICES="")  # two CPU processes with gloo, on a GPU host too (not two on one card)
    from agentic_retriever.training import checkpoint_selection
    from agentic_retriever.training import sampler as sampler_module
    from agentic_retriever.training.trainer import train_retriever

    seen, scored, original, evaluate = [], [], sampler_module.StepNoDuplicatesBatchSampler.__iter__, \
        checkpoint_selection.evaluate_on_pool

    def recording(self):
        for batch in original(self):
            seen.append((self.epoch, [self.dataset[i]["anchor"] for i in batch]))
            yield batch

    def counted(*args, **kwargs):
        scored.append(1)
        return evaluate(*args, **kwargs)

    sampler_module.StepNoDuplicatesBatchSampler.__iter__ = recording
    checkpoint_selection.evaluate_on_pool = counted
    train_retriever(config)
    with open(f"{out}/rank{rank}.json", "w") as handle:
        json.dump({"batches": seen, "scored": len(scored)}, handle)


@pytest.mark.slow
def test_two_gloo_processes_train_every_row_each_epoch_without_a_shared_text_in_a_step(tmp_path, tiny_model_dir):
    """`retriever train` under two processes (gloo): the HF trainer shards our sampler's batches with accelerate;
    each step's two batches (gathered by the loss) share no passage, every row trains in every epoch, and held-out
    selection runs on both processes while the main one alone records it."""
    import json

    import torch.multiprocessing as mp

    from agentic_retriever.base.encoder import EncoderConfig
    from agentic_retriever.index import IndexBuildConfig, build_index
    from tests.fakes import free_port
    from tests.training.test_training import PASSAGES, _config, agentic_row, write_rows

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"Title {i}"\n{t}'}) + "\n"
                              for i, t in enumerate(PASSAGES)))
    rows = []
    for question in range(5):  # a question's four rounds share their positive
        for round_index in range(4):
            row = agentic_row(4 * question + round_index, 40 + question, [20 + 4 * question + round_index],
                              question=f"Question {question}?")
            row["query_text"] = f"round {round_index} query"
            rows.append(row)
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "index"),
                                 encoder=EncoderConfig(model=tiny_model_dir)))
    heldout = write_rows(tmp_path / "heldout.jsonl", [
        {"id": f"h{i}", "question": f"What is about topic {i % 7}?", "golden_answers": [str(i)],
         "supporting_titles": [f"Title {i}"]} for i in (1, 9, 17)])
    config = _config(tiny_model_dir, write_rows(tmp_path / "rows.jsonl", rows), corpus, tmp_path / "r",
                     per_device_batch_size=2, epochs=2, save_steps=1000, select_on=str(heldout),
                     select_index=str(tmp_path / "index"), select_pool=30)
    mp.start_processes(_train_as_rank, args=(2, free_port(), config, str(tmp_path)), nprocs=2, start_method="spawn")
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    seen = [record["batches"] for record in records]
    manifest = json.loads((tmp_path / "r" / "train_manifest.json").read_text())
    # both processes computed the same batches; accelerate gives batch j to process j % 2, so a step is a pair
    assert seen[0] == seen[1] and manifest["world_size"] == 2 and len(seen[0]) == 2 * manifest["updates"]
    # held-out selection: both processes scored the base and each epoch (none waited for the other); one record
    assert [record["scored"] for record in records] == [3, 3]
    assert set(manifest["selection"]["per_checkpoint"]) == {"base", "epoch-1", "epoch-2"}
    for epoch in (0, 1):
        batches = [batch for e, batch in seen[0] if e == epoch]
        steps = list(zip(batches[0::2], batches[1::2]))
        assert all(len(a) == len(b) == 2 for a, b in steps) and 2 * len(steps) == len(batches)
        for a, b in steps:  # one positive per question: four different questions in a step
            assert len({anchor.split(" [SEP] ")[0] for anchor in a + b}) == 4
        assert {anchor.split(" [SEP] ")[1] + anchor.split(" [SEP] ")[0] for a, b in steps for anchor in a + b} == {
            f"round {r} queryquery: Question {q}?" for q in range(5) for r in range(4)}
