"""Evaluate a trajectory file: answer quality, search behaviour and evidence recall.

* ``em``, ``f1``, ``contains_em``: `agentic_retriever.eval.qa`, recomputed from each trajectory's answer and
  golden answers, averaged over trajectories;
* ``avg_searches``: searches whose passages the agent saw, per trajectory;
* ``valid_format_rate``: share of trajectories that finished with an answer and had no invalid action
  (the environment's view of validity; the stricter tag state machine of the format reward is a reward);
* ``evidence_recall`` (when QA rows with ``supporting_titles`` are given): per trajectory, the share of its
  supporting titles among the titles retrieved anywhere in it, averaged over the trajectories that have any;
* ``finish_reasons``: count per finish reason.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentic_retriever.eval.qa import qa_scores

from .qa_data import QARow, as_qa_rows
from .trajectory import read_trajectories

__all__ = ["AgentEvalConfig", "evaluate_trajectories"]


@dataclass
class AgentEvalConfig:
    """Settings of `agentic-retriever eval agent` (section ``eval_agent``)."""

    trajectories: str = field(default="", metadata={"help": "trajectory file written by agent rollout",
                                                    "derive": "{workdir}/agent/trajectories.jsonl"})
    qa: str = field(default="", metadata={"help": "QA rows with supporting_titles, for evidence recall (optional)"})
    out: str = field(default="", metadata={"help": "write the report as JSON here (optional)"})


def evaluate_trajectories(path: str | os.PathLike,
                          qa_rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike | None = None
                          ) -> dict[str, Any]:
    """Mean metrics of the trajectories in `path` (see the module docstring)."""
    trajectories = list(read_trajectories(path))
    if not trajectories:
        raise ValueError(f"{path} holds no trajectories")
    n = len(trajectories)
    scores = [qa_scores(t.answer, t.golden_answers) for t in trajectories]
    report: dict[str, Any] = {
        "trajectories": n,
        "em": sum(s.em for s in scores) / n,
        "f1": sum(s.f1 for s in scores) / n,
        "contains_em": sum(s.contains_em for s in scores) / n,
        "avg_searches": sum(t.num_searches for t in trajectories) / n,
        "valid_format_rate": sum(t.finish_reason == "answer" and all(x.action != "invalid" for x in t.turns)
                                 for t in trajectories) / n,
        "finish_reasons": dict(Counter(t.finish_reason for t in trajectories)),
    }
    if qa_rows is not None:
        evidence = {r.id: set(r.supporting_titles) for r in as_qa_rows(qa_rows) if r.supporting_titles}
        recalls = [len(evidence[t.question_id] & set(t.retrieved_titles)) / len(evidence[t.question_id])
                   for t in trajectories if t.question_id in evidence]
        report["evidence_recall"] = sum(recalls) / len(recalls) if recalls else None
        report["evidence_questions"] = len(recalls)
    return report
