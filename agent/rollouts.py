"""Run the agent over a QA set into a resumable trajectory file (the first arrow of Algorithm 1 of
"Agentic-R: Learning to Retrieve for Agentic Search": QA set -> agent rollouts -> ``trajectories.jsonl``;
docs/agent.md, "`agent rollout`")."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tqdm.auto import tqdm

from agentic_retriever.client import RetrievalClient, RetrievalConfig, open_client
from agentic_retriever.eval.qa import qa_scores
from agentic_retriever.llm import LLMConfig
from agentic_retriever.llm.base import LLM

from .env import EnvConfig, Rollout, rollout
from .qa_data import QARow, as_qa_rows, read_qa_rows
from .trajectory import Trajectory, TrajectoryWriter

__all__ = ["RolloutConfig", "RolloutRunSummary", "make_trajectory", "run_rollout_job", "run_rollouts"]

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    """Settings of `agentic-retriever agent rollout` (the `agent_rollout` section of a config file)."""

    RENAMED: ClassVar[dict[str, str]] = {"llm": "agent", "index": "retrieval.index", "url": "retrieval.url"}

    qa: str = field(default="", metadata={"help": "QA rows (JSONL: id, question, golden_answers)", "required": True})
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    out: str = field(default="", metadata={"help": "trajectory file (JSONL; a rerun completes it)",
                                           "derive": "{workdir}/agent/trajectories.jsonl"})
    limit: int | None = field(default=None, metadata={"help": "only the first N questions"})
    batch_size: int = field(default=16, metadata={"help": "questions advanced together per rollout call"})
    agent: LLMConfig = field(default_factory=LLMConfig)
    env: EnvConfig = field(default_factory=EnvConfig)


@dataclass
class RolloutRunSummary:
    out_path: str
    questions: int
    skipped: int  # already in the file from an earlier run
    written: int


def make_trajectory(row: QARow, result: Rollout, config: EnvConfig, model: str, retriever: str) -> Trajectory:
    """A finished rollout as a trajectory record, with its answer scored against the golden answers (and, for s3,
    its selected documents D_s3 and their counters)."""
    scores = qa_scores(result.answer, list(row.golden_answers))
    return Trajectory(
        question_id=row.id, question=row.question, golden_answers=list(row.golden_answers), dialect=config.dialect,
        model=model, retriever=retriever, turns=result.turns, answer=result.answer, num_searches=result.num_searches,
        em=scores.em, f1=scores.f1, contains_em=scores.contains_em, finish_reason=result.finish_reason,
        prefix=result.prefix, prefix_turns=result.prefix_turns,
        token_ids=result.response_ids if config.store_token_ids else None,
        mask=result.response_mask if config.store_token_ids else None, selection=result.selection,
    )


def run_rollouts(qa_rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike, llm: LLM, client: RetrievalClient,
                 config: EnvConfig, out_path: str | os.PathLike, batch_size: int = 64,
                 retriever_id: str = "") -> RolloutRunSummary:
    """Roll out every question not yet in `out_path`, `batch_size` questions per `rollout` call.

    Resumable: questions already in the file are skipped, and each finished batch is appended durably
    (`TrajectoryWriter`), so a rerun after a crash completes the file without duplicates.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    rows = as_qa_rows(qa_rows)
    repeated = [i for i, n in Counter(r.id for r in rows).items() if n > 1]
    if repeated:
        raise ValueError(f"QA rows repeat question ids: {', '.join(sorted(repeated)[:5])}")
    with TrajectoryWriter(out_path) as writer:
        todo = [r for r in rows if r.id not in writer.done_ids]
        skipped = len(rows) - len(todo)
        if skipped:
            log.info("%s already holds %d of %d questions; running the other %d", out_path, skipped, len(rows),
                     len(todo))
        with tqdm(total=len(rows), initial=skipped, desc="agent rollouts", unit=" questions") as bar:
            for start in range(0, len(todo), batch_size):
                batch = todo[start:start + batch_size]
                results = rollout([r.question for r in batch], llm, client, config)
                writer.write([make_trajectory(row, result, config, llm.name, retriever_id)
                              for row, result in zip(batch, results)])
                bar.update(len(batch))
    log.info("wrote %d trajectories to %s", len(todo), out_path)
    return RolloutRunSummary(str(out_path), len(rows), skipped, len(todo))


def run_rollout_job(config: RolloutConfig) -> RolloutRunSummary:
    """`agentic-retriever agent rollout`: load the LLM, open the retriever, roll out `config.qa` into `config.out`."""
    from agentic_retriever.llm import load_llm

    rows = read_qa_rows(config.qa)[: config.limit]
    return run_rollouts(rows, load_llm(config.agent), open_client(config.retrieval), config.env, config.out,
                        batch_size=config.batch_size, retriever_id=config.retrieval.index or config.retrieval.url)
