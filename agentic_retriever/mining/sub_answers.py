"""Stage 3: sub-answers, one scorer-LLM call per trajectory ("Agentic-R: Learning to Retrieve for Agentic
Search", section 4.1.1, Figure 8).

The scorer sees the question, its gold answers and the whole trajectory, and writes one
``<sub-answer> ... </sub-answer>`` per search query, "Not Sure" when it cannot tell. Round i gets the i-th
sub-answer (`parse.parse_sub_answers`: a count mismatch gives no round a sub-answer, never a shifted one);
its listwise prompt is then Figure 6, otherwise Figure 7. Greedy decoding, as the authors' release.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentic_retriever.base.fingerprint import llm_fingerprint
from agentic_retriever.base.llm.protocol import SamplingParams
from .parse import parse_sub_answers
from .prompts import PROMPT_VERSION, sub_answer_prompt

__all__ = ["SubAnswerGenerator", "SubAnswerRequest"]


@dataclass(frozen=True)
class SubAnswerRequest:
    """One trajectory: its question, gold answers, response text and number of search queries."""

    question: str
    golden_answers: tuple[str, ...]
    trajectory_text: str
    num_queries: int


class SubAnswerGenerator:
    """Figure 8 over a batch of trajectories in one `generate` call.

        generator = SubAnswerGenerator(scorer_llm)
        [record] = generator.generate([SubAnswerRequest(q, golds, trajectory.response_text, 2)])
        record["answers"]  # ["Urban Cowboy", None]
    """

    def __init__(self, llm, max_new_tokens: int = 256):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        self.llm, self.max_new_tokens = llm, max_new_tokens

    def settings(self) -> dict:
        """What changes the result (part of the cache key); the model by its content (`fingerprint.llm_fingerprint`)."""
        return {"prompt_version": PROMPT_VERSION, "model": llm_fingerprint(self.llm), "max_new_tokens": self.max_new_tokens}

    def generate(self, requests: Sequence[SubAnswerRequest]) -> list[dict]:
        """Per request: ``answers`` (per search query, None = no sub-answer), ``status``, ``found`` tags, ``raw``."""
        if not requests:
            return []
        prompts = [self.llm.chat_prompt(sub_answer_prompt(r.question, r.golden_answers, r.trajectory_text))
                   for r in requests]
        outputs = self.llm.generate(prompts, SamplingParams(max_new_tokens=self.max_new_tokens))
        records = []
        for request, gens in zip(requests, outputs):
            parsed = parse_sub_answers(gens[0].text, request.num_queries)
            records.append({"answers": parsed.answers, "status": parsed.status, "found": parsed.found,
                            "raw": gens[0].text})
        return records
