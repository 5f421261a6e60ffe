"""Reading the scorer LLM's outputs: sub-answers (Figure 8) and listwise relevance scores (Figures 6, 7) of
"Agentic-R: Learning to Retrieve for Agentic Search".

Both parsers take whatever a model wrote and never raise; they say what they found.

Sub-answers (Agentic-R, section 4.1.1): every ``<sub-answer> ... </sub-answer>`` in order, stripped.
"Not Sure" (any case, quotes or final punctuation around it) and an empty tag mean "no sub-answer". The
answers are used only when there are exactly as many as the trajectory has search queries: with fewer or
more, no round gets one (a shifted list would give round i the sub-answer of round i+1).

Scores: the authors' release splits the stripped output on single spaces and ``int()``s the first n items
(n = passages of the window), clamping to 0..100; anything else fails the window. Here the same output
parses the same way, and common deviations are read too: words around the numbers ("Scores: 68 42 97."),
commas or newlines between them, passage labels (``[3]``, ``Passage 3:``), line enumerations counting 1, 2, 3
(``1. 68``), the scale (``68/100``, "out of 100"), decimals (rounded half up), negative or > 100 values
(clamped), and a hyphen between digits as a separator (``68-42-97``). More numbers than passages fail
(status ``extra_numbers``), as the release's parse fails them: "1: 68 2: 42 3: 97" would otherwise read as
[1, 68, 2], so the window is asked again instead. Too few fail too (status ``too_few``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["ScoreParse", "SubAnswerParse", "is_not_sure", "parse_scores", "parse_sub_answers"]

_SUB_ANSWER = re.compile(r"<sub-answer>(.*?)</sub-answer>", re.DOTALL | re.IGNORECASE)
_NOT_SURE = re.compile(r"""^[\s"'`*.(]*not\s+sure[\s"'`*.!)]*$""", re.IGNORECASE)

# labels that carry a number that is not a score: "[3]", "Passage 3", "Passage [3]", "Doc 3", "#3"
_LABEL = re.compile(r"\[\s*\d+\s*\]|\b(?:passage|doc(?:ument)?)s?\s*\[?\s*\d+\s*\]?|#\s*\d+", re.IGNORECASE)
# an enumeration at the start of a line: "1. ", "2) ", "3: " followed by another number on that line
_ENUMERATION = re.compile(r"^\s*(\d+)\s*[.):]\s+(?=.*\d)", re.MULTILINE)
# "out of 100", "/100": the scale, not a score
_SCALE = re.compile(r"\bout\s+of\s+100\b|/\s*100\b", re.IGNORECASE)
# a hyphen right after a digit separates ("68-72" is 68 and 72); elsewhere it is a minus sign
_RANGE_HYPHEN = re.compile(r"(?<=\d)-")
# a number not glued to a letter, digit or dot: "68", "-5", "72.5" ("v2", "3rd" and "68a" are not numbers)
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\w)")


@dataclass(frozen=True)
class SubAnswerParse:
    """Per search query, its sub-answer or None; `status` says why they are all None when they are."""

    answers: list[str | None]
    status: Literal["ok", "count_mismatch"]
    found: int  # tags found in the output

    @property
    def given(self) -> int:
        return sum(a is not None for a in self.answers)


def is_not_sure(text: str) -> bool:
    return bool(_NOT_SURE.match(text))


def parse_sub_answers(text: str, num_queries: int) -> SubAnswerParse:
    """The sub-answers of `text` for a trajectory with `num_queries` search queries (see module docstring)."""
    found = [m.strip() for m in _SUB_ANSWER.findall(text)]
    if len(found) != num_queries:
        return SubAnswerParse([None] * num_queries, "count_mismatch", len(found))
    return SubAnswerParse([None if not a or is_not_sure(a) else a for a in found], "ok", len(found))


@dataclass(frozen=True)
class ScoreParse:
    """The scores of one window (None when it failed) and what the parser saw."""

    scores: list[int] | None
    status: Literal["ok", "extra_numbers", "too_few"]
    found: int  # numbers found

    @property
    def ok(self) -> bool:
        return self.scores is not None


def _strip_enumeration(text: str) -> str:
    """Drop line-start enumerators when they count 1, 2, 3... (so "68. 42. 97." keeps its 68)."""
    found = [int(m.group(1)) for m in _ENUMERATION.finditer(text)]
    if not found or found != list(range(1, len(found) + 1)):
        return text
    return _ENUMERATION.sub(" ", text)


def _clamp(value: float) -> int:
    return min(100, max(0, math.floor(value + 0.5)))


def parse_scores(text: str, expected: int) -> ScoreParse:
    """`expected` scores in 0..100 read from a listwise scorer's output (see module docstring)."""
    if expected < 1:
        raise ValueError(f"expected must be at least 1, got {expected}")
    cleaned = _strip_enumeration(_LABEL.sub(" ", _SCALE.sub(" ", text)))
    numbers = [float(m) for m in _NUMBER.findall(_RANGE_HYPHEN.sub(" ", cleaned))]
    if len(numbers) < expected:
        return ScoreParse(None, "too_few", len(numbers))
    if len(numbers) > expected:
        return ScoreParse(None, "extra_numbers", len(numbers))
    return ScoreParse([_clamp(v) for v in numbers], "ok", len(numbers))
