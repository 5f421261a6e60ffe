"""verl on CPUs: a ``cpu`` platform for verl's platform registry, loaded only by a CPU run (``loop.verl.device: cpu``).

verl 0.9.1 ("HybridFlow: A Flexible and Efficient RLHF Framework", arXiv 2409.19256) knows the platforms ``nvidia``,
``npu`` and ``rocm`` (``verl/plugin/platform/platform_manager.py``) and turns ``trainer.device=cpu`` back into
``cuda`` (``verl/utils/device.py``, ``auto_set_device``), so its trainer cannot run on a machine without a GPU by
configuration alone. verl's own plugin hooks can add a platform: every process that imports verl imports the modules
named in ``VERL_USE_EXTERNAL_MODULES`` (``verl/__init__.py``), and ``VERL_PLATFORM`` picks a registered platform by
name. This module is that plugin: `PlatformCPU`, registered as ``cpu``:

- the device is ``cpu`` (``torch.cpu``, with the memory calls verl makes on an accelerator answered from the host:
  `CPUDeviceModule`), the collective backend is gloo, and tensors cannot be shared by CUDA IPC (verl's weight sync
  then goes through shared memory and ZMQ);
- Ray's resource stays ``GPU``: verl's resource pools always ask for GPUs (``single_controller/ray/base.py``), so a
  CPU run declares GPUs to Ray as labels (`agent.rl.verl.cpu.cpu_overrides`);
- ``verl/utils/distributed.py`` builds the backend ``cpu:gloo,{device}:{backend}``, which on this platform is
  ``cpu:gloo,cpu:gloo`` and torch refuses ("Duplicate device type cpu"); `install` wraps
  ``torch.distributed.init_process_group`` so a backend string that names one device twice names it once;
- verl's FSDP2 engine keeps a forward-only model (the reference policy) under ``CPUOffloadPolicy(pin_memory=True)``
  (``workers/engine/fsdp/transformer_impl.py``), and FSDP2 then pins every shard, which torch refuses without an
  accelerator ("Cannot access accelerator device when none is available"). Pinned memory exists for copies to a
  device; with none, host memory is all there is, so `install` makes ``Tensor.pin_memory`` return the tensor itself
  when torch sees no accelerator.

A GPU run never loads this module: only `agent.rl.verl.cpu.cpu_environment` names it, and only a run
with ``device: cpu`` writes that environment into its ``launch.sh`` (docs/verl.md, "verl on CPUs").
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
import torch.distributed

from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM_NAME = "cpu"


def single_device_backend(backend: str | None) -> str | None:
    """``cpu:gloo,cpu:gloo`` -> ``cpu:gloo``: a ``device:backend`` list naming each device once (the first entry
    wins); anything else unchanged. A list naming one device with two different backends is an error."""
    if not backend or "," not in backend:
        return backend
    chosen: dict[str, str] = {}
    for entry in backend.split(","):
        device, _, name = entry.strip().partition(":")
        if device in chosen and chosen[device] != name:
            raise ValueError(f"process-group backend {backend!r} gives the device {device!r} two backends")
        chosen.setdefault(device, name)
    return ",".join(f"{device}:{name}" for device, name in chosen.items())


def _pin_memory_without_accelerator(original):
    @functools.wraps(original)
    def pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not torch.accelerator.is_available():
            return self  # host memory is the only memory: nothing to pin it for
        return original(self, *args, **kwargs)
    pin_memory._host_only = True  # type: ignore[attr-defined]
    return pin_memory


def install() -> None:
    """Wrap, once, ``torch.distributed.init_process_group`` (its ``backend`` through `single_device_backend`) and
    ``torch.Tensor.pin_memory`` (the tensor itself when torch sees no accelerator)."""
    if not getattr(torch.Tensor.pin_memory, "_host_only", False):
        torch.Tensor.pin_memory = _pin_memory_without_accelerator(torch.Tensor.pin_memory)
    original = torch.distributed.init_process_group
    if getattr(original, "_single_device_backend", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = single_device_backend(kwargs["backend"])
        elif args:
            args = (single_device_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._single_device_backend = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group


class CPUDeviceModule:
    """``torch.cpu`` with the calls verl makes on ``torch.cuda`` that ``torch.cpu`` lacks: caches and memory
    fractions are no-ops (there is no device allocator), ``mem_get_info`` is the host's available and total memory,
    the allocator counters are 0, and the RNG state is torch's global CPU generator."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, pages * page

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's platform interface on the host CPU (module docstring)."""

    _module = CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return self._module  # type: ignore[return-value]  # a module's interface, not a module

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:  # type: ignore[override]
        # verl builds device strings and torch devices from it: torch.device("cpu"), never "cpu:0"
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for its GPU labels; nothing reads it on the CPU

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        """The vLLM server's environment (verl sets it on the server's Ray actor only): oneDNN held to AVX2, so that
        vLLM 0.32's CPU build keeps float16 linear weights in place instead of repacking them for oneDNN or AMX and
        dropping the parameters verl's weight sync loads into (``cpu.cpu_overrides`` sets the rollout's float16)."""
        return {"ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA", "AVX2")}

    def cudart(self) -> Any:
        return None


install()
