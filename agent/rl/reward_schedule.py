"""Which reward scores which RL step: one reward for the whole run, or two stages switched after a number of steps.

QAgent ("QAgent: A modular Search Agent with Interactive Query Understanding", arXiv 2510.08383, sections 3.3-3.4,
Appendix C)
trains 1400 steps: end to end with Eq. 7 up to the checkpoint of step 1120 (stage 1), then with Eq. 10's
frozen-generator reward (stage 2). With ``stage2.after_step = k`` (`agent.rl.config.SecondStage`) steps 1..k
are stage 1 and steps k+1.. stage 2.

The stage is a function of the number of finished steps alone, and a checkpoint stores that number
(`agent.rl.checkpoint`), so a run resumed from any checkpoint (one written in stage 1 included) scores each later
step with the reward the uninterrupted run would have used.

    schedule = RewardSchedule(first_reward, second_reward, after_step=1120)
    schedule.stage(1119), schedule.stage(1120)   # (1, 2): step 1120 is the last of stage 1, step 1121 the first of 2
"""

from __future__ import annotations

from .batch_reward import BatchReward

__all__ = ["RewardSchedule"]


class RewardSchedule:
    """The reward of each step: `stage1` for the first `after_step` steps, `stage2` after (`stage2` None: `stage1`
    throughout). Steps are named by the number of steps finished before them (`TrainerState.step`)."""

    def __init__(self, stage1: BatchReward, stage2: BatchReward | None = None, after_step: int | None = None):
        if (stage2 is None) != (after_step is None):
            raise ValueError("a second stage needs both its reward and after_step")
        if after_step is not None and after_step < 1:
            raise ValueError(f"after_step must be at least 1 (steps of stage 1), got {after_step}")
        self.stage1, self.stage2, self.after_step = stage1, stage2, after_step

    def stage(self, finished_steps: int) -> int:
        """1 or 2: the stage of the step that follows `finished_steps` finished steps."""
        return 2 if self.after_step is not None and finished_steps >= self.after_step else 1

    def reward(self, finished_steps: int) -> BatchReward:
        """The reward that scores the step following `finished_steps` finished steps."""
        return self.stage2 if self.stage(finished_steps) == 2 else self.stage1
