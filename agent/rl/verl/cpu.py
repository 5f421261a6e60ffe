"""What a verl run on CPUs needs (``loop.verl.device: cpu``): its environment (`cpu_environment`) and Hydra
overrides (`cpu_overrides`), written in one place and into the run's ``launch.sh`` by `prepare_verl_run`.

verl 0.9.1's trainer (``verl.trainer.main_ppo``) runs on a machine without a GPU, with vLLM's CPU build as its
rollout server, when (verl 0.9.1 paths; docs/verl.md, "verl on CPUs"):

- a ``cpu`` platform is registered through verl's plugin hooks (`cpu_platform`, named by
  ``VERL_USE_EXTERNAL_MODULES`` and picked by ``VERL_PLATFORM``; verl has no CPU platform of its own);
- its FSDP engine is looked up under the device ``cuda`` (``workers/engine/base.py``: the FSDP engines register for
  ``cuda`` and ``npu`` only): ``VERL_ENGINE_DEVICE``;
- Ray is told it has GPUs (verl's resource pools always ask for them; here they are labels) and enough CPUs for
  every worker: ``ray_kwargs.ray_init.num_gpus`` / ``num_cpus``;
- attention is torch's sdpa without padding removal (flash-attention is CUDA only);
- FSDP2 (FSDP1 hard-codes ``sync_module_states=True``, which needs a GPU) in fp32 on CPUs without bf16 hardware
  (bf16 there was over 10x slower: an update did not finish in 13 CPU-minutes);
- one agent-loop worker, one reward worker, one TransferQueue storage unit and no DataLoader workers, where verl
  starts eight of each (every one a process importing torch): a host's memory is not a GPU node's;
- vLLM runs eager, without sleep mode (unsupported on the CPU), its KV cache sized in GiB of host memory by
  ``VLLM_CPU_KVCACHE_SPACE``, in float16 with oneDNN held below AMX (`cpu_platform.PlatformCPU.rollout_env_vars`):
  vLLM's CPU build repacks every linear layer's weight it can hand to oneDNN or its AMX kernels and drops the
  parameter, after which verl's weight sync has nothing to load into (``'Parameter' object has no attribute
  'weight_loader'``); float16 layers oneDNN cannot take below AMX keep their weights (docs/verl.md).

Nothing here is read by a GPU run: `prepare_verl_run` calls these only for ``device: cpu``.
"""

from __future__ import annotations

from typing import Any

from agentic_retriever.base.precision import resolve

from .settings import VerlSettings

PLATFORM_MODULE = f"{__package__}.cpu_platform"
RAY_CPUS = 16  # Ray resource labels: one per verl worker (actor, rollout, critic, reference, agent loop, reward)


def cpu_environment(settings: VerlSettings) -> dict[str, str]:
    """The environment variables of a CPU run, exported by its ``launch.sh``."""
    return {
        "VERL_USE_EXTERNAL_MODULES": PLATFORM_MODULE,  # every process importing verl registers the cpu platform
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",                   # the FSDP engines' registry key
        "VLLM_CPU_KVCACHE_SPACE": str(settings.cpu_kv_cache_gib),
    }


def cpu_precision() -> str:
    """fp32 on CPUs without bf16 hardware, bf16 with it (Intel AMX): ``native`` for the agent's RL."""
    return resolve("native", "cpu", "rl")


def cpu_overrides(settings: VerlSettings, uses_critic: bool) -> dict[str, Any]:
    """verl's overrides for a CPU run (applied after the run's own, before `VerlSettings.overrides`)."""
    dtype = cpu_precision()
    mixed = {"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": dtype}
    model, rollout = "actor_rollout_ref.model", "actor_rollout_ref.rollout"
    return {
        "+ray_kwargs.ray_init.num_gpus": settings.n_gpus_per_node,  # labels: verl's pools ask for GPUs
        "ray_kwargs.ray_init.num_cpus": RAY_CPUS,
        "trainer.device": "cpu",
        f"+{model}.override_config.attn_implementation": "sdpa",
        f"{model}.use_remove_padding": False,
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision": mixed,
        f"{rollout}.dtype": "float16",  # with oneDNN below AMX (PlatformCPU.rollout_env_vars): weights stay updatable
        f"+{rollout}.enable_sleep_mode": False,
        f"{rollout}.enforce_eager": True,
        # one process each where verl starts eight: each imports torch (0.5-0.9 GB); eight of each and eight
        # DataLoader workers ran a 24 GB host out of memory beside the loop
        f"{rollout}.agent.num_workers": 1,
        "reward.num_workers": 1,
        "data.dataloader_num_workers": 0,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        **({"critic.strategy": "fsdp2",
            "+critic.model.override_config.attn_implementation": "sdpa",
            "critic.model.use_remove_padding": False,
            "+critic.fsdp.mixed_precision": mixed} if uses_critic else {}),
    }
