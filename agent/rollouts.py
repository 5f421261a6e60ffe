"""Run the agent over a QA set into a resumable trajectory file (the first arrow of Algorithm 1 of
"Agentic-R: Learning to Retrieve for Agentic Search": QA set -> agent rollouts -> ``trajectories.jsonl``;
docs/agent.md, "`agent rollout`")."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tqdm.auto import tqdm

from agentic_retriever.base.client import RetrievalClient, RetrievalConfig
from agentic_retriever.base.jsonl import parse_shard, read_json, shard_bounds, write_json
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.llm.protocol import LLM, derived_seed
from agentic_retriever.base.qa_metrics import qa_scores
from agentic_retriever.base.qa_sources import QARow, as_qa_rows, read_qa_rows
from agentic_retriever.retrieval import open_client

from .env import EnvConfig, Rollout, rollout
from .trajectory import Trajectory, TrajectoryWriter, trajectory_id

__all__ = ["RolloutConfig", "RolloutRunSummary", "RolloutSettingsMismatch", "make_trajectory", "rollout_settings_path",
           "run_rollout_job", "run_rollouts"]

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
    shard: str = field(default="0/1", metadata={
        "help": "i/n: roll out the i-th of n contiguous slices of the questions (after limit), one process each; "
                "joining the n files in order gives the unsharded file"})
    batch_size: int = field(default=16, metadata={"help": "trajectories advanced together per rollout call"})
    samples: int = field(default=1, metadata={
        "help": "trajectories per question (more than 1 needs env.temperature > 0; each is a `sample`)"})
    agent: LLMConfig = field(default_factory=LLMConfig)
    env: EnvConfig = field(default_factory=EnvConfig)


@dataclass
class RolloutRunSummary:
    out_path: str
    questions: int
    skipped: int  # trajectories already in the file from an earlier run
    written: int  # trajectories written now


def make_trajectory(row: QARow, result: Rollout, config: EnvConfig, model: str, retriever: str, sample: int = 0
                    ) -> Trajectory:
    """A finished rollout as a trajectory record, with its answer scored against the golden answers (and, for s3,
    its selected documents D_s3 and their counters); `sample` numbers a question's sampled trajectories."""
    scores = qa_scores(result.answer, list(row.golden_answers))
    return Trajectory(
        question_id=row.id, question=row.question, golden_answers=list(row.golden_answers), dialect=config.dialect,
        model=model, retriever=retriever, turns=result.turns, answer=result.answer, num_searches=result.num_searches,
        em=scores.em, f1=scores.f1, contains_em=scores.contains_em, finish_reason=result.finish_reason,
        prefix=result.prefix, prefix_turns=result.prefix_turns,
        token_ids=result.response_ids if config.store_token_ids else None,
        mask=result.response_mask if config.store_token_ids else None, selection=result.selection, sample=sample,
    )


class RolloutSettingsMismatch(ValueError):
    """A trajectory file was started with another agent or environment than the run resuming it."""


def rollout_settings_path(out_path: str | os.PathLike) -> Path:
    """The file beside a trajectory file that records what wrote it (``trajectories.jsonl.settings.json``)."""
    return Path(f"{out_path}.settings.json")


def check_rollout_settings(out_path: str | os.PathLike, settings: dict[str, Any]) -> None:
    """Refuse to complete `out_path` with trajectories of another agent or environment: resuming appends, so mixed
    settings would pass silently into mining and evaluation. The first run records `settings` beside the file; a
    file without that record (an earlier version's, or a new one) is taken as this run's. The retriever is not
    compared: a service's address changes between runs of the same retriever (files of different retrievers are
    kept apart by their names, as the benchmarks and the loop do)."""
    record = rollout_settings_path(out_path)
    started = Path(out_path).is_file() and Path(out_path).stat().st_size > 0
    if started and record.is_file():
        before = read_json(record)
        changed = sorted(k for k in settings.keys() | before.keys() if settings.get(k) != before.get(k))
        if changed:
            detail = "; ".join(f"{k}: {before.get(k)!r} then, {settings.get(k)!r} now" for k in changed)
            raise RolloutSettingsMismatch(
                f"{out_path} holds trajectories written with other settings ({detail}): write to another file "
                f"(agent_rollout.out), or delete it and {record.name} to start over")
        return
    write_json(record, settings)


