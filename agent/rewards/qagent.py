"""QAgent's two-stage reward ("QAgent: A modular Search Agent with Interactive Query Understanding",
arXiv 2510.08383, sections 3.3 and 3.4, Eqs. 7-10; docs/rl.md, "QAgent").

    stage 1 (Eq. 7)   R(tau) = 1{r_fmt(tau) = 1} x EM_s(A*, A_hat)
    stage 2 (Eq. 10)  R(tau) = EM(A*, A_tilde) + 0.5 x Hit(tau, A*),   A_tilde = G(q, K),  K = parseDocSet(tau)

* r_fmt: `agent.rewards.qagent_format.check_format` (plan before every search, reflection after every
  information block, an answer);
* EM_s: strict EM, "the same as Search-R1": SQuAD-normalised equality of the last ``<answer>`` of the response
  with a golden answer (`QAgentDialect.extract_answer`, which reads ``<answer >`` as the dialect's parser does;
  `agentic_retriever.base.qa_metrics.exact_match`);
* EM in Eq. 10 is "relaxed to non-strict EM": EM_contains, a normalised gold occurs in the normalised answer on
  word boundaries (`agentic_retriever.base.qa_metrics.contains_match`, the paper's evaluation EM, section 4.1);
* Hit: "the entire trajectory contains the gold answer": EM_contains over the response text, i.e. everything
  generated plus the inserted ``<information>`` blocks, the prompt excluded (`qagent_hit`);
* K: every passage retrieved in the episode, deduplicated by id, first seen first (the QAgent dialect's
  `agent.env.Rollout.selection`; section 4.1: "we retrieve 1 passage each query and deduplicate before sending
  to the generator"); G: a frozen generator asked with `QAGENT_GENERATOR`.

Stage 1 and Hit are pure functions of (response, golden): response rewards (`agent.rewards.REWARDS`, verl
wrappers in `agent.rl.verl.reward`). Stage 2 also needs G's answer, so it is a function of (generated answer,
response, golden), registered as a ``submodule`` reward ("the agent as a submodule": a frozen generator reads what
it retrieved), scored a step at a time by `agent.rl.batch_reward.SubmoduleReward` with one batched generator
call; it has no verl wrapper (verl's reward manager gives a reward only the decoded response and the ground truth,
no generator and no retrieved documents).

The generator prompt is the release's [R] (IMPLEMENTATION_NOTES, "QAgent"): ``{passage}\\n\\nAnswer the given
question. The answer should be a few short words. Question: {question}.`` with ``{passage}`` written
``{context}`` here. How the passages fill it is not in the paper: [I] Search-R1's observation lines,
``Doc {i}(Title: {title}) {text}`` one per line (QAgent's framework is Search-R1's, section 4.1).
"""

from __future__ import annotations

from collections.abc import Sequence

from agentic_retriever.base.corpus import Passage
from agentic_retriever.base.qa_metrics import Golden, contains_match, exact_match

from ..dialects.qagent import QAgentDialect
from .base import Response, response_text
from .generation import GeneratorPrompt
from .qagent_format import check_format
from .registry import register

__all__ = ["DEFAULT_HIT_WEIGHT", "QAGENT_GENERATOR", "QAGENT_GENERATOR_PROMPT", "as_sentence", "format_passages", "hit",
           "hit_reward", "qagent_stage1_reward", "qagent_stage2_reward"]

#: The release's frozen-generator prompt [R], ``{passage}`` written ``{context}``; its "Question: {question}." ends
#: the question with a period, which `as_sentence` writes only where the question has no final punctuation (a
#: question ending in "?" would read "?.").
QAGENT_GENERATOR_PROMPT = ("{context}\n\nAnswer the given question. The answer should be a few short words. "
                           "Question: {question}")

DEFAULT_HIT_WEIGHT = 0.5

_DIALECT = QAgentDialect()

def format_passages(documents: Sequence[Passage]) -> str:
    """The generator's ``{context}`` [I]: ``Doc {i}(Title: {title}) {text}`` per passage, one per line, from 1."""
    return "".join(f"Doc {i}(Title: {d.title}) {d.text}\n" for i, d in enumerate(documents, start=1)).rstrip("\n")


def as_sentence(question: str) -> str:
    """The question stripped, with the template's final period unless it already ends in ".", "?" or "!"."""
    question = question.strip()
    return question if question.endswith((".", "?", "!")) else question + "."


#: QAgent's frozen generator prompt: the release's template, the passages as `format_passages` writes them.
QAGENT_GENERATOR = GeneratorPrompt(QAGENT_GENERATOR_PROMPT, format_passages, as_sentence)


def hit(response: Response, golden: Golden) -> bool:
    """Hit(tau, A*): a golden answer occurs, normalised and on word boundaries, in the response text (generated
    text and inserted information; the prompt is not part of a response)."""
    return bool(contains_match(response_text(response), golden))


@register("qagent_hit")
def hit_reward(response: Response, golden: Golden) -> float:
    """Hit of Eq. 10 as a number: 1.0 when the trajectory (prompt excluded) contains a golden answer, else 0.0."""
    return float(hit(response, golden))


@register("qagent_stage1")
def qagent_stage1_reward(response: Response, golden: Golden) -> float:
    """Eq. 7: strict EM of the last ``<answer>`` when the response has QAgent's format, else 0.0."""
    if not check_format(response).valid:
        return 0.0
    return exact_match(_DIALECT.extract_answer(response_text(response)), golden)


@register("qagent_stage2", kind="submodule", dialect="qagent", needs=("generator",))
def qagent_stage2_reward(answer: str | None, response: Response, golden: Golden, *,
                  hit_weight: float = DEFAULT_HIT_WEIGHT) -> float:
    """Eq. 10: EM_contains of the frozen generator's `answer` plus `hit_weight` (0.5) x Hit of the response; no
    format gate. In [0, 1 + hit_weight]."""
    if hit_weight < 0:
        raise ValueError(f"hit_weight must be >= 0, got {hit_weight}")
    return contains_match(answer, golden) + hit_weight * float(hit(response, golden))
