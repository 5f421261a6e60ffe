"""The embedded RL trainer of the search agent (Algorithm 1's agent half: "Agentic-R: Learning to Retrieve for
Agentic Search", section 4.2; docs/rl.md).

PPO (GAE with a critic, KL in the reward) and GRPO/DAPO (group-normalised outcomes, KL in the loss,
decoupled clipping, token-level aggregation, dynamic sampling) over rollouts of `agent.env`, with any
registered reward (`agent.rewards`) and Search-R1's state masking: only the tokens the agent generated are
trained on. At cluster scale use verl, which our retrieval service and reward functions already speak.

    from agent.rl import RLConfig, run_rl_job
    from agentic_retriever.base.client import RetrievalConfig
    run_rl_job(RLConfig(qa="train.jsonl", retrieval=RetrievalConfig(index="runs/quickstart/index/minilm-flat"),
                        out="runs/rl", algorithm="grpo"))
"""

from .config import RLConfig
from .job import run_rl_job
from .trainer import RLTrainer

__all__ = ["RLConfig", "RLTrainer", "run_rl_job"]
