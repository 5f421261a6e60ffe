"""Contrastive retriever training: mined rows -> a drop-in encoder folder.

The method is "Agentic-R: Learning to Retrieve for Agentic Search", section 4.1.2.

Built on `SentenceTransformerTrainer` (a Hugging Face `Trainer`: checkpoints, resume, mixed precision,
gradient checkpointing, DDP under ``torchrun``, DeepSpeed through ``--deepspeed CONFIG``) and the objectives
of `losses` (Eq. 5, optionally with REPLUG's soft-label KL). What this module adds: reading mined rows with
the encoder's query composition and prefixes, without exact duplicates (`data`); batches in which no text
appears twice (the default; `sampler`: two rounds of one question share passages, which would otherwise be
each other's false in-batch negatives); a warm-up whose first
update already learns (`schedule`); model selection on held-out training questions that exports the base
unchanged when training does not help (`checkpoint_selection`); LoRA on the transformer instead of every weight,
exported merged or alone (`lora`, ``lora.rank``); the in-batch accuracy and KL in the logs, the metrics
file and curves PNG (`agentic_retriever.base.curves`), and the logs to TensorBoard or W&B (``report_to``, files in
``OUT.logs/``); the exported folder with its settings and model card (`export`); and a
result cache keyed by data and settings.

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
import math
import os
import shutil
import time
from pathlib import Path

from sentence_transformers import SentenceTransformerTrainer

from agentic_retriever.base.adapters import peft_model_of
from agentic_retriever.base.corpus import Corpus
from agentic_retriever.base.curves import hf_reporting, resolve_report_to, train_resuming, write_training_curves
from agentic_retriever.base.encoder import Encoder
from agentic_retriever.base.precision import resolve
from agentic_retriever.base.writer_lock import WriterLock, lock_beside
from .config import LoraSettings, RetrieverTrainConfig
from .data import TrainingExample, read_training_examples
from .export import read_whole_export, save_trained_encoder
from .lora import load_adapter_weights, merged, prepare_trainable
from .schedule import warmup_linear_schedule

__all__ = ["RetrieverTrainConfig", "examples_dataset", "train_retriever"]

log = logging.getLogger(__name__)


def examples_dataset(examples: list[TrainingExample]):
    """A `datasets.Dataset` in sentence-transformers' column layout: anchor, positive, negative_1..negative_k,
    and, when the examples carry utilities, ``label`` (N numbers per row; the collator hands it to the loss
    as ``labels``, and the no-duplicates sampler ignores it)."""
    from datasets import Dataset

    if not examples:
        raise ValueError("no training examples")
    columns = {"anchor": [e.query for e in examples], "positive": [e.positive for e in examples]}
    for k in range(len(examples[0].negatives)):
        columns[f"negative_{k + 1}"] = [e.negatives[k] for e in examples]
    if examples[0].utilities is not None:
        columns["label"] = [list(e.utilities) for e in examples]
    return Dataset.from_dict(columns)


def _fingerprint(config: RetrieverTrainConfig, examples: list[TrainingExample]) -> str:
    digest = hashlib.sha256()
    settings = {k: v for k, v in dataclasses.asdict(config).items()
                if k not in ("out", "progress", "save_steps", "report_to")}
    if config.lora == LoraSettings():  # added later: at its default, a finished export keeps its fingerprint
        del settings["lora"]
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for example in examples:
        digest.update(json.dumps([example.query, example.positive, example.negatives, example.utilities]).encode())
    for path in (config.select_on, config.select_parents):  # the held-out questions, not only their paths
        if config.select_on and path:
            digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:32]


def _precision(config: RetrieverTrainConfig, on_gpu: bool) -> dict:
    """The Trainer's mixed-precision flags (`precision.resolve`, role ``retriever_training``): fp16 on a GPU for ``auto`` (the paper), fp32 on a CPU; bf16 is autocast on
    either (fp32 master weights: the exported encoder is fp32), worth it on a CPU with AMX tiles, where ``native``
    picks it (RESULTS: "The demo in bf16 on a CPU with AMX"; `RetrieverTrainConfig` has resolved it already)."""
    precision = resolve(config.precision, "cuda" if on_gpu else "cpu", "retriever_training")
    return {"fp16": precision == "fp16", "bf16": precision == "bf16"}


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
    same schedule. With `select_on`, the base and every epoch are scored on the held-out questions and the
    best is exported (the base weights unchanged when it wins; `checkpoint_selection`). The export is written to a
    temporary sibling and renamed (only by the main process), and a finished folder is reused only when it holds
    every file its manifest lists. Checkpoints count once marked whole (`hf_checkpoints`). The main process holds
    ``OUT.lock`` throughout: a second run on the same output is refused with WriterLockedError.
    """
    config.validate()
    out = Path(config.out)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun the main process holds the output's lock
        return _train_retriever(config)
    with WriterLock(lock_beside(out), f"the retriever output {out}"):
        return _train_retriever(config)


