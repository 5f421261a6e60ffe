"""QAgent's format rule r_fmt, the gate of its stage-1 reward ("QAgent: A modular Search Agent with Interactive
Query Understanding", arXiv 2510.08383, section 3.3, Eq. 7: "The reward format supports pre-retrieval planning,
post-retrieval reflection, and final answer tags").

A response (prompt excluded) has the format when all three clauses hold:

1. every ``<search>`` (or ``<search >``: the dialect's pattern, `agent.dialects.qagent.SEARCH_OPEN`) is immediately
   preceded by a closed ``<plan>...</plan>`` block;
2. every ``<information>`` block is closed and immediately followed by a closed ``<reflection>...</reflection>``
   block;
3. a closed ``<answer>...</answer>`` block (``<answer >`` too) exists.

"Immediately" [I] allows whitespace only between the two tags: ``</plan>\\n<search>`` and
``</information>\\n\\n<reflection>`` pass, any other text in between fails. A plan block holds no other
``<plan>``/``</plan>`` tag and a reflection block no other reflection tag. Nothing else is checked (tag contents,
the ``<query>`` lines of a search, text outside tags, the order of rounds): the paper names these three clauses only.
The environment's invalid-action message (Search-R1's rethink text, which QAgent reuses) holds
``<search> and </search>`` with no plan before it, so a response with an invalid action fails clause 1.

    check_format("<plan>p</plan>\\n<search>\\n<query>q</query>\\n</search>\\n\\n<information>Doc 1 ...</information>"
                 "\\n<reflection>r</reflection>\\n<answer> Paris </answer>")   # FormatCheck(valid=True, ...)
"""

from __future__ import annotations

import re
from typing import NamedTuple

from agentic_retriever.base.qa_metrics import Golden

from ..dialects.qagent import ANSWER_OPEN, SEARCH_OPEN
from .base import Response, response_text
from .registry import register

__all__ = ["FormatCheck", "check_format", "qagent_valid_format_reward"]

_SEARCH = re.compile(SEARCH_OPEN)
_PLAN_THEN_SEARCH = re.compile(rf"<plan>(?:(?!</?plan>).)*</plan>\s*{SEARCH_OPEN}", re.DOTALL)
_INFORMATION_THEN_REFLECTION = re.compile(
    r"<information>(?:(?!</?information>).)*</information>\s*<reflection>(?:(?!</?reflection>).)*</reflection>",
    re.DOTALL)
_ANSWER = re.compile(rf"{ANSWER_OPEN}.*?</answer>", re.DOTALL)


class FormatCheck(NamedTuple):
    """r_fmt of one response: `valid`, and `reason` naming the first clause that failed ("ok" when none)."""

    valid: bool
    reason: str


def check_format(response: Response) -> FormatCheck:
    """The three clauses of the module docstring, checked in order."""
    text = response_text(response)
    searches = len(_SEARCH.findall(text))
    if len(_PLAN_THEN_SEARCH.findall(text)) != searches:
        return FormatCheck(False, "a <search> without a <plan>...</plan> right before it")
    informations = text.count("<information>")
    if len(_INFORMATION_THEN_REFLECTION.findall(text)) != informations or \
            text.count("</information>") != informations:
        return FormatCheck(False, "an <information> block without a <reflection>...</reflection> right after it")
    if _ANSWER.search(text) is None:
        return FormatCheck(False, "no <answer>...</answer>")
    return FormatCheck(True, "ok")


@register("qagent_valid_format")
def qagent_valid_format_reward(response: Response, golden: Golden) -> float:
    """r_fmt as a number: 1.0 when the response has QAgent's format (plan before every search, reflection after
    every information block, an answer), else 0.0; `golden` is not read."""
    return float(check_format(response).valid)
