"""GAC's target for multi-hop questions: the answer of the sub-question a round's query pursues (a deviation).

Agentic-R's global answer correctness asks whether the agent's FINAL answer is right once a candidate fills the
round's ``<information>`` ("Agentic-R: Learning to Retrieve for Agentic Search", arXiv 2601.11888, section 4.1.1,
Eqs. 2-3). A small agent answers almost no multi-hop question right, whatever it reads, so on the multi-search
agent's rounds (Q = the multi-hop question, q = one sub-query) that target tells candidates apart only by noise.
With ``gac_target: sub_question`` the target of a round is instead the gold answer of the leaf sub-question its
query pursues, which the question's decomposition gives (train questions only, never an evidence title): a
passage is useful to that round when it makes the answer of what the round searched for likely. Which target a
run uses is chosen by the audit's AUC on train-side rounds (docs/mining.md).

The pursued sub-question is the leaf of the round's question (``parent_id`` = the trajectory's question id) whose
question shares the most distinctive words with the query: each shared word counts 1/df, df the number of that
question's leaves holding it, so "population" shared with all five "What is the population of X?" leaves
weighs little and "Macau" decides. Words are compared after the QA normaliser (lower case, no punctuation or
articles) without a few question words. A round whose query shares no word with any leaf keeps the final answer
(counted as ``without_sub_question``). A list or dict sub-answer counts each of its parts as a gold too
(``answer_parts`` of `data prepare`'s rows).
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from agentic_retriever.base.jsonl import DataFormatError, iter_jsonl
from agentic_retriever.base.qa_metrics import golden_strings, normalize_answer, part_answers
from .rounds import Round

__all__ = ["SubQuestion", "pursued_sub_question", "read_sub_questions", "target_sub_questions"]

_QUESTION_WORDS = frozenset("what which who whom whose when where why how is are was were do does did of in on at to "
                            "for by from with and or as be it its this that there their".split())


@dataclass(frozen=True)
class SubQuestion:
    """A leaf sub-question of a multi-hop question and its gold answers (the parts of a list answer included)."""

    id: str
    question: str
    golden_answers: tuple[str, ...]


def _content_words(text: str) -> set[str]:
    return set(normalize_answer(text).split()) - _QUESTION_WORDS


def read_sub_questions(path: str | os.PathLike) -> dict[str, list[SubQuestion]]:
    """Leaf QA rows (``parent_id``, ``golden_answers``, optional ``answer_parts``) grouped by their multi-hop
    question's id, in file order; a row without ``parent_id`` raises DataFormatError naming file, line and field."""
    by_parent: dict[str, list[SubQuestion]] = defaultdict(list)
    for line, row in iter_jsonl(path):
        for name in ("id", "question", "golden_answers", "parent_id"):
            if name not in row:
                raise DataFormatError(path, line, "missing (needed for gac_target sub_question)", field=name)
        golds = tuple(dict.fromkeys([*golden_strings(row["golden_answers"]), *part_answers(row.get("answer_parts"))]))
        by_parent[str(row["parent_id"])].append(SubQuestion(str(row["id"]), row["question"], golds))
    return dict(by_parent)


def pursued_sub_question(query: str, leaves: Sequence[SubQuestion]) -> SubQuestion | None:
    """The leaf whose question shares the most distinctive words with `query` (module docstring); None when it
    shares none; ties go to the first leaf."""
    words = [_content_words(leaf.question) for leaf in leaves]
    df: dict[str, int] = defaultdict(int)
    for leaf_words in words:
        for word in leaf_words:
            df[word] += 1
    wanted = _content_words(query)
    scores = [sum(1.0 / df[w] for w in leaf_words & wanted) for leaf_words in words]
    best = max(range(len(leaves)), key=lambda i: (scores[i], -i), default=None)
    return leaves[best] if best is not None and scores[best] > 0 else None


def target_sub_questions(rounds: Sequence[Round], sub_questions: dict[str, list[SubQuestion]]
                         ) -> tuple[list[Round], dict[str, int]]:
    """The rounds with the gold answers of the sub-question each pursues (the others unchanged), and counts:
    ``sub_question`` (retargeted), ``without_sub_question`` (no leaf shares a word with the query, or the question
    has no leaves)."""
    out, counts = [], {"sub_question": 0, "without_sub_question": 0}
    for rnd in rounds:
        leaf = pursued_sub_question(rnd.query, sub_questions.get(rnd.question_id, ()))
        if leaf is None or not leaf.golden_answers:
            counts["without_sub_question"] += 1
            out.append(rnd)
        else:
            counts["sub_question"] += 1
            out.append(dataclasses.replace(rnd, golden_answers=leaf.golden_answers))
    return out, counts
