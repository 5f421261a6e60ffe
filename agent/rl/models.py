"""The models of an RL run: the policy (optionally with LoRA), its frozen reference, and PPO's critic.

The critic is the policy's transformer with a scalar value head (verl initialises it from the actor's
checkpoint the same way); the head starts at zero, so the first values are 0 and the first advantages are
the returns. With LoRA the reference model is the policy with its adapters switched off (no second copy);
with full fine-tuning it is a frozen copy of the initial weights.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["ValueModel", "disable_dropout", "frozen_copy", "load_policy", "reference_context"]

log = logging.getLogger(__name__)


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout to 0, so log-probabilities in train mode equal those of the rollout (ratio 1 at
    the first update) and gradient checkpointing, which works in train mode only, can be used."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def _lora(model: nn.Module, r: int, alpha: int, task_type: str) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, task_type=task_type,
                                            target_modules="all-linear"))


def load_policy(path: str, device: torch.device, lora: bool = False, lora_r: int = 16, lora_alpha: int = 32,
                gradient_checkpointing: bool = False) -> nn.Module:
    """The trainable policy (float32 master weights) in train mode with dropout off."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    if lora:
        model = _lora(model, lora_r, lora_alpha, "CAUSAL_LM")
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    disable_dropout(model)
    model.train()
    return model


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` with gradients off: the reference of full fine-tuning."""
    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    return reference


@contextlib.contextmanager
def reference_context(policy: nn.Module, reference: nn.Module | None) -> Iterator[nn.Module]:
    """The model to score the reference log-probabilities with: `reference`, or the LoRA policy with its
    adapters disabled when `reference` is None."""
    if reference is not None:
        yield reference
        return
    if not hasattr(policy, "disable_adapter"):
        raise ValueError("without a reference model the policy must be a LoRA (peft) model")
    with policy.disable_adapter():
        yield policy


class ValueModel(nn.Module):
    """A transformer backbone and a linear value head: one value per position."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_pretrained(cls, path: str, device: torch.device, lora: bool = False, lora_r: int = 16,
                        lora_alpha: int = 32, gradient_checkpointing: bool = False) -> ValueModel:
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        hidden = backbone.config.hidden_size
        if lora:
            backbone = _lora(backbone, lora_r, lora_alpha, "FEATURE_EXTRACTION")
        if gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        critic = cls(backbone, hidden).to(device)
        disable_dropout(critic)
        critic.train()
        return critic

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state
        return self.head(hidden.float()).squeeze(-1)