def run_rollouts(qa_rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike, llm: LLM, client: RetrievalClient,
                 config: EnvConfig, out_path: str | os.PathLike, batch_size: int = 64,
                 retriever_id: str = "", samples: int = 1) -> RolloutRunSummary:
    """Roll out `samples` trajectories of every question (sample 0 .. samples - 1) not yet in `out_path`,
    `batch_size` trajectories per `rollout` call.

    Several samples of a question are what mining reads as more rounds of it (the paper mines the agent's
    trajectories; sampling at a temperature gives several per question), so they need `config.temperature` > 0;
    each trajectory is seeded from ``config.seed``, its question id and its sample, so samples differ on every
    backend and a trajectory draws the same whatever batch it runs in.
    Resumable: trajectories already in the file are skipped, and each finished batch is appended durably
    (`TrajectoryWriter`), so a rerun after a crash completes the file without duplicates; a rerun with another
    agent or environment raises `RolloutSettingsMismatch` (`check_rollout_settings`) instead of mixing them.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    if samples > 1 and config.temperature <= 0:
        raise ValueError(f"{samples} samples per question need env.temperature > 0 (greedy decoding repeats one "
                         "trajectory)")
    rows = as_qa_rows(qa_rows)
    repeated = [i for i, n in Counter(r.id for r in rows).items() if n > 1]
    if repeated:
        raise ValueError(f"QA rows repeat question ids: {', '.join(sorted(repeated)[:5])}")
    model = os.path.realpath(llm.name) if os.path.exists(llm.name) else llm.name  # one folder, however it is written
    check_rollout_settings(out_path, {"model": model, "env": asdict(config)})
    with TrajectoryWriter(out_path) as writer:
        wanted = [(row, sample) for row in rows for sample in range(samples)]
        todo = [(row, sample) for row, sample in wanted if trajectory_id(row.id, sample) not in writer.done_ids]
        skipped = len(wanted) - len(todo)
        if skipped:
            log.info("%s already holds %d of %d trajectories; running the other %d", out_path, skipped, len(wanted),
                     len(todo))
        with tqdm(total=len(wanted), initial=skipped, desc="agent rollouts", unit=" trajectories") as bar:
            for start in range(0, len(todo), batch_size):
                batch = todo[start:start + batch_size]
                seeds = None if config.seed is None else [derived_seed(config.seed, row.id, sample)
                                                          for row, sample in batch]
                results = rollout([row.question for row, _ in batch], llm, client, config, seeds=seeds)
                writer.write([make_trajectory(row, result, config, llm.name, retriever_id, sample)
                              for (row, sample), result in zip(batch, results)])
                bar.update(len(batch))
    log.info("wrote %d trajectories to %s", len(todo), out_path)
    return RolloutRunSummary(str(out_path), len(rows), skipped, len(todo))


def run_rollout_job(config: RolloutConfig) -> RolloutRunSummary:
    """`agentic-retriever agent rollout`: load the LLM, open the retriever, roll out `config.qa` into `config.out`."""
    from agentic_retriever.base.llm import load_llm

    rows = read_qa_rows(config.qa)[: config.limit]
    start, stop = shard_bounds(len(rows), parse_shard(config.shard))
    rows = rows[start:stop]
    with load_llm(config.agent) as llm:  # closed before the caller's next step takes the device
        return run_rollouts(rows, llm, open_client(config.retrieval), config.env, config.out,
                            batch_size=config.batch_size, retriever_id=config.retrieval.index or config.retrieval.url,
                            samples=config.samples)
