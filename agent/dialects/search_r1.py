"""The Search-R1 dialect ("Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement
Learning", arXiv 2503.09516; the empirical study, "An Empirical Study on Reinforcement Learning for
Reasoning-Search Interleaved LLM Agents", arXiv 2505.15117).

Everything here follows the authors' public release [R], byte for byte: the prompt of its NQ data preparation
(``make_prefix``, template "base"), and the action parser, observation and invalid-action texts of its
generation loop:

* the question is stripped and gets a "?" appended unless it already ends with one;
* a turn stops at ``</search>`` or ``</answer>``; the first ``<(search|answer)>(.*?)</\\1>`` match (DOTALL)
  decides the action, its content stripped; no match is an invalid action;
* an observation is ``"\\n\\n<information>" + body.strip() + "</information>\\n\\n"`` where the body holds
  ``"Doc {i}(Title: {title}) {text}\\n"`` per passage. [R] takes ``title`` as the first line of the corpus
  ``contents`` (``"Title"`` with its quotes, as in wiki-18) and strips the body, so the last passage has no
  newline before ``</information>``; both are kept here, since the released agents were trained on them.
  (The 500-token cut of every inserted text is the environment's, `EnvConfig.observation_max_tokens`.)
* the final answer is the content of the last ``<answer>`` in the response, stripped ([R] scores
  prompt+response and so needs a second match; scoring the response alone, the last match is the answer).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.qa_metrics import Golden

from .base import Action, Dialect

if TYPE_CHECKING:
    from ..env import Rollout

__all__ = ["SearchR1Dialect", "search_r1_question"]

PROMPT_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search>"
    " and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and"
    " </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def search_r1_question(question: str) -> str:
    """The question as [R] puts it in the prompt: stripped, with "?" appended unless it ends with one."""
    question = question.strip()
    if not question:
        raise ValueError("the question is empty")
    return question if question.endswith("?") else question + "?"


class SearchR1Dialect(Dialect):
    """Search-R1: ``<think>``, ``<search> q </search>``, ``<information>``, ``<answer> a </answer>``."""

    name = "search_r1"
    stop = ("</search>", "</answer>")
    invalid_action_message = INVALID_ACTION_MESSAGE
    search_disabled_on_last_turn = True

    def build_prompt(self, question: str, initial_passages: Sequence[Sequence[ScoredPassage]] = ()) -> str:
        if initial_passages:
            raise ValueError("the search_r1 dialect retrieves nothing before the first turn")
        return PROMPT_TEMPLATE.format(question=search_r1_question(question))

    def parse_action(self, turn_text: str) -> Action:
        match = _ACTION.search(turn_text)
        if match is None:
            return Action("invalid")
        content = match.group(2).strip()
        return Action("search", queries=(content,)) if match.group(1) == "search" else Action("answer", answer=content)

    def format_observation(self, results: Sequence[Sequence[ScoredPassage]]) -> str:
        """All passages of the action, numbered from 1 in order (one query per action gives one list)."""
        passages = [p for hits in results for p in hits]
        body = "".join(f'Doc {i}(Title: "{p.title}") {p.text}\n' for i, p in enumerate(passages, start=1))
        return f"\n\n<information>{body.strip()}</information>\n\n"

    def extract_answer(self, response_text: str) -> str | None:
        matches = _ANSWER.findall(response_text)
        return matches[-1].strip() if matches else None

    def training_diagnostics(self, result: Rollout, golden: Golden) -> dict[str, float]:
        """EM, the valid format (Search-R1's Eq. 3 f_format) and a gold answer in the retrieved text (Eq. 4's f_ret),
        by the rewards' own checks (`agent.rewards`, which read this dialect's tags: imported when called)."""
        from ..rewards import gold_in_information, is_valid_sequence

        return Dialect.training_diagnostics(self, result, golden) | {
            "valid_format": float(is_valid_sequence(result.response_text).valid),
            "retrieval_hit": float(gold_in_information(result.response_text, golden))}

