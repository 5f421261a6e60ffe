"""The papers' own text, next to the checkout (``../shared/papers``), for tests that pin prompts byte for byte;
those tests skip where the text is absent and a hash test pins the same prompt without it."""

from __future__ import annotations

from pathlib import Path

PAPERS = Path(__file__).resolve().parents[3] / "shared" / "papers"
S3_PAPER = PAPERS / "s3.txt"
QAGENT_PAPER = PAPERS / "qagent.txt"


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
