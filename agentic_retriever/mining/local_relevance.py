"""Stage 4: local relevance LR in 0..100 for every candidate of a round ("Agentic-R: Learning to Retrieve for
Agentic Search", section 4.1.1, Eq. 1): the LR scorers.

Two LLM scorers with one interface (``settings()``, ``score(requests) -> records``):

`ListwiseScorer` is the paper's: the query and a list of candidates in the Figure 6 prompt (with the
round's sub-answer) or Figure 7 (without); the LLM answers one integer per passage. The candidates go in
windows: 10 passages per prompt by default, as the authors' release (``batch_passages_size=10``: two
prompts for 20 candidates); ``window=20`` is one list, as the paper's text describes. Each window's output is
parsed (`parse.parse_scores`: integers, clamped to 0..100). A window that does not parse is asked again
``retries`` times (default once); greedy decoding would repeat itself, so a retry samples at
``retry_temperature`` with a fixed seed. A round with a window that still fails gets no scores and is
dropped (``lr_parse_failed``), as the authors' release drops it. Every raw output is kept in the record, for
audit.

`PointwiseLikelihoodScorer` is a deviation for small scorers (the embedded 135M model returns ten integers
for a ten-passage listwise prompt in 0 of 10 tries). Each candidate is scored alone from the scorer's
log-probabilities (`LLM.score`, the transformers backend), so every candidate gets a score:

* ``judgement`` (default): the probability of a positive judgement, LR = 100 * p(Yes) / (p(Yes) + p(No)) for
  "Does the passage answer the Search Query? Answer Yes or No." (with the reference answer when there is one);
* ``query_likelihood``: UPR-style ("Improving Passage Retrieval with Zero-Shot Question Generation", Sachan
  et al., 2022, arXiv 2204.07496), LR = 100 * exp(mean log p(query tokens | passage, "Please write a search
  query that this passage answers.")), the per-token geometric-mean probability.

Both map to 0..100 but not to the paper's five calibrated intervals, so the LR >= 60 threshold means
something else: mining_stats.json names the scorer that produced LR (docs/paper-deviations.md).

`RetrieverScores` is a baseline without an LLM: LR from the candidate retriever's own scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agentic_retriever.base.fingerprint import llm_fingerprint
from agentic_retriever.base.llm.protocol import SamplingParams
from .parse import parse_scores
from .prompts import PROMPT_VERSION, relevance_prompt

__all__ = ["ListwiseScorer", "PointwiseLikelihoodScorer", "RelevanceRequest", "RetrieverScores"]


@dataclass(frozen=True)
class RelevanceRequest:
    """One round: its query, its candidates rendered as text (`prompts.passage_text`), its sub-answer or None."""

    query: str
    passages: tuple[str, ...]
    sub_answer: str | None = None


class ListwiseScorer:
    """Figures 6 and 7 over windows of candidates, with retries (see the module docstring).

    Record per request: ``scores`` (ints, parallel to the passages; None when a window failed), ``template``
    (``with_sub_answer`` = Figure 6, ``without_sub_answer`` = Figure 7), and per window ``outputs`` (every raw
    output, in order of the attempts) and ``status`` (the last parse: ok, extra_numbers, too_few).
    """

    kind = "listwise"

    def __init__(self, llm, window: int = 10, retries: int = 1, retry_temperature: float = 0.7,
                 max_new_tokens: int = 128, seed: int = 0):
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.llm, self.window, self.retries = llm, window, retries
        self.retry_temperature, self.max_new_tokens, self.seed = retry_temperature, max_new_tokens, seed

    @property
    def name(self) -> str:
        return f"listwise (window {self.window})"

    def settings(self) -> dict:
        return {"kind": self.kind, "prompt_version": PROMPT_VERSION, "model": llm_fingerprint(self.llm),
                "window": self.window, "retries": self.retries, "retry_temperature": self.retry_temperature,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed}

    def windows(self, request: RelevanceRequest) -> list[tuple[int, int]]:
        """(start, end) of each window over the request's passages."""
        n = len(request.passages)
        return [(s, min(s + self.window, n)) for s in range(0, n, self.window)]

    def score(self, requests: Sequence[RelevanceRequest]) -> list[dict]:
        jobs = []  # (request index, window index, start, end, prompt)
        for r, request in enumerate(requests):
            for w, (start, end) in enumerate(self.windows(request)):
                text = relevance_prompt(request.query, request.passages[start:end], request.sub_answer)
                jobs.append((r, w, start, end, self.llm.chat_prompt(text)))
        outputs: list[list[str]] = [[] for _ in jobs]
        parsed: list = [None] * len(jobs)
        todo = list(range(len(jobs)))
        for attempt in range(self.retries + 1):
            if not todo:
                break
            params = SamplingParams(max_new_tokens=self.max_new_tokens) if attempt == 0 else SamplingParams(
                max_new_tokens=self.max_new_tokens, temperature=self.retry_temperature, seed=self.seed + attempt)
            gens = self.llm.generate([jobs[j][4] for j in todo], params)
            for j, gen in zip(todo, gens):
                outputs[j].append(gen[0].text)
                parsed[j] = parse_scores(gen[0].text, jobs[j][3] - jobs[j][2])
            todo = [j for j in todo if not parsed[j].ok]
        records = [{"scores": [0] * len(req.passages),
                    "template": "with_sub_answer" if req.sub_answer is not None else "without_sub_answer",
                    "windows": []} for req in requests]
        for j, (r, _, start, end, _) in enumerate(jobs):
            record = records[r]
            record["windows"].append({"outputs": outputs[j], "status": parsed[j].status})
            if parsed[j].ok and record["scores"] is not None:
                record["scores"][start:end] = parsed[j].scores
            else:
                record["scores"] = None
        return records


