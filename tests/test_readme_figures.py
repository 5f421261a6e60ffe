"""Every figure README shows comes with the RESULTS section that holds its command, and every link into RESULTS
lands on a heading there (README and docs/)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_LINK = re.compile(r"\]\((?:\.\./)?benchmarks/RESULTS\.md#([^)]+)\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation other than '-' and '_' dropped, each
    space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def results_anchors() -> set[str]:
    anchors, seen = set(), Counter()
    for line in (ROOT / "benchmarks" / "RESULTS.md").read_text().splitlines():
        if line.startswith("#"):
            anchor = github_anchor(line.lstrip("#"))
            anchors.add(anchor if not seen[anchor] else f"{anchor}-{seen[anchor]}")
            seen[anchor] += 1
    return anchors


def figure_rows(readme: str) -> list[str]:
    """The body rows of README's tables that hold numbers (a header row is the first of its table)."""
    rows = [line for line in readme.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")]
    headers = {line for line in rows if rows.index(line) == 0 or not re.search(r"\d", line)}
    return [line for line in rows if line not in headers and re.search(r"\d\.\d|\d+x|\d+ GiB|\d s\b", line)]


def test_every_figure_row_of_readmes_results_links_to_the_results_section_holding_it():
    readme = (ROOT / "README.md").read_text()
    rows = figure_rows(readme)
    assert len(rows) >= 6, rows  # the machine classes' table and the demo's
    anchors = results_anchors()
    missing = [row[:80] for row in rows if not any(a in anchors for a in RESULTS_LINK.findall(row))]
    assert not missing, f"README figures without a link to their RESULTS section: {missing}"


def test_every_link_into_results_lands_on_a_heading():
    anchors = results_anchors()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for anchor in RESULTS_LINK.findall(path.read_text()):
            assert anchor in anchors, f"{path.name} links to RESULTS.md#{anchor}, which no heading there makes"


def test_the_anchor_rule_is_githubs():
    assert github_anchor("The co-training loop, K = 2, on the default stack (`loop_quickstart.yaml`)") == \
        "the-co-training-loop-k--2-on-the-default-stack-loop_quickstartyaml"
    assert github_anchor("Retrieval service: each server in its own process (the benchmark's default)") == \
        "retrieval-service-each-server-in-its-own-process-the-benchmarks-default"
