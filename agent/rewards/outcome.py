"""Search-R1's outcome reward: exact match of the final answer (Eq. 2 of the empirical study).

    r(x, y) = EM(a_pred, a_gold) = 1 if a_pred = a_gold else 0

the reward of Search-R1 (Jin et al., 2025b; arXiv 2503.09516), restated as Eq. 2 of the empirical study ("An
Empirical Study on Reinforcement Learning for Reasoning-Search Interleaved LLM Agents", arXiv 2505.15117).
a_pred is the content of the last ``<answer>`` of the response, stripped (`SearchR1Dialect.extract_answer`, the
extractor the environment uses); the comparison is SQuAD-normalised exact match, the max over the golden answers
(`agentic_retriever.base.qa_metrics.exact_match`, as in the authors' release). No answer scores 0.

The release scores prompt + response and so needs a second ``<answer>`` (the prompt's example holds one);
scoring the response alone, the last ``<answer>`` of the response is the answer and that quirk is gone.
As in the release, the environment's invalid-action message counts as text of the response: its example
``<answer> and </answer>`` is the last answer of a response that ends on an invalid action.
"""

from __future__ import annotations

from agent.dialects.search_r1 import SearchR1Dialect
from agentic_retriever.base.qa_metrics import Golden, exact_match

from .base import Response, response_text
from .registry import register

__all__ = ["constant_reward", "em_reward", "extract_answer"]

_DIALECT = SearchR1Dialect()


def extract_answer(response: Response) -> str | None:
    """a_pred: the last ``<answer>`` of the response, stripped; None when it has none."""
    return _DIALECT.extract_answer(response_text(response))


@register("search_r1_em")
def em_reward(response: Response, golden: Golden) -> float:
    """Eq. 2: 1.0 when the extracted answer exactly matches a golden answer after normalisation, else 0.0."""
    return exact_match(extract_answer(response), golden)


@register("constant")
def constant_reward(response: Response, golden: Golden, *, value: float = 1.0) -> float:
    """The same `value` for every response: a control run (with it, group advantages are 0 and the policy
    moves only as its KL and entropy terms push it; see docs/rl.md, "The RL trainer")."""
    response_text(response)  # the same type check as every reward
    return float(value)
