"""Stage 5: global answer correctness GAC of every (round, candidate) ("Agentic-R: Learning to Retrieve for
Agentic Search", section 4.1.1, Eqs. 2-3).

`rollout_gac` is the paper's: the agent is continued from the round's context with the candidate as the only
passage of that round's ``<information>`` (``Doc 1``), later turns retrieving normally, until it answers;
GAC = EM(answer, gold answers) (Eq. 3). It goes through `agent.env.rollout` with one `agent.env.Prefix` per
pair, all pairs of all rounds of a batch in ONE call, so the backend batches every continuation (the
transformers backend computes a prefix shared by a batch's rows once). Each continuation's answer, number
of further searches and finish reason are kept. ``metric="contains"`` uses QAgent's contains-match (a gold
occurring in the answer on word boundaries) instead of EM.

`answer_likelihood_gac` is an option, not the paper's: REPLUG-style (Shi et al., "REPLUG: Retrieval-Augmented
Black-Box Language Models", arXiv 2301.12652), the log-probability the agent gives a gold answer right after
the candidate: the same context and observation, then the dialect's answer tag, then the gold (`LLM.score`,
transformers backend). One forward pass per pair instead of a multi-turn rollout, blind to what later
searches would have found. The record keeps, per candidate and gold, the summed log-probability and the
number of gold tokens, and per round the same for the **no-passage baseline** (the context, an empty
observation, the answer tag, the gold), so the graded GAC value is computed from the record by a criterion
(`gac_value`) and changing the criterion recomputes nothing:

* ``sequence``: p(gold) = exp(sum of token log-probs) (max over golds). A multi-token gold (a year is 5
  tokens for SmolLM2) gets a small probability even when every token is likely, so a fixed cutoff drops
  exactly the rounds with long answers;
* ``per_token``: exp(mean token log-prob), the geometric-mean token probability: length-robust;
* ``gain``: mean token log-prob with the candidate minus without any passage (max over golds): how much
  the passage raises the agent's belief in the gold. Robust to length and to answers the agent already
  knows (memorised answers are likely with or without a passage).
* ``part_gain``: the same gain per part of a gold made of several ("Busan: Camellia, Daegu: Magnolia": the
  joined list or dict answer of `data prepare`, split at ", "), the best part's (max over golds and parts; a
  one-part gold gives ``gain``). A passage on one part of a list raises that part's tokens, while the mean
  over the whole list dilutes it: on multi-hop questions ``gain`` rarely passes any candidate. Each part is
  scored in place, after the parts before it (teacher forcing), so the record holds per-part sums of the
  same forward passes. Not the paper's (its GAC is the EM of a rollout); a deviation for list answers.

The default criterion and its threshold were chosen by measurement (docs/mining.md, "What the quickstart changes
from the paper, and why").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.qa_metrics import contains_match, exact_match
from .environment import EnvConfig, cut_to_tokens, get_dialect, rollout
from .rounds import Round

__all__ = ["DEFAULT_GAC_THRESHOLDS", "GAC_CRITERIA", "GACRequest", "answer_likelihood_gac", "answer_pieces", "gac_value",
           "rollout_gac"]

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


GAC_CRITERIA = ("sequence", "per_token", "gain", "part_gain")
#: Threshold of a candidate passing GAC, per criterion, when the selection does not set one.
DEFAULT_GAC_THRESHOLDS = {"rollout": 1.0, "sequence": 0.5, "per_token": 0.5, "gain": 0.5, "part_gain": 0.5}
#: Where `data prepare` joins the parts of a list or dict answer into one golden string.
PART_SEPARATOR = ", "


def answer_pieces(gold: str) -> list[str]:
    """The gold as the agent would write it after the answer tag (``" " + gold``), cut into pieces that are the
    gold's parts (odd positions hold the separators' commas): ``" A, B"`` -> ``[" A", ",", " B"]``. Encoded
    one by one, the pieces give each part's tokens without character offsets; for a byte-level BPE tokenizer
    they are the whole's tokens (its pre-tokenizer splits before the comma and the space), except where a
    part ends in a period that merges with the comma ("Jr.,": SmolLM2, 17 of the 909 golds of the prepared
    FanOutQA files), a valid tokenization of the same text. An item that holds ", " itself ("Washington,
    D.C.") counts as two parts."""
    parts = gold.split(PART_SEPARATOR)
    pieces = [" " + parts[0]]
    for part in parts[1:]:
        pieces += [PART_SEPARATOR.rstrip(), " " + part]
    return pieces


def answer_likelihood_gac(requests: Sequence[GACRequest], llm, env: EnvConfig, answer_lead: str = "<answer>"
                          ) -> list[dict]:
    """Log-probabilities of each gold answer after each candidate (and after no passage), per round.

    Tokens are laid out as the environment lays them out (prompt, context and observation encoded apart, the
    observation cut to ``env.observation_max_tokens``); each gold answer is scored as ``" " + gold``, encoded
    piece by piece (`answer_pieces`). Record per request: ``answer_logprobs`` (per passage, the summed
    log-probability of each gold), ``answer_tokens`` (tokens of each gold), ``baseline_logprobs`` (each gold
    with an empty observation), and the same per part of each gold: ``answer_part_logprobs`` (per passage, per
    gold, per part), ``answer_part_tokens`` and ``baseline_part_logprobs`` (a separator's comma is in the
    gold's sum, in no part's).
    """
    dialect = get_dialect(env.dialect)
    tokenizer = llm.tokenizer

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    prompts, continuations, tokens, spans = [], [], [], []
    lead = encode(answer_lead)
    empty = encode(dialect.format_observation([[]]))
    for request in requests:
        rnd = request.round
        golds, gold_spans = [], []
        for gold in rnd.golden_answers:
            pieces = [encode(piece) for piece in answer_pieces(gold)]
            golds.append([token for piece in pieces for token in piece])
            starts = list(accumulate((len(piece) for piece in pieces), initial=0))
            gold_spans.append([(starts[i], starts[i + 1]) for i in range(0, len(pieces), 2)])  # parts, not commas
        tokens.append([len(gold) for gold in golds])
        spans.append(gold_spans)
        head = encode(llm.chat_prompt(dialect.build_prompt(rnd.question))) + encode(rnd.context)
        observations = [cut_to_tokens(tokenizer, dialect.format_observation([[passage]]),
                                      env.observation_max_tokens)[1] for passage in request.passages]
        for observation in [empty, *observations]:
            prompts.extend(head + observation + lead for _ in golds)
            continuations.extend(golds)
    logprobs = iter(llm.score(prompts, continuations) if prompts else [])
    records = []
    for request, counts, gold_spans in zip(requests, tokens, spans):
        def sums() -> tuple[list[float], list[list[float]]]:
            """(summed log-probability of each gold, and of each of its parts) after one observation."""
            totals, parts = [], []
            for span_list in gold_spans:
                values = next(logprobs)
                totals.append(round(sum(values), 4))
                parts.append([round(sum(values[start:end]), 4) for start, end in span_list])
            return totals, parts

        baseline, baseline_parts = sums()
        scored = [sums() for _ in request.passages]
        records.append({"baseline_logprobs": baseline, "answer_logprobs": [totals for totals, _ in scored],
                        "answer_tokens": counts, "baseline_part_logprobs": baseline_parts,
                        "answer_part_logprobs": [parts for _, parts in scored],
                        "answer_part_tokens": [[end - start for start, end in span_list] for span_list in gold_spans]})
    return records


def _significant(probability: float) -> float:
    """`probability` to 6 significant digits: rounding to 6 decimals made every answer a weak model (or a long
    answer's sequence probability) finds unlikely a tie at 0.00002 or 0, so no candidate could be a negative."""
    return float(f"{probability:.6g}")


def gac_value(record: dict, criterion: str) -> list[float]:
    """The graded GAC of each candidate of a stored answer-likelihood record, by `criterion` (see module)."""
    if criterion not in GAC_CRITERIA:
        raise ValueError(f"unknown GAC criterion {criterion!r} ({', '.join(GAC_CRITERIA)})")
    if criterion == "part_gain":
        return [round(best_part_gain(parts, record["baseline_part_logprobs"], record["answer_part_tokens"]), 6)
                for parts in record["answer_part_logprobs"]]
    tokens = [max(1, n) for n in record["answer_tokens"]]
    values = []
    for sums in record["answer_logprobs"]:
        if not sums:
            values.append(0.0)
        elif criterion == "sequence":
            values.append(_significant(math.exp(max(sums))))
        elif criterion == "per_token":
            values.append(_significant(math.exp(max(s / n for s, n in zip(sums, tokens)))))
        else:
            values.append(round(max((s - b) / n for s, b, n in zip(sums, record["baseline_logprobs"], tokens)), 6))
    return values


def best_part_gain(parts: list[list[float]], baseline: list[list[float]], tokens: list[list[int]]) -> float:
    """Max over golds and their parts of the mean token log-probability gain over no passage (0.0: no part)."""
    gains = [(s - b) / max(1, n) for gold, base, counts in zip(parts, baseline, tokens)
             for s, b, n in zip(gold, base, counts)]
    return max(gains, default=0.0)
