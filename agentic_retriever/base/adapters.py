"""Sentence-transformers folders that hold a LoRA adapter instead of their transformer's weights (a retriever trained
with ``retriever_train.lora`` and exported with ``lora.merge: false``, and its training checkpoints).

Such a folder has the encoder's modules, tokenizer and prompts, and PEFT's ``adapter_config.json`` +
``adapter_model.safetensors`` where the weights would be. `load_sentence_transformer` loads it as PEFT means it to
be: the base model the adapter names (``base_model_name_or_path``), its transformer wrapped by the adapter
(``PeftModel.from_pretrained``); any other folder or hub name loads as sentence-transformers loads it.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "adapter_base", "load_sentence_transformer", "peft_model_of"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def adapter_base(path: str | Path) -> str | None:
    """The base model of the adapter folder `path` (its ``base_model_name_or_path``); None for any other folder."""
    config = Path(path) / ADAPTER_CONFIG
    if not config.is_file():
        return None
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config} names no base_model_name_or_path: the adapter cannot be loaded over its base")
    return base


def load_sentence_transformer(path: str, device: str):
    """``SentenceTransformer(path)``, or, for an adapter folder, its base model with the adapter over its
    transformer (frozen: `training.lora.prepare_trainable` makes it train)."""
    from sentence_transformers import SentenceTransformer

    base = adapter_base(path)
    if base is None:
        return SentenceTransformer(path, device=device)
    if Path(base).is_absolute() and not Path(base).exists():
        raise FileNotFoundError(f"{Path(path) / ADAPTER_CONFIG} names the base model {base}, which is not on this "
                                "machine: copy it there, or export the retriever merged (lora.merge true)")
    from peft import PeftModel

    model = SentenceTransformer(base, device=device)
    model[0].model = PeftModel.from_pretrained(model[0].model, path).to(model.device)
    return model


def peft_model_of(model):
    """The PEFT model wrapping `model`'s transformer (a SentenceTransformer's first module), or None."""
    from peft import PeftModel

    inner = getattr(model[0], "model", None) if len(model) else None
    return inner if isinstance(inner, PeftModel) else None
