"""Contrastive retriever training (agentic_r.txt section 4.1.2): mined rows -> a drop-in encoder folder.

Built on `SentenceTransformerTrainer` (a Hugging Face `Trainer`: schedule, checkpoints, resume, mixed
precision, gradient checkpointing, DDP under ``torchrun``, DeepSpeed through ``--deepspeed CONFIG``) and the
Eq. 5 loss of `losses`. What this module adds: reading mined rows with the encoder's query composition and
prefixes (`data`), the in-batch accuracy in the logs, the metrics file and curves PNG (`curves`), the
exported folder with its settings and model card (`export`), and a result cache keyed by data and settings.

One process, or several under ``torchrun --nproc_per_node G`` (gloo on CPU, NCCL on GPU): each process takes
``per_device_batch_size`` queries per step and the loss sees the passages of all G processes.

    out = train_retriever(RetrieverTrainConfig(data="mining/retriever_train.jsonl", corpus="corpus.jsonl",
                                               out="runs/x/retriever"))
    SentenceTransformer(str(out))   # or Encoder(EncoderConfig(model=str(out))), which applies the composition
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from sentence_transformers import SentenceTransformerTrainer

from ..corpus import Corpus
from ..encoder import Encoder
from ..jsonl import read_json
from .config import RetrieverTrainConfig
from .curves import write_training_curves
from .data import TrainingExample, read_training_examples
from .export import MANIFEST_FILE, save_trained_encoder

__all__ = ["RetrieverTrainConfig", "examples_dataset", "train_retriever"]

log = logging.getLogger(__name__)


def examples_dataset(examples: list[TrainingExample]):
    """A `datasets.Dataset` in sentence-transformers' column layout: anchor, positive, negative_1..negative_k."""
    from datasets import Dataset

    if not examples:
        raise ValueError("no training examples")
    columns = {"anchor": [e.query for e in examples], "positive": [e.positive for e in examples]}
    for k in range(len(examples[0].negatives)):
        columns[f"negative_{k + 1}"] = [e.negatives[k] for e in examples]
    return Dataset.from_dict(columns)


def _fingerprint(config: RetrieverTrainConfig, examples: list[TrainingExample]) -> str:
    digest = hashlib.sha256()
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("out", "progress", "save_steps")}
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for example in examples:
        digest.update(json.dumps([example.query, example.positive, example.negatives]).encode())
    return digest.hexdigest()[:32]


def _precision(config: RetrieverTrainConfig, on_gpu: bool) -> dict:
    if config.precision == "auto":
        return {"fp16": on_gpu}
    if config.precision in ("fp16", "bf16") and not on_gpu:
        raise ValueError(f"precision {config.precision} needs a GPU; use fp32 or auto on CPU")
    return {"fp16": config.precision == "fp16", "bf16": config.precision == "bf16"}


def _deepspeed(config: RetrieverTrainConfig) -> str | None:
    if not config.deepspeed:
        return None
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        raise ImportError("--deepspeed needs DeepSpeed: pip install 'agentic-retriever[deepspeed]'") from None
    if not Path(config.deepspeed).is_file():
        raise FileNotFoundError(f"DeepSpeed config not found: {config.deepspeed}")
    return config.deepspeed


def train_retriever(config: RetrieverTrainConfig) -> Path:
    """Train the encoder on `config.data` and export it to `config.out`; return that folder.

    A finished folder for the same data and settings is reused as is. Otherwise checkpoints go to
    ``OUT.checkpoints/`` every `save_steps` updates and a rerun after a kill resumes from the last one, on the
    same schedule. The export is written to a temporary sibling and renamed (only by the main process).
    """
    import torch
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from transformers.trainer_utils import get_last_checkpoint

    from .losses import build_infonce_loss

    config.validate()
    started = time.perf_counter()
    encoder = Encoder(dataclasses.replace(config.encoder, dtype="float32", device="cpu"))
    settings = encoder.settings
    corpus = Corpus.open(config.corpus) if config.corpus else None
    examples, counts = read_training_examples(
        config.data, corpus, lambda q, question, history: encoder.compose([q], [question], [list(history)])[0],
        lambda text: settings.passage_prefix + text, config.num_negatives, config.skip_bad_rows)
    if not examples:
        raise ValueError(f"no training example in {config.data} ({counts})")
    out = Path(config.out)
    fingerprint = _fingerprint(config, examples)
    if (out / MANIFEST_FILE).is_file() and read_json(out / MANIFEST_FILE).get("fingerprint") == fingerprint:
        log.info("reusing the trained retriever in %s (same data and settings)", out)
        return out

    on_gpu = torch.cuda.is_available()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    checkpoints = out.with_name(out.name + ".checkpoints")
    args = SentenceTransformerTrainingArguments(
        output_dir=str(checkpoints), num_train_epochs=config.epochs, max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_batch_size, learning_rate=config.learning_rate,
        warmup_steps=config.warmup_ratio, weight_decay=config.weight_decay, lr_scheduler_type="linear",
        gradient_checkpointing=config.gradient_checkpointing, deepspeed=_deepspeed(config),
        logging_steps=config.logging_steps, save_steps=config.save_steps, save_total_limit=2, seed=config.seed,
        data_seed=config.seed, use_cpu=not on_gpu, report_to=[], disable_tqdm=not config.progress,
        dataloader_drop_last=world_size > 1,  # cross-device gathering needs equal batches on every process
        ddp_backend=("nccl" if on_gpu else "gloo") if world_size > 1 else None,
        batch_sampler=BatchSamplers.NO_DUPLICATES if config.batch_sampler == "no_duplicates" else BatchSamplers.BATCH_SAMPLER,
        **_precision(config, on_gpu))
    model = encoder.model
    loss = build_infonce_loss(model, config.temperature, config.gather_across_devices and world_size > 1,
                              config.cached, config.mini_batch_size)
    trainer = _Trainer(model=model, args=args, train_dataset=examples_dataset(examples), loss=loss)
    last = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    if last:
        log.info("resuming retriever training from %s", last)
    result = trainer.train(resume_from_checkpoint=last)
    if not trainer.is_world_process_zero():
        return out
    manifest = {
        "fingerprint": fingerprint, "base_model": config.encoder.model, "settings": dataclasses.asdict(config),
        "encoder_settings": dataclasses.asdict(settings), "data": counts, "world_size": world_size,
        "global_batch_queries": config.per_device_batch_size * world_size,
        "passages_per_query": 1 + len(examples[0].negatives), "updates": trainer.state.global_step,
        "train_loss": result.training_loss, "seconds": round(time.perf_counter() - started, 1),
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
    }
    save_trained_encoder(model, settings, out, manifest,
                         lambda folder: write_training_curves(trainer.state.log_history, folder, "retriever training"))
    shutil.rmtree(checkpoints, ignore_errors=True)
    log.info("wrote the trained retriever to %s (%d updates, train loss %.4f)", out, trainer.state.global_step,
             result.training_loss)
    return out


class _Trainer(SentenceTransformerTrainer):
    """Adds the loss's in-batch accuracy (since the last log) to every log entry that has the loss."""

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs and hasattr(self.loss, "accuracy"):
            accuracy = self.loss.accuracy.pop()
            if accuracy is not None:
                logs["in_batch_accuracy"] = round(accuracy, 4)
        super().log(logs, *args, **kwargs)
