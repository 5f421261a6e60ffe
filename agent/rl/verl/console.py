"""verl's console metrics (``trainer.logger: [console]``, the loop's default): one dict a training step, read back
from a run's log (`step_metrics`), and the reward curve the loop's report plots (`reward_curve`).

verl 0.9.1 prints each step as ``step:N - key:value - key:value ...`` from its trainer, a Ray actor, so every line
carries Ray's coloured ``(TaskRunnerV1 pid=N)`` prefix; numpy scalars print as ``np.float64(5.5)``.
"""

from __future__ import annotations

import re
from pathlib import Path

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_ACTOR_PREFIX = re.compile(r"^\(\w+ pid=\d+\) ")
_PAIR = re.compile(r"([\w/@.-]+):(?:np\.\w+\()?([-+0-9.eE]+|nan|inf)\)?(?= - |$)")
REWARD_KEY = "critic/score/mean"  # the mean sequence reward of the step, before any KL penalty


def step_metrics(log: str) -> list[dict[str, float]]:
    """Every ``step:N - ...`` line of `log`, in order, as ``{key: value}`` (``step`` included)."""
    steps = []
    for line in log.splitlines():
        line = _ACTOR_PREFIX.sub("", _COLOUR.sub("", line))
        if line.startswith("step:"):
            steps.append({key: float(value) for key, value in _PAIR.findall(line)})
    return steps


def reward_curve(log_path: Path) -> list[float]:
    """The mean reward of each step verl logged in `log_path` (the last line of a step wins: a resumed run logs
    a step again); empty when there is no log."""
    if not log_path.is_file():
        return []
    by_step = {int(m["step"]): m[REWARD_KEY] for m in step_metrics(log_path.read_text(encoding="utf-8",
                                                                                      errors="replace"))
               if "step" in m and REWARD_KEY in m}
    return [by_step[step] for step in sorted(by_step)]
