"""`agentic-retriever mine run` and `mine merge` as library calls: load the agent and scorer LLMs, open the
retriever, mine; join the shards.

The demo and the CLI both run mining through `run_mine_job`, from one settings object (the ``mine_run``
section of a config file).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.jsonl import shard_bounds
from agentic_retriever.base.llm.loader import LLMConfig
from agentic_retriever.base.qa_sources import read_qa_source_rows
from agentic_retriever.retrieval import open_client
from .config import MiningConfig
from .outputs import MiningResult
from .pipeline import GACRoundFilter, mine
from .plan import PlanConfig, plan_mining, token_counter
from .shards import parse_shard, read_shard

__all__ = ["MineJobConfig", "MineMergeConfig", "plan_mine_job", "run_mine_job"]


@dataclass
class MineJobConfig:
    """Settings of `agentic-retriever mine run` (the ``mine_run`` section of a config file)."""

    RENAMED: ClassVar[dict[str, str]] = {"index": "retrieval.index", "url": "retrieval.url"}

    trajectories: str = field(default="", metadata={"help": "trajectory file written by agent rollout",
                                                    "derive": "{workdir}/agent/trajectories.jsonl"})
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig, metadata={
        "help": "the current retriever R_{i-1}: candidates and later turns of GAC continuations"})
    out: str = field(default="", metadata={"help": "mining output folder", "derive": "{workdir}/mining"})
    shard: str = field(default="0/1", metadata={"help": "i/n: mine the i-th of n slices of the trajectories"})
    agent: LLMConfig = field(default_factory=LLMConfig)
    scorer: LLMConfig = field(default_factory=LLMConfig)
    mining: MiningConfig = field(default_factory=MiningConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)


@dataclass
class MineMergeConfig:
    """Settings of `agentic-retriever mine merge` (section ``mine_merge``)."""

    out: str = field(default="", metadata={"help": "mining output folder holding the shard folders",
                                           "derive": "{workdir}/mining"})
    shards: int = field(default=1, metadata={"help": "number of shards n"})


def run_mine_job(config: MineJobConfig, gac_rounds: GACRoundFilter | None = None) -> MiningResult:
    """Mine `config.trajectories` into `config.out`; the scorer is the agent model when both are the same.
    `gac_rounds` picks the rounds that get GAC (`mine`)."""
    from agentic_retriever.base.llm import load_llm

    selection = config.mining.resolved_selection()
    with contextlib.ExitStack() as engines:  # every engine closed when mining ends, before the next step
        agent = engines.enter_context(load_llm(config.agent)) if selection.use_gac else None
        same_model = dataclasses.asdict(config.scorer) == dataclasses.asdict(config.agent)
        scorer = ((agent if same_model and agent is not None else engines.enter_context(load_llm(config.scorer)))
                  if config.mining.needs_scorer_llm else None)
        return mine(config.trajectories, open_client(config.retrieval), agent, scorer, config.mining,
                    config.out, parse_shard(config.shard), gac_rounds)


def plan_mine_job(config: MineJobConfig) -> dict:
    """The plan of `config` before it runs (`plan.plan_mining`; ``mine run --plan.only``): read from a sample of
    `config.trajectories` when the file exists, else from the number of questions to be rolled out. Loads no
    model: tokens are counted with the models' tokenizers when they load."""
    plan, path = config.plan, Path(config.trajectories)
    if path.is_file():
        shard = parse_shard(config.shard)
        sample, in_file = read_shard(path, shard, limit=plan.sample)
        start, stop = shard_bounds(in_file, shard)
        total = stop - start
    elif plan.qa or plan.questions:
        sample, total = [], (len(read_qa_source_rows(plan.qa)) if plan.qa else plan.questions) * plan.samples
    else:
        raise ValueError(f"nothing to plan: {path} does not exist yet; give the questions to be rolled out "
                         "(--plan.qa QA or --plan.questions N)")
    scorer_tokens, scorer_name = token_counter(config.scorer.model if config.mining.needs_scorer_llm else "")
    agent_tokens, agent_name = token_counter(config.agent.model if config.mining.resolved_selection().use_gac else "")
    return plan_mining(config.mining, sample, total, plan, scorer_tokens, agent_tokens,
                       {"scorer": scorer_name, "agent": agent_name})
