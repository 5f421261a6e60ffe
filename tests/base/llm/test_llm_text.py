"""Where a stop string ends a generation (shared by every backend)."""

from agentic_retriever.base.llm.text import find_stop


def test_the_stop_that_ends_first_wins_and_ties_go_to_the_longest():
    text = "think <search>q</search> more </answer>"
    assert find_stop(text, ["</answer>", "</search>"]) == (text.index("</search>") + 9, "</search>")
    assert find_stop(text, ["search>", "</search>"]) == (text.index("<search>") + 8, "search>")
    assert find_stop("a</search>", ["search>", "</search>"]) == (10, "</search>")
    assert find_stop(text, ["</tool>"]) is None and find_stop(text, []) is None
