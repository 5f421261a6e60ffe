"""`agentic-retriever mine` as a library call: load the agent and scorer LLMs, open the retriever, mine.

The demo and the CLI both run mining through `run_mine_job`, from one settings object (the `mine` section of
a config file).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..llm.loader import LLMConfig
from .pipeline import MiningConfig, MiningResult, mine, parse_shard

__all__ = ["MineJobConfig", "run_mine_job"]


@dataclass
class MineJobConfig:
    """Settings of `agentic-retriever mine` (the `mine` section of a config file)."""

    trajectories: str = field(default="", metadata={"help": "trajectory file written by agent rollout"})
    index: str = field(default="", metadata={"help": "index folder of the current retriever R_{i-1}"})
    url: str = field(default="", metadata={"help": "or its retrieval service URL"})
    out: str = field(default="", metadata={"help": "mining output folder"})
    shard: str = field(default="0/1", metadata={"help": "i/n: mine the i-th of n slices of the trajectories"})
    agent: LLMConfig = field(default_factory=LLMConfig)
    scorer: LLMConfig = field(default_factory=LLMConfig)
    mining: MiningConfig = field(default_factory=MiningConfig)


def run_mine_job(config: MineJobConfig) -> MiningResult:
    """Mine `config.trajectories` into `config.out`; the scorer is the agent model when both are the same."""
    from agent.warm_start import open_retrieval_client

    from ..llm import load_llm

    selection = config.mining.resolved_selection()
    agent = load_llm(config.agent) if selection.use_gac else None
    same_model = dataclasses.asdict(config.scorer) == dataclasses.asdict(config.agent)
    scorer = ((agent if same_model and agent is not None else load_llm(config.scorer))
              if config.mining.needs_scorer_llm else None)
    return mine(config.trajectories, open_retrieval_client(config.index, config.url), agent, scorer, config.mining,
                config.out, parse_shard(config.shard))
