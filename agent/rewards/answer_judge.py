"""Is an agent's answer correct? An LLM judge answering YES/NO, or exact match where no judge is configured.

"Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with Reasoning Language Models"
(anonymous ACL submission; /work/shared/papers) decides the correctness of Eqs. 10-11 and its "LLM as a Judge"
(LasJ) metric with one judge LLM (Qwen3-235B-A22B-Instruct), the same in training and testing (section 4.1,
Appendix B.2); its prompt is Appendix B.4's "Instruction for Judge LLM", `JUDGE_PROMPT` here.

What the paper leaves open, and what we chose [I]:

* the placeholders: the paper prints "Prediction: normalized prediction Reference Answers: normalized golden";
  we fill ``{prediction}`` with the SQuAD-normalised answer and ``{golden}`` with the normalised golden answers as
  a Python list literal (as s3's judge prompt, `agent.rewards.generation`); the rest of the text is byte for byte
  the paper's, its line breaks lost in the paper's text as we have it;
* an answer that exactly matches a golden answer (`agentic_retriever.base.qa_metrics.exact_match`) is correct without
  asking the judge (a same-string prediction "expresses the same meaning"), and a rollout without an answer is
  wrong without asking: the judge sees only the undecided rest, all in ONE batched `generate` call;
* the verdict is read by `agent.rewards.generation.judge_check` (first word yes/no in any case, leading quotes or
  ``*`` skipped); a malformed verdict counts as wrong and is counted;
* the prompt goes through the judge's chat template (`LLM.chat_prompt`), decoding is greedy, 8 new tokens.

Without a judge, exact match decides ("exact_match" in `Correctness.method`), the offline fallback.

    verdicts = judge_answers(["Paris", "the city of Paris"], [["Paris"], ["Paris"]], judge=None)
    verdicts.correct, verdicts.method        # [True, False], 'exact_match'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agentic_retriever.base.llm.protocol import LLM, SamplingParams, generate_checked
from agentic_retriever.base.qa_metrics import Golden, exact_match, golden_strings, normalize_answer

from .generation import JUDGE_SAMPLING, judge_check

__all__ = ["JUDGE_PROMPT", "Correctness", "CorrectnessMethod", "judge_answers", "judge_prompt"]

#: Appendix B.4, "Instruction for Judge LLM", byte for byte but for the placeholders ``{prediction}`` and
#: ``{golden}`` (the paper: "normalized prediction", "normalized golden").
JUDGE_PROMPT = (
    "You are an evaluation assistant. Your task is to determine whether the given prediction semantically matches "
    "any of the reference answers. This is a flexible match: even if the wording is different, if the meaning is "
    "the same, consider it a match. Prediction: {prediction} Reference Answers: {golden} Please answer with a "
    "single word: - YES \u2192 if the prediction expresses the same meaning as any of the reference answers. - NO "
    "\u2192 otherwise. Only respond with YES or NO."
)

CorrectnessMethod = Literal["judge", "exact_match"]


@dataclass(frozen=True)
class Correctness:
    """The verdicts of a batch, in input order, and how they were reached: `method` "judge" (an LLM judge, exact
    matches and missing answers decided without it) or "exact_match" (no judge); `asked[i]` whether the judge read
    answer i; the judge's call count (0 or 1) and its malformed verdicts."""

    correct: list[bool]
    method: CorrectnessMethod
    asked: list[bool]
    judge_calls: int = 0
    judge_malformed: int = 0


def judge_prompt(prediction: str, golden: Golden) -> str:
    """The judge's user message for one answer: `JUDGE_PROMPT` with both sides normalised."""
    golds = [normalize_answer(g) for g in golden_strings(golden)]
    return JUDGE_PROMPT.format(prediction=normalize_answer(prediction), golden=str(golds))


def judge_answers(predictions: Sequence[str | None], golden: Sequence[Golden], judge: LLM | None,
                  params: SamplingParams = JUDGE_SAMPLING) -> Correctness:
    """Whether each prediction is correct: exact match alone with no `judge`; else exact match, then ONE judge
    call for the answers it did not accept (see the module docstring)."""
    if len(predictions) != len(golden):
        raise ValueError(f"golden answers must be parallel to predictions: got {len(golden)} for {len(predictions)}")
    matched = [exact_match(p, g) == 1.0 for p, g in zip(predictions, golden)]
    if judge is None:
        return Correctness(matched, "exact_match", [False] * len(matched))
    asked = [not ok and p is not None and p.strip() != "" for ok, p in zip(matched, predictions)]
    prompts = [judge.chat_prompt(judge_prompt(p, g)) for p, g, a in zip(predictions, golden, asked) if a]
    outputs = generate_checked(judge, prompts, params) if prompts else []
    verdicts = iter(judge_check(gens[0].text) for gens in outputs)
    correct, malformed = [], 0
    for ok, ask in zip(matched, asked):
        verdict = next(verdicts) if ask else None
        malformed += ask and verdict is None
        correct.append(ok or bool(verdict))
    return Correctness(correct, "judge", asked, int(bool(prompts)), malformed)
