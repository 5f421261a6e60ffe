"""The machine a run computes on, as the library's CPU figures sort it: the CPU's model name and its class.

The class is what decides a CPU run's speed here: whether the CPU multiplies bf16 matrices in hardware, and how
(torch's own probes, as `precision.cpu_computes_bf16_natively` reads them):

* ``amx``: AMX tiles (Intel Sapphire Rapids and later); ``precision: native`` is bf16;
* ``avx512_bf16``: AVX512-BF16 without AMX (AMD Zen 4 and 5, Intel Cooper Lake); ``native`` is bf16;
* ``fp32``: neither (AVX2-only CPUs, Skylake and Ice Lake with AVX-512 but no bf16); ``native`` is fp32, since
  oneDNN emulates bf16 there and it runs slower than fp32.

benchmarks/RESULTS.md reports the demo and the test suite per class ("The demo and the tests per machine class").
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["CPU_CLASSES", "cpu_class", "cpu_model", "usable_cores"]

#: Each CPU class and what it means for a run.
CPU_CLASSES = {
    "amx": "AMX tiles: bf16 in hardware",
    "avx512_bf16": "AVX512-BF16 without AMX: bf16 in hardware",
    "fp32": "no bf16 hardware (AVX2, or AVX-512 without bf16): fp32",
}


def cpu_class() -> str:
    """This CPU's class (a key of `CPU_CLASSES`), from torch's probes."""
    import torch

    def probe(name: str) -> bool:
        return bool(getattr(torch.cpu, name, lambda: False)())

    if probe("_is_amx_tile_supported"):
        return "amx"
    return "avx512_bf16" if probe("_is_avx512_bf16_supported") else "fp32"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s on Linux), else what the platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cores() -> int:
    """The cores this process may run on (its affinity), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
