"""The `reflect` dialect of "Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with
Reasoning Language Models" (anonymous ACL submission; the paper's text gives no arXiv id): section 3.2 "Rollout
with Search", section 3.3 "Format Reward", section 4.2, Appendix B.3 (Table 5) and B.4 ("Instruction for Trained
RLM").

The agent thinks, then either reflects and answers from its own knowledge, or searches, reads the
``<information>`` the environment returns, reflects on it, and searches again or answers:
``think reflect answer`` or ``think (search information reflect)+ answer`` (`check_shape`, the grammar of the
format reward). The paper's method has no public code; this is its first implementation. [P] = the paper, [I] =
our reading where the paper leaves things open:

* the prompt is B.4's "Instruction for Trained RLM" byte for byte as the paper's text gives it (`INSTRUCTION`,
  backticks around the tags included: they may be the PDF's code font rendered as text [I]) [P]. The paper shows
  no place for the question; `build_prompt` appends ``"\\n\\nQuestion: {question}\\n"`` with Search-R1's question
  normalisation (stripped, "?" appended unless it ends with one) [I];
* "when the generation process encounters the </search> tag, the query between the preceding <search> and the
  current </search> tags will be used as a search query" and the results go "within <information> and
  </information>" (section 3.2) [P]: that is Search-R1's loop, which this dialect keeps whole [I]: a turn stops at
  ``</search>`` or ``</answer>`` ([P] names only ``</search>`` and the end of sequence; the answer is the last
  block of both shapes, so stopping there loses nothing), the first closed ``<search>``/``<answer>`` of a turn
  decides the action, the observation is Search-R1's ``Doc i(Title: "T") text`` lines (the paper's examples show
  this format, Tables 7 and 9), an unreadable turn gets Search-R1's invalid-action message ([P] gives none), and
  after `max_turns` turns one last generation whose searches are not executed; the answer is the last
  ``<answer>`` of the response, stripped;
* the environment does not enforce the shape (a search with no ``<reflect>`` after the previous observation is
  still executed); the format reward judges the whole response with `check_shape` [I];
* the retrieval count RC (sections 3.3, 4.3) is the number of executed searches, `Rollout.num_searches`;
  `search_queries` lists those searches' queries in order from a response text (the N queries of the search
  reward's Eq. 8), so RC is also its length.

The paper's sizes are `ReflectSettings`; the environment's share is ``EnvConfig(**ReflectSettings().env_fields())``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.qa_metrics import Golden

from .base import Dialect, DialectSettings
from .reflect_shape import ShapeCheck, check_shape
from .search_r1 import SearchR1Dialect, search_r1_question

if TYPE_CHECKING:
    from ..env import Rollout

__all__ = ["INSTRUCTION", "ReflectDialect", "ReflectSettings", "ShapeCheck", "check_shape", "search_queries"]

#: Appendix B.4 of [P], "Instruction for Trained RLM", byte for byte as the paper's text gives it (its sub-items
#: run on within their numbered line; no newline at the end).
INSTRUCTION = (
    "Please answer the given question by following the structured reasoning protocol below:\n"
    "\n"
    "1. Always begin with `<think>...</think>` to provide a brief internal reasoning sketch. - This reasoning must "
    "primarily rely on your internal knowledge and reasoning abilities. - If your internal knowledge is sufficient "
    "to answer the question, do not assume the need for external tools.\n"
    "2. If your internal knowledge is sufficient to answer the question: - Provide a concise summary of your "
    "reasoning inside `<reflect>...</reflect>`. - Then give the final answer inside `<answer>...</answer>`. - Under "
    "no circumstances should you generate a `<search>` block if your internal knowledge is adequate.\n"
    "3. Only if your internal knowledge is genuinely insufficient to answer the question: - Generate a brief "
    "keyword-based search query inside `<search>...</search>`. The query should be as concise as possible but must "
    "include sufficient factual clues, such as names, dates, locations, key concepts, etc. - The query should be a "
    "brief description with multiple keywords instead of a natural language question.\n"
    "4. When the system returns information inside `<information>...</information>`: - If the information is "
    "reliable and sufficient, integrate it with your reasoning inside `<reflect>...</reflect>`. - Then provide the "
    "final concise answer inside `<answer>...</answer>`.\n"
    "5. If the retrieved information is insufficient or contradicts your internal knowledge: - Explain the issue "
    "within `<reflect>...</reflect>`. - If necessary, generate a revised `<search>` query.\n"
    "6. Final rule: - The final answer must be concise and clear, placed inside `<answer></answer>`. - Internal "
    "reasoning (in `<think>`) must always be the primary method; tool usage should be a last resort, not the "
    "default."
)

#: An executed search: a ``<search>`` block right before (whitespace allowed) the ``<information>`` the environment
#: inserted for it. Its content stops at the first ``</search>``, as the environment's parser reads it.
_EXECUTED_SEARCH = re.compile(r"<search>((?:(?!</search>).)*)</search>\s*<information>", re.DOTALL)


@dataclass(frozen=True)
class ReflectSettings(DialectSettings):
    """The paper's sizes, all the environment's (``EnvConfig(**settings.env_fields())``):

    * `topk` 5 passages per search ("we standardized the retrieval setting with top k equal to 5", section 4.2) [P];
    * `max_turns` 5 (Table 5, ``max_turns``) [P];
    * `max_new_tokens_per_turn` 8192 (Table 5, ``max_action_length``, read as one turn's generation) [I];
    * `observation_max_tokens` 4096 (Table 5, ``max_obs_length``) [P];
    * `max_context_tokens` 18432 = ``max_prompt_length`` 2048 + ``max_response_length`` 16384 (Table 5) [I].
    """

    DIALECT: ClassVar[str] = "reflect"

    topk: int = 5
    max_turns: int = 5
    max_new_tokens_per_turn: int = 8192
    observation_max_tokens: int = 4096
    max_context_tokens: int = 18432


def search_queries(response_text: str) -> list[str]:
    """The queries of the executed searches of a response, in order, stripped as the environment sends them: every
    ``<search>..</search>`` followed by an ``<information>`` block, so their number is the retrieval count RC
    (`Rollout.num_searches`). A search the environment did not execute (the search-disabled last turn) and tags
    quoted in the invalid-action message are not queries."""
    return [q.strip() for q in _EXECUTED_SEARCH.findall(response_text)]


class ReflectDialect(SearchR1Dialect):
    """`reflect`: ``<think>``, ``<search>``, ``<information>``, ``<reflect>``, ``<answer>``. From Search-R1 it
    keeps the stop strings, the parser, the invalid-action message, the search-disabled last turn, the observation
    and the answer extraction; the prompt is the paper's."""

    name = "reflect"

    def build_prompt(self, question: str, initial_passages: Sequence[Sequence[ScoredPassage]] = ()) -> str:
        """`INSTRUCTION`, a blank line, and ``Question: {question}`` with Search-R1's normalisation [I]."""
        if initial_passages:
            raise ValueError("the reflect dialect retrieves nothing before the first turn")
        return f"{INSTRUCTION}\n\nQuestion: {search_r1_question(question)}\n"

    def training_diagnostics(self, result: Rollout, golden: Golden) -> dict[str, float]:
        """EM, the shape (Eq. 6's allowed shapes) and whether it answered without searching."""
        return Dialect.training_diagnostics(self, result, golden) | {
            "valid_format": float(check_shape(result.response_text).valid),
            "answered_without_search": float(result.finish_reason == "answer" and result.num_searches == 0)}
