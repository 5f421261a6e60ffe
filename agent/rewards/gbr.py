"""Gain Beyond RAG, s3's reward ("s3: You Don't Need That Much Data to Train a Search Agent via RL",
arXiv 2505.14146, section 3.2, Eq. 1), as pure functions of two accuracies.

    paper   [P]  GBR(Q) = Acc(G(Q, D_s3), A) - Acc(G(Q, D_RAG), A)
    release [R]  GBR(Q) = (Acc_s3 - Acc_RAG) + Acc_s3     (``compute_score_rag`` of github.com/pat-jj/s3)

Acc is Generation Accuracy (`agent.rewards.generation`); D_RAG is the naive top-3 retrieval with the question
itself, whose accuracy [P] precomputes once per question (training keeps the questions where it is 0, where both
variants give 2 x Acc_s3 and Acc_s3). The release variant is the default, as it produced the reported numbers
(docs/paper-deviations.md).

These rewards score accuracies, not a response: they are registered as gains (kind ``gain`` in
`agent.rewards.registry.REWARDS`, needing the frozen generator and the naive-RAG cache, for the s3 dialect), chosen
by name like every reward (``get_reward("s3_gbr")``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .registry import register

__all__ = ["gain_beyond_rag", "gain_beyond_rag_paper"]


def _register(name: str) -> Callable[[Callable], Callable]:
    """A gain: read by the embedded trainer over a whole step, with s3's dialect, generator and naive-RAG cache."""
    return register(name, kind="gain", dialect="s3", needs=("generator", "judge", "naive_rag_cache"))


def _accuracies(acc_s3: float, acc_rag: float) -> tuple[float, float]:
    for name, value in (("acc_s3", acc_s3), ("acc_rag", acc_rag)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or \
                not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be an accuracy in [0, 1], got {value!r}")
    return float(acc_s3), float(acc_rag)


@_register("s3_gbr_paper")
def gain_beyond_rag_paper(acc_s3: float, acc_rag: float) -> float:
    """Eq. 1 [P]: Acc_s3 - Acc_RAG, in [-1, 1]."""
    acc_s3, acc_rag = _accuracies(acc_s3, acc_rag)
    return acc_s3 - acc_rag


@_register("s3_gbr")
def gain_beyond_rag(acc_s3: float, acc_rag: float) -> float:
    """The release's GBR [R]: (Acc_s3 - Acc_RAG) + Acc_s3, in [-1, 2] (the gain plus the generation score)."""
    acc_s3, acc_rag = _accuracies(acc_s3, acc_rag)
    return (acc_s3 - acc_rag) + acc_s3
