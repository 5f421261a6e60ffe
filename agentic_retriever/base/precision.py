"""Numeric precision in one place: the names a config takes and what each role computes in.

A config's ``precision`` is one of `Precision`. Two of them are resolved here rather than in each caller:

* ``native`` (`resolve_native`, when a config is built): on a GPU what ``auto`` gives; on a CPU bf16 where it
  multiplies bf16 in hardware (AMX tiles or AVX512-BF16, `cpu_computes_bf16_natively`), else fp32. bf16 moves
  results within the tolerances of benchmarks/RESULTS.md ("The demo in bf16 on a CPU with AMX"); ``native`` is for
  runs where speed matters more than figures identical across machines.
* ``auto`` (`resolve`, where the model is loaded): fp32 on a CPU for every role; on a GPU, by role (`ROLES`).

The roles differ on a GPU on purpose:

* ``llm``, LLM inference (the agent, the scorer; transformers and vLLM): bf16, or fp16 on a GPU without bf16,
  as vLLM's own ``auto`` does for bf16 checkpoints;
* ``encoder``, the bi-encoder's weights when it encodes: fp16, the precision of the Agentic-R release's e5 encoder
  and of FlashRAG's retrieval (docs/papers: IMPLEMENTATION_NOTES.md);
* ``retriever_training``: fp16 mixed precision (autocast with loss scaling, fp32 master weights), the
  release's ``--fp16`` of its tevatron training;
* ``rl`` and ``sft``, the agent's training: bf16 autocast where the GPU has it, else fp32; ``auto`` never picks
  fp16 for them. SFT takes an explicit fp16 (the Trainer's autocast with loss scaling); the RL trainer scales no
  loss and refuses it. verl's own default is bf16 too.

An explicit fp32, bf16 or fp16 is taken as given, with two refusals (`resolve`): fp16 training on a CPU, and fp16
for the RL trainer.
"""

from __future__ import annotations

import functools
from typing import Literal

#: Numeric precision, spelled one way everywhere (weights for inference, mixed precision for training).
Precision = Literal["auto", "native", "fp32", "fp16", "bf16"]
#: Spellings of the previous release, read with a deprecation warning (`config.normalize_precision`).
PRECISION_ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: The torch dtype name of each concrete precision (what transformers' and vLLM's ``dtype`` take).
TORCH_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: Role -> (what ``auto`` is on a GPU with bf16, on a GPU without it). ``auto`` on a CPU is fp32 for every role.
ROLES: dict[str, tuple[str, str]] = {
    "llm": ("bf16", "fp16"),
    "encoder": ("fp16", "fp16"),
    "retriever_training": ("fp16", "fp16"),
    "rl": ("bf16", "fp32"),
    "sft": ("bf16", "fp32"),
}
#: Roles that train: fp16 there is autocast, which a CPU does not do.
_TRAINING = ("retriever_training", "rl", "sft")


@functools.cache
def cpu_computes_bf16_natively() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware: AMX tiles (Intel Sapphire Rapids and later) or
    AVX512-BF16 (AMD Zen 4 and 5, Intel Cooper Lake), as torch's probes report it (`machine.cpu_class`). Without
    either, oneDNN emulates bf16 and it runs slower than fp32. On a 2-core Zen 4 EPYC (AVX512-BF16, no AMX) one
    core multiplies a 4096x384 by 384x1536 matrix 2.5x faster in bf16 than in fp32 (benchmarks/RESULTS.md, "The
    demo and the tests per machine class")."""
    from .machine import cpu_class

    return cpu_class() != "fp32"


def _on_gpu(device: str | None) -> bool:
    import torch

    return str(device).startswith("cuda") or (device in (None, "auto") and torch.cuda.is_available())


def resolve_native(precision: str, device: str | None) -> str:
    """``native`` made concrete for `device` (None or ``auto``: the first GPU if any, else the CPU): ``auto`` on a
    GPU (resolved by role later), bf16 on a CPU that computes it natively, else fp32. Any other precision is
    returned as it is."""
    if precision != "native":
        return precision
    if _on_gpu(device):
        return "auto"
    return "bf16" if cpu_computes_bf16_natively() else "fp32"


def resolve(precision: str, device: str | None, role: str) -> str:
    """The concrete precision (fp32, bf16 or fp16) `role` computes in on `device` (a torch device name, None or
    ``auto``: the first GPU if any, else the CPU), from a config's `precision` (the previous release's float32 etc.
    included)."""
    if role not in ROLES:
        raise ValueError(f"unknown precision role {role!r}; the roles are {', '.join(ROLES)}")
    precision = resolve_native(PRECISION_ALIASES.get(precision, precision), device)
    if precision == "auto":
        if not _on_gpu(device):
            return "fp32"
        import torch

        with_bf16, without = ROLES[role]
        return with_bf16 if with_bf16 != "bf16" or torch.cuda.is_bf16_supported() else without
    if precision not in TORCH_NAMES:
        raise ValueError(f"unknown precision {precision!r}; use auto, native, {', '.join(TORCH_NAMES)}")
    if precision == "fp16" and role == "rl":
        raise ValueError("precision fp16: the RL trainer scales no loss and takes bf16, fp32 or auto (bf16 on a GPU "
                         "that has it)")
    if precision == "fp16" and role in _TRAINING and not _on_gpu(device):
        raise ValueError(f"precision fp16 needs a GPU for {role.replace('_', ' ')}; use bf16, fp32 or auto on a CPU")
    return precision


def torch_dtype(precision: str):
    """The torch dtype of a concrete precision (fp32, bf16, fp16)."""
    import torch

    return getattr(torch, TORCH_NAMES[precision])
