"""The empirical study's format reward (Eq. 3) and retrieval reward (Eq. 4), in the paper's and the release's variant.

"An Empirical Study on Reinforcement Learning for Reasoning-Search Interleaved LLM Agents", arXiv 2505.15117,
sections 4.1-4.2; docs/paper-deviations.md, "Search-R1 and the empirical study". With
correct = EM(a_pred, a_gold) (Eq. 2, `outcome`), valid = f_format(y) (`sequence.is_valid_sequence`) and
hit = f_ret(y) (`retrieval.gold_in_information`):

    correct, valid            1
    correct, invalid          1 - lambda_f
    wrong,   valid,   hit     lambda_f + lambda_r      (Eq. 4; Eq. 3 is lambda_r = 0)
    wrong,   valid,   no hit  lambda_f
    wrong,   invalid          0                        paper
                              0.1 if an answer was extracted, else 0    release (``final_format_score``)

``variant="release"`` (the default: it produced the reported numbers) is the release's EM-with-format scorer
``compute_score_em`` with ``structure_format_score = lambda_f``, ``retrieval_score = lambda_r`` and
``final_format_score = 0.1``; ``variant="paper"`` is Eq. 3/4 as printed. They differ only in the last row.
The paper tunes lambda_f in {0.2, 0.4, 0.6, 0.8} (0.2 for 3B/14B, 0.4 for 7B) and lambda_r in {0.1, 0.3, 0.5}
(0.1); the defaults here are 0.2 and 0.1. f_ret counts only for valid responses ("the retrieved information
can only be extracted when the rollout sequence follows the desired format", section 4.2).

    from agent.rewards import judge, shaped_reward
    j = judge(response, ["Paris"])          # SearchR1Judgement(answer, correct, valid_format, ..., retrieval_hit)
    shaped_reward(j, lambda_f=0.4, lambda_r=0.1, variant="paper")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentic_retriever.base.qa_metrics import Golden, exact_match

from .base import Response, response_text
from .outcome import extract_answer
from .registry import register
from .retrieval import Match, gold_in_information
from .sequence import is_valid_sequence

__all__ = ["RELEASE_FINAL_FORMAT_SCORE", "VARIANTS", "SearchR1Judgement", "Variant", "format_reward",
           "format_reward_paper", "judge", "retrieval_reward", "retrieval_reward_paper", "shaped_reward"]

Variant = Literal["release", "paper"]
VARIANTS: tuple[Variant, ...] = ("release", "paper")
RELEASE_FINAL_FORMAT_SCORE = 0.1
DEFAULT_LAMBDA_F = 0.2
DEFAULT_LAMBDA_R = 0.1


@dataclass(frozen=True)
class SearchR1Judgement:
    """What the rewards of this module read from one response: each term of Eq. 3/4 (also worth logging)."""

    answer: str | None
    correct: bool
    valid_format: bool
    format_reason: str
    retrieval_hit: bool


def judge(response: Response, golden: Golden, *, match: Match = "substring") -> SearchR1Judgement:
    """Read a_pred, EM (Eq. 2), f_format (Appendix C) and f_ret (section 4.2) from one response."""
    text = response_text(response)
    answer = extract_answer(text)
    valid, reason = is_valid_sequence(text)
    return SearchR1Judgement(answer=answer, correct=bool(exact_match(answer, golden)), valid_format=valid,
                             format_reason=reason, retrieval_hit=gold_in_information(text, golden, match=match))


def shaped_reward(judgement: SearchR1Judgement, *, lambda_f: float = DEFAULT_LAMBDA_F, lambda_r: float = 0.0,
                  variant: Variant = "release") -> float:
    """Eq. 4 (Eq. 3 when `lambda_r` is 0) of a judged response, in the given variant (table above)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if not 0.0 <= lambda_f <= 1.0 or lambda_r < 0.0:
        raise ValueError(f"need 0 <= lambda_f <= 1 and lambda_r >= 0, got lambda_f={lambda_f}, lambda_r={lambda_r}")
    if judgement.correct:
        return 1.0 if judgement.valid_format else 1.0 - lambda_f
    if judgement.valid_format:
        return lambda_f + (lambda_r if judgement.retrieval_hit else 0.0)
    if variant == "release" and judgement.answer is not None:
        return RELEASE_FINAL_FORMAT_SCORE
    return 0.0


@register("search_r1_format")
def format_reward(response: Response, golden: Golden, *, lambda_f: float = DEFAULT_LAMBDA_F,
                  variant: Variant = "release") -> float:
    """Eq. 3, outcome + format: 1 / 1-lambda_f / lambda_f / 0 (release: 0.1 for a wrong, badly formatted answer)."""
    return shaped_reward(judge(response, golden), lambda_f=lambda_f, variant=variant)


@register("search_r1_format_paper")
def format_reward_paper(response: Response, golden: Golden, *, lambda_f: float = DEFAULT_LAMBDA_F) -> float:
    """Eq. 3 as printed in the paper: a wrong answer in an invalid response scores 0."""
    return format_reward(response, golden, lambda_f=lambda_f, variant="paper")


@register("search_r1_retrieval")
def retrieval_reward(response: Response, golden: Golden, *, lambda_f: float = DEFAULT_LAMBDA_F,
                     lambda_r: float = DEFAULT_LAMBDA_R, variant: Variant = "release",
                     match: Match = "substring") -> float:
    """Eq. 4, outcome + format + retrieval: Eq. 3 plus lambda_r when a valid, wrong response retrieved a gold."""
    return shaped_reward(judge(response, golden, match=match), lambda_f=lambda_f, lambda_r=lambda_r, variant=variant)


@register("search_r1_retrieval_paper")
def retrieval_reward_paper(response: Response, golden: Golden, *, lambda_f: float = DEFAULT_LAMBDA_F,
                           lambda_r: float = DEFAULT_LAMBDA_R, match: Match = "substring") -> float:
    """Eq. 4 as printed in the paper: a wrong answer in an invalid response scores 0."""
    return retrieval_reward(response, golden, lambda_f=lambda_f, lambda_r=lambda_r, variant="paper", match=match)
