"""The multi-stage reward of "Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with
Reasoning Language Models" (anonymous ACL submission; /work/shared/papers; section 3.3, Eqs. 6-12; docs/rl.md,
"Learning when to search").

    r_sum = r_a + r_s + r_f                                                      (Eq. 12)
    r_f   = 1.0 if the response has an allowed shape, else -1.0                   (Eq. 6)
    r_s   = 0 (concise, RC <= 1) | -1.0 (not concise, RC <= 1) | -avg_sim (RC > 1)   (Eq. 9)
    r_a   stage 1: 1.0 if correct, else -1.0 + beta x RC                         (Eq. 10)
          stage 2: 1.0 - beta x RC if correct, else -1.0                          (Eq. 11), beta = 0.3

* shape [P]: think -> reflect -> answer, or think -> (search -> information -> reflect)+ -> answer, checked by the
  reflect dialect (`agent.dialects.reflect.check_shape`);
* RC, the retrieval count: the searches whose passages the agent saw (`agent.env.Rollout.num_searches`); for a
  response given as text, the number of its executed searches (`agent.dialects.reflect.search_queries`);
* avg_sim [P] (Eqs. 7-8): the cosine similarity of the queries' embeddings averaged over the query pairs. Eq. 8
  divides the sum over pairs i < j by N(N-1), half the number of pairs, while its text says "the mean of pairwise
  cosine similarities": we take the mean [I] (Eq. 8 as printed halves it). The queries are
  `agent.dialects.reflect.search_queries` of the response, in order; fewer than two give avg_sim 0 [I]. The paper
  embeds them with Qwen3-Embedding; the embeddings come from the caller (`agent.rl.batch_reward.WhenToSearchReward`
  embeds a step's queries in one encoder call);
* concise [P] is "a rule-based approach ... to avoid redundant question words, prepositions, and irrelevant
  modifiers", the rule itself not given. Ours [I] (`is_concise`): a query is concise when it has at least one and
  at most ``max_query_words`` words (default 10), does not open with a question word (who, what, when, where,
  which, why, how, whom, whose, or an auxiliary verb opening a yes/no question) and does not end with "?": the
  paper's prompt asks for "a brief description with multiple keywords instead of a natural language question".
  With RC <= 1 every query of the response must be concise (no query: concise);
* correctness [P]: an LLM judge (YES/NO; `agent.rewards.answer_judge`), exact match without a judge.

The format term is a pure function of the response and sits in the response registry (``when_to_search_format``,
with a verl wrapper). The stage rewards (``when_to_search_stage1``, ``when_to_search_stage2``) read the judge's
verdict and the query embeddings: they are registered as ``when_to_search`` rewards,
``reward(correct, response, query_embeddings) -> RewardTerms``, and have no verl wrapper (verl's reward manager
hands a reward only the decoded response and the ground truth: no judge, no encoder).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from agent.dialects.reflect import check_shape, search_queries
from agentic_retriever.base.qa_metrics import Golden

from .base import Response, response_text
from .registry import register

__all__ = ["DEFAULT_BETA", "DEFAULT_MAX_QUERY_WORDS", "RewardTerms", "answer_reward", "format_reward", "is_concise",
           "mean_pairwise_cosine", "retrieval_count", "search_reward", "when_to_search_stage1_reward",
           "when_to_search_stage2_reward"]

DEFAULT_BETA = 0.3
DEFAULT_MAX_QUERY_WORDS = 10

#: Words that open a natural-language question: the wh-words and the auxiliaries of a yes/no question.
QUESTION_WORDS = frozenset("who whom whose what which when where why how is are was were do does did can could "
                           "will would should has have had".split())

_WORD = re.compile(r"\w+(?:['\u2019\-.]\w+)*")


class RewardTerms(NamedTuple):
    """The three terms of Eq. 12 for one response; `total` is r_sum."""

    answer: float
    search: float
    format: float

    @property
    def total(self) -> float:
        return self.answer + self.search + self.format


@register("when_to_search_format")
def format_reward(response: Response, golden: Golden) -> float:
    """Eq. 6: 1.0 when the response has one of the two allowed shapes (`agent.dialects.reflect.check_shape`),
    else -1.0; `golden` is not read."""
    return 1.0 if check_shape(response_text(response)).valid else -1.0


def retrieval_count(response: Response) -> int:
    """RC: the rollout's searches (`num_searches`), or for a response given as text its executed searches."""
    searches = getattr(response, "num_searches", None)
    return int(searches) if searches is not None else len(search_queries(response_text(response)))


