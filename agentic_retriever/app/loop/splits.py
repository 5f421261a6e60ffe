"""The loop's question sets kept apart (`check_splits`): what trains never meets what selects or evaluates.

The training sets of the loop are the agent's RL questions (``agent_train.qa``), the questions mined for
retriever rows (``loop.mining_qa``) and the warm start's (``agent_sft.qa``); the held-out sets are the retriever's
selection slice (``retriever_train.select_on``) and the dev files of the evaluation (``loop.eval.leaf_qa``,
``multihop_qa``, ``agent_qa``). Every training set must be disjoint from every held-out set by id, parent id and
normalised question (`data.prepare.assert_disjoint`, the rule ``data prepare`` applies to the files it writes).
Training sets may share questions (the paper trains the agent and mines on the same TriviaQA + HotpotQA train
questions).
"""

from __future__ import annotations

from typing import Any

from agentic_retriever.base.data.prepare import assert_disjoint
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.base.qa_sources import read_qa_source_rows
from .config import LoopJob

__all__ = ["check_splits", "loop_question_sets"]


def loop_question_sets(job: LoopJob) -> tuple[dict[str, str], dict[str, str]]:
    """(training sets, held-out sets) of `job`: setting name -> file, for the settings that name a file."""
    train = {"agent_train.qa": job.agent_train.qa, "loop.mining_qa": job.loop.mining_qa}
    if job.warm_start is not None:
        train["agent_sft.qa"] = job.warm_start.qa
    held = {"retriever_train.select_on": job.train.select_on if job.train is not None else "",
            "loop.eval.leaf_qa": job.loop.eval.leaf_qa, "loop.eval.multihop_qa": job.loop.eval.multihop_qa,
            "loop.eval.agent_qa": job.loop.eval.agent_qa}
    return ({k: v for k, v in train.items() if v}, {k: v for k, v in held.items() if v})


def _rows(setting: str, spec: str) -> list[dict[str, Any]]:
    """The rows of a setting's QA set (any `qa_sources` spec: a file, a merged set, a hub split)."""
    rows = []
    try:
        read = read_qa_source_rows(spec)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{setting}: {error}") from None
    for r in read:
        for needed in ("id", "question"):
            if needed not in r.row:
                raise DataFormatError(r.where, r.line, "missing", field=needed)
        rows.append(r.row)
    return rows


def check_splits(job: LoopJob) -> dict[str, int]:
    """Refuse a training set of the loop that shares a question with a held-out set (ValueError naming both
    settings and files, and up to five shared keys); returns the rows read per setting."""
    train, held = loop_question_sets(job)
    rows = {setting: _rows(setting, path) for setting, path in {**train, **held}.items()}
    for train_setting, train_path in train.items():
        for held_setting, held_path in held.items():
            assert_disjoint(rows[train_setting], rows[held_setting], f"{train_setting} ({train_path})",
                            f"{held_setting} ({held_path})")
    return {setting: len(found) for setting, found in rows.items()}
