"""`agentic-retriever agent train`: read the questions, open the retriever, run the RL trainer."""

from __future__ import annotations

from pathlib import Path

from ..qa_data import read_qa_rows
from .config import RLConfig
from .trainer import RLTrainer

__all__ = ["run_rl_job"]


def run_rl_job(config: RLConfig) -> Path:
    """Train the agent as `config` says and return the folder of the trained policy."""
    from ..warm_start import open_retrieval_client

    config.validate()
    if not config.qa:
        raise ValueError("agent train: give the training questions (--qa FILE)")
    rows = read_qa_rows(config.qa)[: config.limit]
    return RLTrainer(config, open_retrieval_client(config.index, config.url), rows).train()
