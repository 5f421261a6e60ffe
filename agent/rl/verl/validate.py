"""A prepared verl run checked by verl itself, without starting it: its overrides composed with the installed verl's
own trainer config (Hydra, as ``verl.trainer.main_ppo`` composes them) and passed through verl's
``validate_config``, the checks ``main_ppo`` runs before it places a worker. What the loop's dry run of a cluster
config (``loop.verl.stand_in``) and the paper-config tests rely on."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from .settings import VerlRun

__all__ = ["compose_verl_config", "validate_verl_run", "verl_config_dir"]


def verl_config_dir() -> Path:
    """The installed verl's ``trainer/config`` folder (ImportError naming the extra when verl is missing)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("verl is not installed: pip install 'agentic-retriever[verl]' (docs/verl.md)")
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


def compose_verl_config(overrides: list[str]) -> Any:
    """verl's ``ppo_trainer`` config with `overrides` applied, composed by Hydra from the installed verl's files."""
    try:
        import hydra
    except ImportError:
        raise ImportError("hydra-core is not installed: pip install 'agentic-retriever[verl]' (verl brings it)") from None
    with hydra.initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return hydra.compose("ppo_trainer", overrides=overrides)


def validate_verl_run(run: VerlRun) -> dict[str, Any]:
    """Compose `run`'s ``overrides.txt`` and run verl's ``validate_config`` on it (a ValueError or AssertionError
    from verl names what it refuses); returns the figures a reader checks: GPUs, batch sizes per GPU, steps."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = compose_verl_config((run.out_dir / "overrides.txt").read_text(encoding="utf-8").splitlines())
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    actor = config.actor_rollout_ref.actor
    return {"gpus": config.trainer.n_gpus_per_node * config.trainer.nnodes,
            "train_batch_size": config.data.train_batch_size, "ppo_mini_batch_size": actor.ppo_mini_batch_size,
            "ppo_micro_batch_size_per_gpu": actor.ppo_micro_batch_size_per_gpu,
            "total_training_steps": config.trainer.total_training_steps, "total_epochs": config.trainer.total_epochs,
            "use_v1": bool(config.trainer.get("use_v1", False))}
