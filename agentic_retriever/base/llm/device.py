"""Device and dtype choice for torch models: ``auto`` resolved to the first GPU (else the CPU) and to the
precision that device computes best in; shared by the transformers decoder and the agent's RL trainer.
"""

from __future__ import annotations

import torch

from ..precision import TORCH_NAMES, resolve, torch_dtype


def resolve_device(device: str) -> torch.device:
    """``auto`` is the first GPU when there is one, else the CPU; anything else is a torch device name."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"unknown device '{device}' (use auto, cpu, cuda or cuda:N)") from error


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """A torch dtype name (float32, bfloat16, float16) or ``auto``, as LLM inference computes in on `device`
    (`agentic_retriever.base.precision`, role ``llm``: auto is float32 on a CPU, bfloat16 on a GPU that supports it,
    float16 on others)."""
    choices = {name: precision for precision, name in TORCH_NAMES.items()}
    if dtype != "auto" and dtype not in choices:
        raise ValueError(f"unknown dtype '{dtype}' (use auto, {', '.join(choices)})")
    return torch_dtype(resolve(choices.get(dtype, dtype), str(device), "llm"))
