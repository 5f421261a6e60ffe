"""Search-R1's format check f_format: the ``is_valid_sequence`` state machine.

"An Empirical Study on Reinforcement Learning for Reasoning-Search Interleaved LLM Agents", arXiv 2505.15117,
section 4.1 and Appendix C (Listing 1): a response is valid when

1. every tag of ``think``, ``search``, ``information``, ``answer`` opens as often as it closes, and
2. its tags, read in order, follow

       start -> <think> -> </think> -> ( <search> -> </search> -> <information> -> </information> -> <think> -> </think> )*
             -> <answer> -> </answer> -> end

   with any text inside a tag pair and only whitespace outside (before the first tag, between tags, after
   ``</answer>``).

So every search is followed by its ``<information>`` and then a new ``<think>``; an answer comes right after a
``</think>``; tags do not nest. The reason strings are those of Listing 1.

Listing 1 first cuts the text at ``<|im_start|>assistant`` (it scores the chat-formatted prompt + response) and
rejects text without that marker. Rewards here score the response alone, so no marker is needed; pass
``assistant_marker=QWEN_ASSISTANT_MARKER`` to check a prompt + response string exactly as Listing 1 does.

Consequences worth knowing (both as in the release): a response with an invalid action is invalid, since the
environment's invalid-action message is text outside tags (and holds ``<search>``/``<answer>`` tags); an
observation cut inside ``</information>`` by the 500-token limit leaves the tags unbalanced.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .base import Response, response_text
from .registry import register

__all__ = ["QWEN_ASSISTANT_MARKER", "SEARCH_R1_TAGS", "SequenceCheck", "is_valid_sequence", "search_r1_valid_format_reward"]

SEARCH_R1_TAGS = ("think", "search", "information", "answer")
QWEN_ASSISTANT_MARKER = r"<\|im_start\|>assistant\s*"

_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")

# (state, tag) -> next state; any other tag in a state makes the sequence invalid.
_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_INSIDE_TAGS = frozenset({"in_think", "in_search", "in_information", "in_answer"})


class SequenceCheck(NamedTuple):
    """The verdict of `is_valid_sequence`; unpacks like Listing 1's ``(valid, reason)``."""

    valid: bool
    reason: str


def is_valid_sequence(response: Response, *, assistant_marker: str | None = None) -> SequenceCheck:
    """f_format of Eq. 3 (empirical study, Appendix C): does the response follow the state machine above?

    `assistant_marker` (a regex, e.g. `QWEN_ASSISTANT_MARKER`): check only the text after its first match,
    and reject text without one, as Listing 1 does on prompt + response.
    """
    content = response_text(response)
    if assistant_marker is not None:
        marker = re.search(assistant_marker, content)
        if marker is None:
            return SequenceCheck(False, "Missing assistant marker")
        content = content[marker.end():]
    for tag in SEARCH_R1_TAGS:
        opening, closing = content.count(f"<{tag}>"), content.count(f"</{tag}>")
        if opening != closing:
            return SequenceCheck(False, f"Mismatch in {tag} tags: {opening} opening vs {closing} closing tags")
    state = "start"
    for part in _TAG.split(content):
        if not part.strip():
            continue
        if _TAG.fullmatch(part):
            following = _TRANSITIONS.get((state, part))
            if following is None:
                return SequenceCheck(False, f"Unexpected tag {part} in state {state}")
            state = following
        elif state == "end":
            return SequenceCheck(False, f"Unexpected content in state {state}")
        elif state not in _INSIDE_TAGS:
            return SequenceCheck(False, f"Unexpected content '{part.strip()}' between tags (state: {state})")
    if state != "end":
        return SequenceCheck(False, f"Incomplete sequence, ended in state {state}")
    return SequenceCheck(True, "Valid sequence format")


@register("search_r1_valid_format")
def search_r1_valid_format_reward(response: Response, golden: object = None) -> float:
    """1.0 when the response passes `is_valid_sequence` (f_format of Eq. 3), else 0.0; `golden` is unused."""
    return float(is_valid_sequence(response).valid)