def _train_retriever(config: RetrieverTrainConfig) -> Path:
    import torch
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers

    from .losses import build_loss

    report_to = resolve_report_to(config.report_to)
    started = time.perf_counter()
    encoder = Encoder(dataclasses.replace(config.encoder, precision="fp32", device="cpu"))
    settings = encoder.settings
    corpus = Corpus.open(config.corpus) if config.corpus else None
    examples, counts = read_training_examples(
        config.data, corpus, lambda q, question, history: encoder.compose([q], [question], [list(history)])[0],
        lambda text: settings.passage_prefix + text, config.skip_bad_rows,
        soft_label_key=config.soft_label_key if config.uses_soft_labels else None)
    if not examples:
        raise ValueError(f"no training example in {config.data} ({counts})")
    if counts["duplicates_removed"]:
        log.info("dropped %d exact duplicate examples of %s", counts["duplicates_removed"], config.data)
    out = Path(config.out)
    fingerprint = _fingerprint(config, examples)
    finished = read_whole_export(out)
    if finished is not None and finished.get("fingerprint") == fingerprint:
        log.info("reusing the trained retriever in %s (same data and settings)", out)
        return out

    on_gpu = torch.cuda.is_available()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    checkpoints = out.with_name(out.name + ".checkpoints")
    logs = out.with_name(out.name + ".logs")  # TensorBoard / W&B files: kept (checkpoints are deleted at the end)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(checkpoints), num_train_epochs=config.epochs, max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_batch_size, learning_rate=config.learning_rate,
        warmup_steps=0, weight_decay=config.weight_decay,  # the schedule is `schedule`'s (_Trainer.create_scheduler)
        gradient_checkpointing=config.gradient_checkpointing, deepspeed=_deepspeed(config),
        logging_steps=config.logging_steps, save_steps=config.save_steps, save_total_limit=2, seed=config.seed,
        data_seed=config.seed, use_cpu=not on_gpu, disable_tqdm=not config.progress,
        dataloader_drop_last=world_size > 1,  # cross-device gathering needs equal batches on every process
        ddp_backend=("nccl" if on_gpu else "gloo") if world_size > 1 else None,
        batch_sampler=BatchSamplers.NO_DUPLICATES if config.batch_sampler == "no_duplicates" else BatchSamplers.BATCH_SAMPLER,
        **hf_reporting(SentenceTransformerTrainingArguments, report_to, logs, run_name=f"retriever {out.name}"),
        **_precision(config, on_gpu))
    model = encoder.model
    torch.manual_seed(config.seed)  # a new adapter's initial weights: as reproducible as the Trainer's own seeding
    parameters = prepare_trainable(model, config.lora)
    loss = build_loss(model, config.loss, config.temperature, config.soft_label_weight, config.label_temperature,
                      config.gather_across_devices and world_size > 1, config.cached, config.mini_batch_size)
    record, callbacks = _held_out_selection(config, encoder, checkpoints)
    trainer = _Trainer(model=model, args=args, train_dataset=examples_dataset(examples), loss=loss,
                       callbacks=callbacks, warmup_ratio=config.warmup_ratio)
    result = train_resuming(trainer, checkpoints, report_to, logs, "retriever training")
    if not trainer.is_world_process_zero():
        return out
    exported, history = model, list(trainer.state.log_history)
    if record is not None:
        exported = _selected_model(config, record, model)
        history = sorted([*(h for h in history if f"heldout_{config.select_metric}" not in h), *record.history()],
                         key=lambda h: h.get("step", 0))
    if config.lora.merge:
        exported = merged(exported)
    manifest = {
        "fingerprint": fingerprint, "base_model": config.encoder.model, "settings": dataclasses.asdict(config),
        "encoder_settings": dataclasses.asdict(settings), "data": counts, "world_size": world_size,
        "global_batch_queries": config.per_device_batch_size * world_size,
        "passages_per_query": 1 + len(examples[0].negatives), "updates": trainer.state.global_step,
        "train_loss": result.training_loss, "seconds": round(time.perf_counter() - started, 1),
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "selection": (record.summary(config.select_on, config.select_pool, config.select_compose_with)
                      if record is not None else None),
        "report_to": report_to, "logs": str(logs) if report_to else None,
        "parameters": parameters,
        "lora": {**dataclasses.asdict(config.lora), "adapter_exported": peft_model_of(exported) is not None}
        if config.lora.rank else None,
    }
    save_trained_encoder(exported, settings, out, manifest,
                         lambda folder: write_training_curves(history, folder, "retriever training"))
    shutil.rmtree(checkpoints, ignore_errors=True)
    log.info("wrote the trained retriever to %s (%d updates, train loss %.4f)", out, trainer.state.global_step,
             result.training_loss)
    return out


