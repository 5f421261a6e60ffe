"""Device and dtype choice for torch models: ``auto`` resolved to the first GPU (else the CPU) and to the
precision that device computes best in; shared by the transformers decoder and the agent's RL trainer.
"""

from __future__ import annotations

import torch


def resolve_device(device: str) -> torch.device:
    """``auto`` is the first GPU when there is one, else the CPU; anything else is a torch device name."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"unknown device '{device}' (use auto, cpu, cuda or cuda:N)") from error


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is float32 on CPU and bfloat16 on a GPU that supports it (float16 otherwise)."""
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in choices:
        raise ValueError(f"unknown dtype '{dtype}' (use auto, {', '.join(choices)})")
    return choices[dtype]
