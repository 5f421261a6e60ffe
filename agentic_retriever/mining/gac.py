"""Stage 5: global answer correctness GAC of every (round, candidate) (agentic_r.txt section 4.1.1, Eqs. 2-3).

`rollout_gac` is the paper's: the agent is continued from the round's context with the candidate as the only
passage of that round's ``<information>`` (``Doc 1``), later turns retrieving normally, until it answers;
GAC = EM(answer, gold answers) (Eq. 3). It goes through `agent.env.rollout` with one `agent.env.Prefix` per
pair, all pairs of all rounds of a batch in ONE call, so the backend batches every continuation (the
transformers backend computes a prefix shared by a batch's rows once). Each continuation's answer, number
of further searches and finish reason are kept. ``metric="contains"`` uses QAgent's contains-match (a gold
occurring in the answer on word boundaries) instead of EM.

`answer_likelihood_gac` is an option, not the paper's: REPLUG-style (Shi et al., 2024), the probability the
agent gives a gold answer right after the candidate: the same context and observation, then the dialect's
answer tag, then the gold (log-probabilities from `LLM.score`, transformers backend). GAC = max over gold
answers of p(gold) = exp(sum of token log-probs), in (0, 1]: soft, one forward pass per pair instead of a
multi-turn rollout, and blind to what later searches would have found. A candidate counts as leading to
the right answer when GAC >= the selection's ``gac_threshold`` (0.5 by default for this mode).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.dialects import get_dialect
from agent.env import EnvConfig, cut_to_tokens, rollout

from ..client import RetrievalClient
from ..eval.qa import contains_match, exact_match
from ..index.base import ScoredPassage
from .rounds import Round

__all__ = ["GACRequest", "answer_likelihood_gac", "rollout_gac"]

_METRICS: dict[str, Callable] = {"em": exact_match, "contains": contains_match}


@dataclass(frozen=True)
class GACRequest:
    """One round and the candidates to try in its ``<information>``, one at a time."""

    round: Round
    passages: tuple[ScoredPassage, ...]


def rollout_gac(requests: Sequence[GACRequest], llm, client: RetrievalClient, env: EnvConfig,
                metric: Literal["em", "contains"] = "em") -> list[dict]:
    """Continue the agent once per (round, candidate), all in one `rollout` call (Eq. 2), and score (Eq. 3).

    Record per request, parallel to its passages: ``gac`` (0.0/1.0), ``answers`` (None: no answer),
    ``further_searches`` (searches after the forced one), ``finish`` (the rollouts' finish reasons).
    """
    if metric not in _METRICS:
        raise ValueError(f"unknown GAC metric {metric!r} (em, contains)")
    score = _METRICS[metric]
    questions, prefixes, owners = [], [], []
    for r, request in enumerate(requests):
        for passage in request.passages:
            questions.append(request.round.question)
            prefixes.append(request.round.prefix([passage]))
            owners.append(r)
    results = rollout(questions, llm, client, env, prefixes=prefixes) if questions else []
    records = [{"gac": [], "answers": [], "further_searches": [], "finish": []} for _ in requests]
    for r, result in zip(owners, results):
        record = records[r]
        record["gac"].append(score(result.answer, list(requests[r].round.golden_answers)))
        record["answers"].append(result.answer)
        record["further_searches"].append(result.num_searches - 1)  # the forced observation counts as one
        record["finish"].append(result.finish_reason)
    return records


def answer_likelihood_gac(requests: Sequence[GACRequest], llm, env: EnvConfig, answer_lead: str = "<answer>"
                          ) -> list[dict]:
    """p(gold answer | context, candidate as the observation, `answer_lead`) per (round, candidate).

    Tokens are laid out as the environment lays them out (prompt, context and observation encoded apart, the
    observation cut to ``env.observation_max_tokens``); each gold answer is scored as ``" " + gold``.
    Record per request: ``gac`` (max over golds of p(gold), 6 decimals) and ``answer_logprobs`` (per passage,
    the summed log-probability of each gold).
    """
    dialect = get_dialect(env.dialect)
    tokenizer = llm.tokenizer

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    prompts, continuations, owners = [], [], []
    lead = encode(answer_lead)
    for r, request in enumerate(requests):
        rnd = request.round
        head = encode(llm.chat_prompt(dialect.build_prompt(rnd.question))) + encode(rnd.context)
        for passage in request.passages:
            _, observation = cut_to_tokens(tokenizer, dialect.format_observation([[passage]]),
                                           env.observation_max_tokens)
            context = head + observation + lead
            for gold in rnd.golden_answers:
                prompts.append(context)
                continuations.append(encode(" " + gold))
            owners.append((r, len(rnd.golden_answers)))
    logprobs = llm.score(prompts, continuations) if prompts else []
    records = [{"gac": [], "answer_logprobs": []} for _ in requests]
    position = 0
    for r, count in owners:
        sums = [sum(values) for values in logprobs[position:position + count]]
        position += count
        records[r]["answer_logprobs"].append([round(s, 4) for s in sums])
        records[r]["gac"].append(round(math.exp(max(sums)), 6) if sums else 0.0)
    return records
