"""The disk a verl run's checkpoints take (`checkpoint_disk_bytes`), printed by the loop before it launches verl.

verl saves the actor (and the critic) every ``trainer.save_freq`` steps and at the last one (`save_count`), and
keeps ``trainer.max_*_ckpt_to_keep`` saves (None: all), holding one more while a new save is written.
"""

from __future__ import annotations

from pathlib import Path

#: Bytes a parameter takes in one verl save (FSDP, full precision): the model's shards (fp32, 4), AdamW's two
#: moments (8) and, for the actor, the Hugging Face export (fp32, 4). Measured by `make verl-check`: 134.5M
#: parameters saved 538 MB + 1,076 MB + 542 MB (benchmarks/RESULTS.md, "verl for real on the CPU").
ACTOR_SAVE_BYTES_PER_PARAMETER = 16
CRITIC_SAVE_BYTES_PER_PARAMETER = 12


def parameter_count(model: str) -> int | None:
    """The parameters of a local model folder, from its safetensors headers (no weights read); None for a hub name
    or a folder without safetensors."""
    files = sorted(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    total = 0
    for file in files:
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():
                count = 1
                for size in handle.get_slice(name).get_shape():
                    count *= size
                total += count
    return total


def checkpoint_disk_bytes(parameters: int, uses_critic: bool, saves: int, keep: int | None) -> int:
    """The most disk verl's checkpoints of one run hold at once: `saves` saves of the actor (and the critic), of
    which verl keeps `keep` (None: all) and holds one more while a new save is written."""
    per_save = parameters * (ACTOR_SAVE_BYTES_PER_PARAMETER + (CRITIC_SAVE_BYTES_PER_PARAMETER if uses_critic else 0))
    return per_save * (saves if keep is None else min(saves, keep + 1))


def save_count(final_step: int, save_freq: int) -> int:
    """How many times verl saves in a run: every `save_freq` steps and at the last step."""
    return len(set(range(save_freq, final_step + 1, save_freq)) | {final_step})
