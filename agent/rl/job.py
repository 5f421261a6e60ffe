"""`agentic-retriever agent train`: read the questions, open the retriever, run the RL trainer."""

from __future__ import annotations

from pathlib import Path

from agentic_retriever.retrieval import open_client

from agentic_retriever.base.qa_sources import read_qa_rows
from .config import RLConfig
from .trainer import RLTrainer

__all__ = ["run_rl_job"]


def run_rl_job(config: RLConfig) -> Path:
    """Train the agent as `config` says and return the folder of the trained policy."""
    config.validate()
    rows = read_qa_rows(config.qa)[: config.limit]
    return RLTrainer(config, open_client(config.retrieval), rows).train()
