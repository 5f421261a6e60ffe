"""The papers' own text, next to the checkout (``../shared/papers``), for tests that pin prompts byte for byte;
those tests skip where the text is absent and a hash test pins the same prompt without it."""

from __future__ import annotations

from pathlib import Path

PAPERS = Path(__file__).resolve().parents[3] / "shared" / "papers"
S3_PAPER = PAPERS / "s3.txt"
QAGENT_PAPER = PAPERS / "qagent.txt"
WHEN_TO_SEARCH_PAPER = PAPERS / "when_to_search_multistage_reward.txt"


def figure_text(paper: str, figure: int, box_title: str) -> str:
    """The prompt box of a figure: the line before ``Figure N:``, without the box's title."""
    end = paper.index(f"\nFigure {figure}:")
    line = paper[paper.rindex("\n", 0, end) + 1:end]
    assert line.startswith(box_title + " ")
    return line[len(box_title) + 1:]


def table_text(paper: str, table: int, first_words: str) -> str:
    """The prompt of a table: from `first_words` (which must occur once) to the line before ``Table N:``."""
    assert paper.count(first_words) == 1
    start = paper.index(first_words)
    return paper[start:paper.index(f"\nTable {table}:", start)]


def span_text(paper: str, first_words: str, last_words: str) -> str:
    """The text from `first_words` to the end of `last_words` (each must occur once), for a prompt box whose text is
    followed by no caption of its own."""
    assert paper.count(first_words) == 1 and paper.count(last_words) == 1
    start = paper.index(first_words)
    return paper[start:paper.index(last_words, start) + len(last_words)]