def _held_out_selection(config: RetrieverTrainConfig, encoder: Encoder, checkpoints: Path):
    """(record, callbacks) of held-out model selection: the pool is built and the base scored before
    training (the record keeps its first scores across a resume); (None, []) without `select_on`. Every process
    builds the pool and scores the base and each epoch, so none waits for the main one at its next gradient
    exchange (the base alone scores a whole pool, and a collective times out after 30 minutes); only the main
    process records (its record is returned, the others' None)."""
    if not config.select_on:
        return None, []
    main = int(os.environ.get("RANK", "0")) == 0
    from .checkpoint_selection import SelectionRecord, build_heldout_pool, evaluate_on_pool, heldout_callback

    # the slice has no agent query: the inputs of select_compose_with (module docstring of selection)
    pool = build_heldout_pool(config.select_on, config.select_index, config.select_pool,
                              lambda query, question: encoder.compose([query], [question])[0],
                              lambda text: encoder.settings.passage_prefix + text,
                              config.select_compose_with, config.select_parents or None)
    record = SelectionRecord(checkpoints, config.select_metric, pool)
    # every process scores the base, even on a resume: whether the record has it depends on when a process read
    # it, and a process that skipped would run ahead to its first gradient exchange and wait there
    base = evaluate_on_pool(encoder.model, pool, config.select_metric, config.encoder.batch_size)
    if main and "base" not in record.per_checkpoint:
        record.add("base", base, 0)
    callbacks = [heldout_callback(encoder.model, pool, record, config.encoder.batch_size)]
    if not main:
        return None, callbacks
    log.info("held-out %s of the base encoder: %.4f (%d questions of %s, pool of %d passages)", config.select_metric,
             record.per_checkpoint["base"], pool.counts["questions_judged"], config.select_on,
             pool.counts["pool_passages"])
    return record, callbacks


def _selected_model(config: RetrieverTrainConfig, record, trained):
    """The model to export: the best epoch's saved weights (with LoRA, its adapter put into `trained`), or the
    base's, loaded afresh (unchanged)."""
    from sentence_transformers import SentenceTransformer

    scores = ", ".join(f"{name} {score:.4f}" for name, score in record.per_checkpoint.items())
    if record.best == "base":
        log.warning("HELD-OUT SELECTION KEPT THE BASE ENCODER: no epoch beat it on %s (%s); exporting the base "
                    "weights of %s unchanged", config.select_metric, scores, config.encoder.model)
        return Encoder(dataclasses.replace(config.encoder, precision="fp32", device="cpu")).model
    log.info("held-out selection kept %s (%s: %s)", record.best, config.select_metric, scores)
    if load_adapter_weights(trained, record.weights_of(record.best)):
        return trained
    return SentenceTransformer(str(record.weights_of(record.best)), device="cpu")


class _Trainer(SentenceTransformerTrainer):
    """Our batches (`sampler`: no text twice in a batch, nor in a step's batches across processes, every example
    every epoch), our schedule (`schedule`: the warm-up's first update already learns), and the loss's in-batch
    accuracy and KL term (since the last log) in every log entry that has the loss."""

    def __init__(self, *args, warmup_ratio: float = 0.0, **kwargs):
        self.warmup_ratio = warmup_ratio
        super().__init__(*args, **kwargs)

    def get_batch_sampler(self, dataset, batch_size: int, drop_last: bool, valid_label_columns=None, generator=None,
                          seed: int = 0):
        from sentence_transformers.base.sampler import BatchSamplers

        from .sampler import CoveringNoDuplicatesBatchSampler, StepNoDuplicatesBatchSampler

        if self.args.batch_sampler != BatchSamplers.NO_DUPLICATES:
            return super().get_batch_sampler(dataset, batch_size, drop_last, valid_label_columns, generator, seed)
        epochs = math.ceil(self.args.num_train_epochs)
        if self.args.world_size > 1:  # a step's batches are gathered: no text twice among them, every row kept
            return StepNoDuplicatesBatchSampler(dataset, batch_size, self.args.world_size, drop_last=drop_last,
                                                valid_label_columns=valid_label_columns, generator=generator,
                                                seed=seed, epochs=epochs)
        return CoveringNoDuplicatesBatchSampler(dataset, batch_size=batch_size, drop_last=drop_last,
                                                valid_label_columns=valid_label_columns, generator=generator,
                                                seed=seed, epochs=epochs)

    def _load_from_checkpoint(self, checkpoint_path: str, *args, **kwargs) -> None:
        """A LoRA run's checkpoints hold the adapter alone: its weights go into the model's adapter; any other
        checkpoint loads as sentence-transformers loads it."""
        if not load_adapter_weights(self.model, checkpoint_path):
            super()._load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = warmup_linear_schedule(optimizer or self.optimizer, self.warmup_ratio,
                                                       num_training_steps)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs:
            for name, meter in (("in_batch_accuracy", getattr(self.loss, "accuracy", None)),
                                ("soft_label_kl", getattr(self.loss, "kl", None))):
                value = meter.pop() if meter is not None else None
                if value is not None:
                    logs[name] = round(value, 4)
        super().log(logs, *args, **kwargs)
