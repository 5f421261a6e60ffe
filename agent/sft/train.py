"""Supervised warm start of the search agent: causal-LM fine-tuning on whole search trajectories.

The loss covers only the tokens the agent generates (reasoning, ``<search>`` calls, the answer); the
prompt, the ``<information>`` blocks and invalid-action messages are masked out, exactly the state
masking Search-R1 applies in RL ("An Empirical Study on Reinforcement Learning for Reasoning-Search
Interleaved LLM Agents", arXiv 2505.15117, section 2; docs/rl.md, "State masking"), so the model learns
to act on what it reads, not to reproduce retrieved text.

Training runs on Hugging Face's `transformers.Trainer` (checkpoints, resume, schedule, progress bar);
this module adds only the trajectory tokenisation with its loss mask, optional LoRA (peft, merged into
the weights at the end so the result is a plain HF model folder that our backends and vLLM load), the
atomic export and the training curves (``metrics.jsonl``, ``training_curves.png``); the logs also go to
TensorBoard or W&B through the Trainer's ``report_to`` (`SFTConfig.report_to`, files in ``OUT.logs/``).

    examples = read_sft_examples("sft_train.jsonl")
    train_sft(SFTConfig(epochs=2), LLMConfig(model="default"), examples, out="runs/agent-sft")
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentic_retriever.base.curves import hf_reporting, resolve_report_to, train_resuming, write_training_curves
from agentic_retriever.base.jsonl import DataFormatError, atomic_write, iter_jsonl, replace_folder, require_field
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.precision import resolve

__all__ = ["IGNORE_INDEX", "SFTConfig", "SFTExample", "data_fingerprint", "read_sft_examples", "tokenize_example",
           "train_sft", "write_sft_examples"]

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label of a token the loss skips (PyTorch's cross-entropy ignore_index)


@dataclass
class SFTExample:
    """One trajectory to imitate: the rendered prompt and the response as (text, generated) segments.

    Segments with ``generated=True`` are what the agent itself writes and are trained on; the others
    (observations, messages of the environment) are context only.
    """

    id: str
    prompt: str
    segments: list[tuple[str, bool]]
    meta: dict = field(default_factory=dict)

    @property
    def response(self) -> str:
        return "".join(text for text, _ in self.segments)


@dataclass
class SFTConfig:
    """Training settings of the warm start (the `train` part of `agentic-retriever agent sft`)."""

    epochs: float = field(default=2.0, metadata={"help": "passes over the examples"})
    learning_rate: float = field(default=5e-5, metadata={"help": "peak learning rate (LoRA wants ~10x more)"})
    batch_size: int = field(default=4, metadata={"help": "examples per device and step"})
    gradient_accumulation: int = field(default=1, metadata={"help": "steps accumulated per update"})
    max_length: int = field(default=1536, metadata={"help": "longer examples are dropped (never cut) and counted"})
    warmup_ratio: float = field(default=0.05, metadata={"help": "share of updates with a linear warm-up, in [0, 1)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    lora: bool = field(default=False, metadata={"help": "train LoRA adapters (peft) instead of all weights"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator"})
    lora_dropout: float = field(default=0.05, metadata={"help": "dropout on the LoRA path"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations to save memory"})
    save_steps: int = field(default=50, metadata={"help": "checkpoint every N updates (resume continues from the last)"})
    logging_steps: int = field(default=5, metadata={"help": "log loss and learning rate every N updates"})
    seed: int = field(default=0, metadata={"help": "seed of shuffling and initialisation"})
    report_to: list[str] = field(default_factory=lambda: ["auto"], metadata={
        "help": "where the logs also go (Hugging Face report_to, events in OUT.logs): auto (tensorboard when "
                "installed), tensorboard, wandb, none; metrics.jsonl and the curves PNG are always written"})


# ------------------------------------------------------------------------------------------------ data


def write_sft_examples(path: str | Path, examples: Sequence[SFTExample]) -> None:
    """Write examples as JSONL ``{"id", "prompt", "segments": [{"text", "generated"}], "meta"}`` atomically."""
    with atomic_write(path) as handle:
        for ex in examples:
            row = {"id": ex.id, "prompt": ex.prompt,
                   "segments": [{"text": text, "generated": generated} for text, generated in ex.segments],
                   "meta": ex.meta}
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_sft_examples(path: str | Path) -> list[SFTExample]:
    """Read examples written by `write_sft_examples`; errors name the file, line and field."""
    examples = []
    for line, row in iter_jsonl(path):
        segments = []
        for i, seg in enumerate(require_field(path, line, row, "segments", list)):
            if not isinstance(seg, dict) or not isinstance(seg.get("text"), str) or not isinstance(seg.get("generated"), bool):
                raise DataFormatError(path, line, "expected {'text': str, 'generated': bool}", field=f"segments[{i}]")
            segments.append((seg["text"], seg["generated"]))
        if not any(generated for _, generated in segments):
            raise DataFormatError(path, line, "no generated segment: nothing to train on", field="segments")
        examples.append(SFTExample(str(require_field(path, line, row, "id", (str, int))),
                                   require_field(path, line, row, "prompt", str), segments, row.get("meta") or {}))
    return examples


def tokenize_example(tokenizer, example: SFTExample) -> dict[str, list[int]]:
    """Token ids and labels of one example: each segment is tokenised on its own, as the agent environment
    builds a trajectory (generated ids, then the inserted observation's ids), and labelled with its ids when
    generated, IGNORE_INDEX otherwise (the prompt too)."""
    input_ids = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
    labels = [IGNORE_INDEX] * len(input_ids)
    for text, generated in example.segments:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids += ids
        labels += ids if generated else [IGNORE_INDEX] * len(ids)
    return {"input_ids": input_ids, "labels": labels}


class _PadCollator:
    """Right-pads a batch; padded positions get attention 0 and label IGNORE_INDEX."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(features), width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((len(features), width), dtype=torch.long)
        for row, f in enumerate(features):
            n = len(f["input_ids"])
            ids[row, :n] = torch.tensor(f["input_ids"])
            labels[row, :n] = torch.tensor(f["labels"])
            attention[row, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": attention}


# ------------------------------------------------------------------------------------------------ train


def data_fingerprint(examples: Sequence[SFTExample]) -> str:
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(json.dumps([ex.id, ex.prompt, ex.segments], ensure_ascii=False).encode())
    return digest.hexdigest()


def _resolve_model(name: str) -> str:
    from agentic_retriever.base.defaults import resolve_llm_name

    return resolve_llm_name(name)


def train_sft(config: SFTConfig, agent: LLMConfig, examples: Sequence[SFTExample], out: str | Path,
              extra_manifest: dict | None = None) -> Path:
    """Fine-tune ``agent.model`` on `examples` and save the result as an HF model folder at `out`; ``agent.precision``
    is the mixed precision of training (`precision.resolve`, role ``sft``: auto is bf16 on a GPU that has it, else fp32).

    Resumable: checkpoints go to ``OUT.checkpoints/`` every `save_steps` updates and a rerun continues from
    the last one. The finished folder is written to a temporary sibling and renamed, so `out` either holds a
    complete model (with ``sft_manifest.json``, which also records `extra_manifest`) or nothing.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    if not examples:
        raise ValueError("agent sft needs at least one example")
    report_to = resolve_report_to(config.report_to)
    out = Path(out)
    checkpoints = out.with_name(out.name + ".checkpoints")
    logs = out.with_name(out.name + ".logs")  # TensorBoard / W&B files: kept (checkpoints are deleted at the end)
    if agent.backend != "transformers":
        raise ValueError(f"agent sft trains with transformers; agent.backend {agent.backend!r} cannot be trained")
    model_path = _resolve_model(agent.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token

    features, dropped = [], 0
    for ex in examples:
        feature = tokenize_example(tokenizer, ex)
        if len(feature["input_ids"]) > config.max_length:
            dropped += 1
            continue
        features.append(feature)
    if not features:
        raise ValueError(f"every example is longer than max_length={config.max_length} tokens")
    if dropped:
        log.warning("dropped %d of %d examples longer than %d tokens", dropped, len(examples), config.max_length)

    on_gpu = torch.cuda.is_available()
    precision = resolve(agent.precision, "cuda" if on_gpu else "cpu", "sft")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if config.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                                                 lora_dropout=config.lora_dropout, task_type="CAUSAL_LM",
                                                 target_modules="all-linear"))
    args = TrainingArguments(
        output_dir=str(checkpoints), num_train_epochs=config.epochs, learning_rate=config.learning_rate,
        per_device_train_batch_size=config.batch_size, gradient_accumulation_steps=config.gradient_accumulation,
        warmup_steps=config.warmup_ratio, weight_decay=config.weight_decay, lr_scheduler_type="linear",
        logging_steps=config.logging_steps, save_steps=config.save_steps, save_total_limit=2, seed=config.seed,
        data_seed=config.seed, bf16=precision == "bf16", fp16=precision == "fp16", use_cpu=not on_gpu,
        gradient_checkpointing=config.gradient_checkpointing,
        remove_unused_columns=False, dataloader_num_workers=0, disable_tqdm=False,
        **hf_reporting(TrainingArguments, report_to, logs, run_name=f"agent sft {out.name}"))
    trainer = Trainer(model=model, args=args, train_dataset=features, data_collator=_PadCollator(tokenizer.pad_token_id))
    result = train_resuming(trainer, checkpoints, report_to, logs, "agent SFT")

    trained = trainer.model.merge_and_unload() if config.lora else trainer.model
    manifest = {
        "base_model": agent.model, "base_model_path": model_path, "precision": agent.precision,
        "settings": dataclasses.asdict(config),
        "examples": len(examples), "examples_trained": len(features), "examples_dropped_too_long": dropped,
        "data_sha256": data_fingerprint(examples), "train_loss": result.training_loss,
        "updates": trainer.state.global_step, "log_history": trainer.state.log_history,
        "report_to": report_to, "logs": str(logs) if report_to else None,
    } | (extra_manifest or {})
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trained.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "sft_manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    write_training_curves(trainer.state.log_history, tmp, "agent SFT (loss on generated tokens only)")
    replace_folder(tmp, out)
    shutil.rmtree(checkpoints, ignore_errors=True)
    log.info("wrote the fine-tuned agent to %s (%d updates, train loss %.4f)", out, trainer.state.global_step,
             result.training_loss)
    return out