def is_concise(query: str, max_words: int = DEFAULT_MAX_QUERY_WORDS) -> bool:
    """The concise rule of the module docstring: 1..`max_words` words, no opening question word, no final "?"."""
    words = _WORD.findall(query)
    return (0 < len(words) <= max_words and words[0].lower() not in QUESTION_WORDS
            and not query.rstrip().endswith("?"))


def mean_pairwise_cosine(embeddings: np.ndarray) -> float:
    """avg_sim (Eqs. 7-8): the cosine similarity of every pair of rows i < j, averaged over the pairs; 0.0 for
    fewer than two rows."""
    vectors = np.asarray(embeddings, dtype=np.float64)
    n = len(vectors)
    if n < 2:
        return 0.0
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError("a query embedding is all zeros: its cosine similarity is undefined")
    unit = vectors / norms
    upper = np.triu_indices(n, k=1)
    return float((unit @ unit.T)[upper].mean())


def search_reward(queries: Sequence[str], retrievals: int, query_embeddings: np.ndarray | None, *,
                  max_query_words: int = DEFAULT_MAX_QUERY_WORDS) -> float:
    """Eq. 9: with `retrievals` <= 1, 0.0 when every query is concise else -1.0; above, -avg_sim of
    `query_embeddings` (one row per query, parallel to `queries`)."""
    if retrievals <= 1:
        return 0.0 if all(is_concise(q, max_query_words) for q in queries) else -1.0
    if query_embeddings is None or len(query_embeddings) != len(queries):
        raise ValueError(f"r_search of {retrievals} retrievals needs one embedding per query: got "
                         f"{'none' if query_embeddings is None else len(query_embeddings)} for {len(queries)} queries")
    return -mean_pairwise_cosine(query_embeddings)


def answer_reward(correct: bool, retrievals: int, *, stage: int, beta: float = DEFAULT_BETA) -> float:
    """Eq. 10 (`stage` 1: a wrong answer earns beta per retrieval) or Eq. 11 (`stage` 2: a correct one pays it)."""
    if stage == 1:
        return 1.0 if correct else -1.0 + beta * retrievals
    if stage == 2:
        return 1.0 - beta * retrievals if correct else -1.0
    raise ValueError(f"the answer reward has stages 1 and 2, got {stage}")


def _terms(correct: bool, response: Response, query_embeddings: np.ndarray | None, *, stage: int, beta: float,
           max_query_words: int) -> RewardTerms:
    if beta < 0 or max_query_words < 1:
        raise ValueError(f"beta must be >= 0 and max_query_words >= 1, got {beta}, {max_query_words}")
    text, retrievals = response_text(response), retrieval_count(response)
    return RewardTerms(answer_reward(correct, retrievals, stage=stage, beta=beta),
                       search_reward(search_queries(text), retrievals, query_embeddings,
                                     max_query_words=max_query_words),
                       format_reward(text, None))


#: What the stage rewards read besides the response: the query embeddings and the judge's verdict (exact match
#: without one).
_STAGE_NEEDS = ("query_encoder", "judge")


@register("when_to_search_stage1", kind="when_to_search", dialect="reflect", needs=_STAGE_NEEDS)
def when_to_search_stage1_reward(correct: bool, response: Response, query_embeddings: np.ndarray | None = None, *,
                  beta: float = DEFAULT_BETA, max_query_words: int = DEFAULT_MAX_QUERY_WORDS) -> RewardTerms:
    """Eq. 12 with Eq. 10's answer term: r_a (1.0, or -1.0 + beta x RC when wrong) + r_s + r_f."""
    return _terms(correct, response, query_embeddings, stage=1, beta=beta, max_query_words=max_query_words)


@register("when_to_search_stage2", kind="when_to_search", dialect="reflect", needs=_STAGE_NEEDS)
def when_to_search_stage2_reward(correct: bool, response: Response, query_embeddings: np.ndarray | None = None, *,
                  beta: float = DEFAULT_BETA, max_query_words: int = DEFAULT_MAX_QUERY_WORDS) -> RewardTerms:
    """Eq. 12 with Eq. 11's answer term: r_a (1.0 - beta x RC when correct, else -1.0) + r_s + r_f."""
    return _terms(correct, response, query_embeddings, stage=2, beta=beta, max_query_words=max_query_words)
