"""The papers' own text, next to the checkout (``../shared/papers``), for tests that pin prompts byte for byte;
those tests skip where the text is absent and a hash test pins the same prompt without it."""

from __future__ import annotations

from pathlib import Path

PAPERS = Path(__file__).resolve().parents[3] / "shared" / "papers"
S3_PAPER = PAPERS / "s3.txt"


def figure_text(paper: str, figure: int, box_title: str) -> str:
    """The prompt box of a figure: the line before ``Figure N:``, without the box's title."""
    end = paper.index(f"\nFigure {figure}:")
    line = paper[paper.rindex("\n", 0, end) + 1:end]
    assert line.startswith(box_title + " ")
    return line[len(box_title) + 1:]
