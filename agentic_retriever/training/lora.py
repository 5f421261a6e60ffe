"""LoRA on a sentence-transformers encoder (`config.LoraSettings`): what retriever training does with an adapter.

The encoder's transformer is wrapped by PEFT's own model (``get_peft_model``, as the agent's SFT and RL do here), so
the trainer sees one model whose adapter weights alone train: saving it writes the adapter alone
(``adapter_config.json``, ``adapter_model.safetensors``) beside the sentence-transformers modules, in checkpoints
and in an adapter-only export. PEFT's public API does the rest: the adapter's weights into a model
(``set_peft_model_state_dict``: resume, the kept epoch), the merge (``merge_and_unload``), and an adapter folder
over its base model (``PeftModel.from_pretrained``: `base.adapters.load_sentence_transformer`). transformers' own
PEFT integration (``SentenceTransformer.add_adapter``) is not used: transformers 5.25 asks peft >= 0.22 for it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agentic_retriever.base.adapters import ADAPTER_WEIGHTS, peft_model_of

from .config import LoraSettings

__all__ = ["load_adapter_weights", "merged", "prepare_trainable"]

log = logging.getLogger(__name__)


def prepare_trainable(model, settings: LoraSettings) -> dict:
    """Make `model` (a SentenceTransformer) train as `settings` says, in place; return its parameter counts.

    With a rank: a new LoRA adapter on the targeted layers, every other weight frozen; a model that already carries
    one (loaded from an adapter-only export) trains that adapter on, and a rank other than its own is an error (a
    second adapter on top would leave the first frozen forever). Rank 0 on a model with an adapter: the adapter is
    merged first, then every weight trains."""
    adapter = peft_model_of(model)
    if not settings.rank:
        if adapter is not None:
            log.info("merging the adapter of the start model before full fine-tuning (lora.rank 0)")
            merged(model)
    elif adapter is not None:
        rank = adapter.peft_config["default"].r
        if rank != settings.rank:
            raise ValueError(f"the start model carries an adapter of rank {rank}; lora.rank {settings.rank} would "
                             f"stack a second one: set lora.rank {rank} to train it on, or start from a merged "
                             "export (lora.merge true)")
        for name, parameter in adapter.named_parameters():
            parameter.requires_grad = "lora_" in name
        log.info("training on the start model's adapter (rank %d)", rank)
    else:
        from peft import LoraConfig, get_peft_model
        from transformers import PreTrainedModel

        module = model[0]
        if not isinstance(getattr(module, "model", None), PreTrainedModel):
            raise ValueError("LoRA (lora.rank > 0) needs an encoder whose first module is a transformer")
        targets = settings.target_modules
        module.model = get_peft_model(module.model, LoraConfig(
            r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout, task_type="FEATURE_EXTRACTION",
            target_modules="all-linear" if targets == ["all-linear"] else list(targets)))
    counts = {"trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
              "parameters": sum(p.numel() for p in model.parameters())}
    if settings.rank:
        # recomputed activations (gradient checkpointing) reach the adapter only from inputs that require gradients
        peft_model_of(model).enable_input_require_grads()
        log.info("LoRA rank %d: %d of %d parameters train (%.2f%%)", settings.rank, counts["trainable_parameters"],
                 counts["parameters"], 100 * counts["trainable_parameters"] / counts["parameters"])
    return counts


def load_adapter_weights(model, folder: str | Path) -> bool:
    """Put the adapter weights saved in `folder` (a checkpoint, or the kept epoch's copy) into `model`'s adapter;
    False, and nothing done, when `model` has no adapter or `folder` holds none."""
    adapter, weights = peft_model_of(model), Path(folder) / ADAPTER_WEIGHTS
    if adapter is None or not weights.is_file():
        return False
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(adapter, load_file(weights, device=str(model.device)))
    if result.unexpected_keys:
        raise ValueError(f"{weights} holds weights this model's adapter lacks: {result.unexpected_keys[:5]}")
    return True


def merged(model):
    """`model` (a SentenceTransformer) with its adapter folded into the weights, in place (PEFT's
    ``merge_and_unload``): its transformer becomes a plain model, so it saves as a folder that loads without PEFT.
    A model without an adapter is returned as it is."""
    adapter = peft_model_of(model)
    if adapter is not None:
        model[0].model = adapter.merge_and_unload()
        log.info("merged the LoRA adapter into the weights")
    return model
