"""f_ret of the empirical study's retrieval reward: does a golden answer appear in the retrieved information?

"An Empirical Study on Reinforcement Learning for Reasoning-Search Interleaved LLM Agents", arXiv 2505.15117,
section 4.2 (Eq. 4): "we apply substring exact match as f_ret ... to evaluate whether ground truth appears in
retrieved passages". The retrieved passages are the contents of the
response's ``<information>...</information>`` blocks (the release's ``is_retrieval_correct``); text the agent
wrote itself (``<think>``, ``<answer>``) never counts.

Two ways to match (``match``):

* ``"substring"`` (default, the release): the normalised gold is a substring of the normalised block, so
  gold "4" is found in "1234";
* ``"word"``: the normalised gold occurs on word boundaries (`agentic_retriever.base.qa_metrics.contains_match`).

Both use SQuAD normalisation. A gold that normalises to the empty string (e.g. "The") never matches (the
release would find it in every block).
"""

from __future__ import annotations

import re
from typing import Literal

from agentic_retriever.base.qa_metrics import (
    Golden,
    contains_match,
    golden_strings,
    normalize_answer,
)

from .base import Response, response_text
from .registry import register

__all__ = ["MATCHES", "Match", "gold_in_information", "information_blocks", "retrieval_hit_reward"]

Match = Literal["substring", "word"]
MATCHES: tuple[Match, ...] = ("substring", "word")

_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def information_blocks(response: Response) -> list[str]:
    """The stripped contents of every closed ``<information>`` block of the response, in order."""
    return [block.strip() for block in _INFORMATION.findall(response_text(response))]


def gold_in_information(response: Response, golden: Golden, *, match: Match = "substring") -> bool:
    """f_ret: True when a golden answer appears in some ``<information>`` block (see the module docstring)."""
    if match not in MATCHES:
        raise ValueError(f"unknown match {match!r}; choose one of {', '.join(MATCHES)}")
    blocks = information_blocks(response)
    if match == "word":
        return any(contains_match(block, golden) for block in blocks)
    golds = [gold for gold in map(normalize_answer, golden_strings(golden)) if gold]
    return any(gold in text for text in map(normalize_answer, blocks) for gold in golds)


@register("search_r1_retrieval_hit")
def retrieval_hit_reward(response: Response, golden: Golden, *, match: Match = "substring") -> float:
    """f_ret of Eq. 4 as a number: 1.0 when a golden answer appears in the retrieved information, else 0.0.

    On its own it ignores the format; in Eq. 4 (`format_reward.retrieval_reward`) it counts only for a
    valid response with a wrong answer.
    """
    return float(gold_in_information(response, golden, match=match))
