"""The shape of a whole `reflect` response: the grammar of the format reward r_f ("Learning When to Search:
Multi-Stage Reward Design for Efficient Agentic RAG with Reasoning Language Models", section 3.3 "Format Reward",
Eq. 6, and the prompt of Appendix B.4; the paper's text gives no arXiv id).

[P] allows two structures: "when retrieval is not required, the output consists of think, reflect, answer; when
retrieval is needed, the output includes multiple iterations of think, search, information, reflect, answer".
Read with the prompt (one ``<think>`` first; after ``<information>`` a ``<reflect>``, then another ``<search>`` or
the answer) and the paper's multi-search example (Table 9), the response's blocks must read, in order::

    think reflect answer                                   (no search)
    think (search information reflect)+ answer             (one or more searches)

What "a block" means here is ours [I]:

* a block is ``<tag>content</tag>`` for one of the five tags ``think``, ``search``, ``information``, ``reflect``,
  ``answer``, spelled exactly so (no spaces or attributes inside the brackets);
* between blocks, and before the first and after the last, only whitespace is allowed: any other text outside
  tags breaks the shape (the paper's failure cases, e.g. "Answer: ..." after ``</think>``, and the environment's
  invalid-action message are such text);
* blocks do not nest: one of the five tags inside ``think``, ``search``, ``reflect`` or ``answer`` breaks the
  shape; the content of ``<information>`` (retrieved text, inserted by the environment) is not read, it only has
  to be closed;
* contents are not checked (an empty ``<search></search>`` or ``<answer></answer>`` has the shape); whether a
  query is concise and whether the answer is right are other rewards' business.

`check_shape` reads the response as the environment records it (`Rollout.response_text`: generated and inserted
text, no prompt, no special tokens such as an end-of-sequence marker). An observation cut by
`EnvConfig.observation_max_tokens` inside ``</information>`` leaves the block unclosed, which breaks the shape.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["TAGS", "ShapeCheck", "check_shape"]

#: The tags of the grammar, in the order the prompt introduces them.
TAGS = ("think", "search", "information", "reflect", "answer")

_TAG = re.compile(r"<(/?)(" + "|".join(TAGS) + r")>")

#: The blocks allowed after each state. The state is the last block's tag, except that a ``reflect`` right after
#: ``think`` (no search) is ``direct_reflect``, after which only the answer may come.
_NEXT: dict[str, tuple[str, ...]] = {
    "start": ("think",),
    "think": ("search", "reflect"),
    "search": ("information",),
    "information": ("reflect",),
    "reflect": ("search", "answer"),
    "direct_reflect": ("answer",),
    "answer": (),
}


class ShapeCheck(NamedTuple):
    """The verdict on a response: `valid`, and `reason`, which names the shape when valid and the first violation
    (with its character offset) when not."""

    valid: bool
    reason: str


class _Broken(Exception):
    """A violation found while splitting the response into blocks (its message is the reason)."""


def _blocks(text: str) -> list[str]:
    """The tags of the response's blocks, in order (see the module docstring); raises `_Broken`."""
    names, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return names
        opening = _TAG.match(text, pos)
        if opening is None:
            raise _Broken(f"text outside tags at offset {pos}: {text[pos:pos + 40]!r}")
        slash, name = opening.groups()
        if slash:
            raise _Broken(f"stray </{name}> at offset {pos}")
        closing = f"</{name}>"
        if name == "information":  # retrieved text: only its end matters
            end = text.find(closing, opening.end())
            if end < 0:
                raise _Broken(f"<information> at offset {pos} is not closed")
        else:
            inner = _TAG.search(text, opening.end())
            if inner is None:
                raise _Broken(f"<{name}> at offset {pos} is not closed")
            if inner.group() != closing:
                raise _Broken(f"<{name}> at offset {pos} is not closed before {inner.group()} at offset "
                              f"{inner.start()}")
            end = inner.start()
        names.append(name)
        pos = end + len(closing)


def _alternatives(tags: tuple[str, ...]) -> str:
    return " or ".join(f"<{t}>" for t in tags)


def check_shape(response_text: str) -> ShapeCheck:
    """Whether `response_text` is ``think reflect answer`` or ``think (search information reflect)+ answer``, as
    blocks separated by whitespace only (module docstring). On failure `reason` names the first violation."""
    try:
        names = _blocks(response_text)
    except _Broken as broken:
        return ShapeCheck(False, str(broken))
    if not names:
        return ShapeCheck(False, "no blocks: the response is empty or whitespace")
    state = "start"
    for index, name in enumerate(names, start=1):
        allowed = _NEXT[state]
        if name not in allowed:
            where = "first" if state == "start" else f"after <{state.removeprefix('direct_')}>"
            expected = _alternatives(allowed) if allowed else "nothing"
            if state == "direct_reflect":
                where += " with no search before it"
            return ShapeCheck(False, f"block {index} is <{name}>; expected {expected} {where}")
        state = "direct_reflect" if (state, name) == ("think", "reflect") else name
    if state != "answer":
        return ShapeCheck(False, f"no <answer>: the response ends after <{state.removeprefix('direct_')}>")
    searches = names.count("search")
    if searches == 0:
        return ShapeCheck(True, "think -> reflect -> answer")
    return ShapeCheck(True, f"think -> (search -> information -> reflect) x{searches} -> answer")
