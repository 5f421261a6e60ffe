"""QA metrics: exact match, token F1, contains-EM and the s3 span check, each the max over the golden answers.

All four compare SQuAD-normalised strings (`normalize_answer`: lowercase, drop ASCII punctuation, drop the
articles a/an/the, collapse whitespace), the normalisation of Search-R1's ``qa_em.py``
in the authors' release (Search-R1, arXiv 2503.09516):

* `exact_match`    normalised prediction == normalised gold (Search-R1, Agentic-R);
* `f1_score`       SQuAD token F1 between the normalised strings;
* `contains_match` QAgent's EM_contains: the normalised gold occurs in the normalised prediction on word
                   boundaries (gold "4" matches "4 times", not "1234");
* `span_match`     s3's span check (GenAcc; s3, arXiv 2505.14146): the tokens of the normalised gold are a
                   contiguous run of the tokens of the normalised prediction, tokenised like pyserini's
                   ``SimpleTokenizer`` (runs of word characters, and every other non-space character as its own
                   token).

Golden answers may be one string, a number, or (nested) lists of them (`golden_strings`). A missing
prediction (``None``: the agent gave no answer) scores 0 everywhere. A gold that normalises to the empty
string (e.g. "The") never matches in `contains_match`/`span_match`: the empty string is in every text.

    exact_match("The Eiffel Tower!", ["eiffel tower", "tour eiffel"])  # 1.0
    contains_match("built in 1889 by Eiffel", [1889])                   # 1.0
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass

__all__ = ["QAScores", "contains_match", "exact_match", "f1_score", "golden_strings", "normalize_answer",
           "qa_scores", "span_match"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
_SIMPLE_TOKENS = re.compile(r"\w+|[^\w\s]")

Golden = str | int | float | list | tuple


def normalize_answer(text: str) -> str:
    """SQuAD normalisation, in Search-R1's order: lowercase, remove punctuation, remove articles, fix spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def part_answers(answer_parts) -> list[str]:
    """The answer of each part of a list or dict answer (`data prepare`'s ``answer_parts``): a list's item, a dict
    entry's value (the last of a part's strings; a dict entry's key names the part, it does not answer it)."""
    return [str(part[-1]) for part in answer_parts or () if part]


def golden_strings(golden: Golden) -> list[str]:
    """Flatten golden answers to strings: lists (nested) are alternatives, numbers become their text.

    Booleans become "yes"/"no" and integral floats lose their ".0" (as `data.prepare.answer_strings`).
    """
    if isinstance(golden, str):
        return [golden]
    if isinstance(golden, bool):
        return ["yes" if golden else "no"]
    if isinstance(golden, float) and golden.is_integer():
        return [str(int(golden))]
    if isinstance(golden, (int, float)):
        return [str(golden)]
    if isinstance(golden, (list, tuple)):
        return [s for item in golden for s in golden_strings(item)]
    raise TypeError(f"golden answers must be strings, numbers or lists of them, got {type(golden).__name__}")


def exact_match(prediction: str | None, golden: Golden) -> float:
    """1.0 if the normalised prediction equals a normalised golden answer, else 0.0."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golden_strings(golden)))


def f1_score(prediction: str | None, golden: Golden) -> float:
    """Max over golden answers of the SQuAD token F1 (when either side has no tokens: 1 if both have none)."""
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    return max((_token_f1(pred_tokens, normalize_answer(g).split()) for g in golden_strings(golden)), default=0.0)


def _token_f1(pred: list[str], gold: list[str]) -> float:
    if not pred or not gold:
        return float(pred == gold)
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


#: Answers that say yes or no: no passage "contains" them in any useful sense.
YES_NO = frozenset({"yes", "no", "true", "false"})


def is_yes_no(golden: Golden) -> bool:
    """Whether every golden answer is yes, no, true or false after SQuAD normalisation."""
    normalised = {normalize_answer(answer) for answer in golden_strings(golden)}
    return bool(normalised) and normalised <= YES_NO


def contains_match(prediction: str | None, golden: Golden) -> float:
    """QAgent's EM_contains: a normalised gold occurs in the normalised prediction between word boundaries."""
    if prediction is None:
        return 0.0
    padded = f" {normalize_answer(prediction)} "
    return float(any(gold and f" {gold} " in padded for gold in map(normalize_answer, golden_strings(golden))))


def span_match(prediction: str | None, golden: Golden) -> float:
    """s3's span check: the normalised gold's tokens form a contiguous span of the normalised prediction's."""
    if prediction is None:
        return 0.0
    pred = _SIMPLE_TOKENS.findall(normalize_answer(prediction))
    for gold in golden_strings(golden):
        tokens = _SIMPLE_TOKENS.findall(normalize_answer(gold))
        if tokens and any(pred[i:i + len(tokens)] == tokens for i in range(len(pred) - len(tokens) + 1)):
            return 1.0
    return 0.0


@dataclass(frozen=True)
class QAScores:
    """The answer metrics stored with every trajectory."""

    em: float
    f1: float
    contains_em: float


def qa_scores(prediction: str | None, golden: Golden) -> QAScores:
    return QAScores(exact_match(prediction, golden), f1_score(prediction, golden), contains_match(prediction, golden))