def _sigmoid(x: float) -> float:
    """1 / (1 + e^-x) without overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


class PointwiseLikelihoodScorer:
    """LR of each candidate alone, from the scorer's log-probabilities (see the module docstring).

    Record per request: ``scores`` (floats in 0..100, 2 decimals), ``template`` (``pointwise:<mode>``) and
    ``logprobs`` per passage (judgement: [log p(Yes), log p(No)]; query likelihood: [mean log p(query)]).
    """

    kind = "pointwise"

    def __init__(self, llm, mode: Literal["judgement", "query_likelihood"] = "judgement"):
        if mode not in ("judgement", "query_likelihood"):
            raise ValueError(f"unknown pointwise mode {mode!r} (judgement, query_likelihood)")
        self.llm, self.mode = llm, mode

    @property
    def name(self) -> str:
        return f"pointwise {self.mode}"

    def settings(self) -> dict:
        return {"kind": self.kind, "mode": self.mode, "model": llm_fingerprint(self.llm), "version": 1}

    def _message(self, request: RelevanceRequest, passage: str) -> str:
        if self.mode == "query_likelihood":
            return f"Passage: {passage}\n\nPlease write a search query that this passage answers."
        reference = f"Reference Answer: {request.sub_answer}\n\n" if request.sub_answer is not None else ""
        return (f"Search Query: {request.query}\n\nPassage: {passage}\n\n{reference}"
                "Does the passage answer the Search Query? Answer Yes or No.")

    def score(self, requests: Sequence[RelevanceRequest]) -> list[dict]:
        prompts, continuations, owners = [], [], []
        for r, request in enumerate(requests):
            for passage in request.passages:
                prompt = self.llm.chat_prompt(self._message(request, passage))
                options = [request.query] if self.mode == "query_likelihood" else ["Yes", "No"]
                for option in options:
                    prompts.append(prompt)
                    continuations.append(option)
                owners.append((r, len(options)))
        logprobs = self.llm.score(prompts, continuations) if prompts else []
        records = [{"scores": [], "template": f"pointwise:{self.mode}", "logprobs": []} for _ in requests]
        position = 0
        for r, count in owners:
            values = logprobs[position:position + count]
            position += count
            if self.mode == "query_likelihood":
                mean = sum(values[0]) / max(1, len(values[0]))
                summary, lr = [mean], 100.0 * math.exp(mean)
            else:
                yes, no = sum(values[0]), sum(values[1])
                summary, lr = [yes, no], 100.0 * _sigmoid(yes - no)
            records[r]["logprobs"].append([round(v, 4) for v in summary])
            records[r]["scores"].append(round(lr, 2))
        return records


class RetrieverScores:
    """LR from the candidate retriever itself: 100 x its score, clamped to 0..100 (cosine for dense indexes).
    A baseline for the audit: it can only agree with the ranking mining starts from."""

    name = "retriever score"

    @staticmethod
    def scores(passages: list[dict]) -> list[float]:
        return [round(min(100.0, max(0.0, 100.0 * p["score"])), 2) for p in passages]
