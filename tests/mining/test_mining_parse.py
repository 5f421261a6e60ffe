"""Parsing the scorer's outputs: sub-answers (Figure 8) and listwise scores (Figures 6, 7)."""

from __future__ import annotations

import pytest

from agentic_retriever.mining.parse import is_not_sure, parse_scores, parse_sub_answers


@pytest.mark.parametrize("text, expected", [
    ("68 42 97", [68, 42, 97]),                                    # the format asked for, as [R] reads it
    ("  68 42 97\n", [68, 42, 97]),
    ("Scores: 68, 42, 97.", [68, 42, 97]),                         # words and commas around the numbers
    ("Here are the utility scores:\n68\n42\n97", [68, 42, 97]),
    ("[1] 68 [2] 42 [3] 97", [68, 42, 97]),                        # passage labels are not scores
    ("Passage [1]: 68\nPassage [2]: 42\nPassage [3]: 97", [68, 42, 97]),
    ("Passage 1: 68, Passage 2: 42, Passage 3: 97", [68, 42, 97]),
    ("1. 68\n2. 42\n3. 97", [68, 42, 97]),                         # an enumeration counting 1, 2, 3
    ("68. 42. 97.", [68, 42, 97]),                                 # not an enumeration: 68 stays
    ("68/100 42/100 97/100", [68, 42, 97]),                        # the scale is not a score
    ("150 -5 100", [100, 0, 100]),                                 # out of range: clamped, as [R]
    ("72.5 10.4 0", [73, 10, 0]),                                  # decimals rounded half up
    ("68-42-97", [68, 42, 97]),
])
def test_scores_are_read_from_common_output_shapes(text, expected):
    parsed = parse_scores(text, 3)
    assert parsed.ok and parsed.scores == expected and parsed.status == "ok"


@pytest.mark.parametrize("text", ["68 42 97 12", "1: 68 2: 42 3: 97"])
def test_more_numbers_than_passages_fail_the_window_so_it_is_asked_again(text):
    parsed = parse_scores(text, 3)  # taking the first three would read the second as [1, 68, 2]
    assert not parsed.ok and parsed.scores is None and parsed.status == "extra_numbers" and parsed.found > 3


@pytest.mark.parametrize("text", ["68 42", "", "I cannot judge these passages.", "high medium low", "v2 3rd 68a"])
def test_too_few_numbers_fail_the_window(text):
    parsed = parse_scores(text, 3)
    assert not parsed.ok and parsed.scores is None and parsed.status == "too_few"


def test_a_single_passage_window_reads_one_number():
    assert parse_scores("85", 1).scores == [85]
    assert parse_scores("1: 85", 1).scores == [85]
    with pytest.raises(ValueError):
        parse_scores("85", 0)


def test_sub_answers_in_order_with_not_sure_as_none():
    parsed = parse_sub_answers("<sub-answer> Urban Cowboy </sub-answer> <sub-answer> Not Sure </sub-answer>", 2)
    assert parsed.answers == ["Urban Cowboy", None] and parsed.status == "ok" and parsed.given == 1


@pytest.mark.parametrize("text", ["Not Sure", "not sure", '"Not Sure."', "NOT SURE!", "  not   sure "])
def test_not_sure_in_any_spelling(text):
    assert is_not_sure(text)
    assert parse_sub_answers(f"<sub-answer>{text}</sub-answer>", 1).answers == [None]


def test_an_answer_containing_not_sure_words_is_kept():
    assert not is_not_sure("Not Sure Thing (racehorse)")
    assert parse_sub_answers("<sub-answer> Not Sure Thing </sub-answer>", 1).answers == ["Not Sure Thing"]


def test_empty_tags_and_multiline_answers():
    parsed = parse_sub_answers("<sub-answer></sub-answer>\n<sub-answer> New\nYork </sub-answer>", 2)
    assert parsed.answers == [None, "New\nYork"]


@pytest.mark.parametrize("text, found", [
    ("<sub-answer> Paris </sub-answer>", 1),                                                       # too few
    ("<sub-answer> a </sub-answer> <sub-answer> b </sub-answer> <sub-answer> c </sub-answer>", 3),  # too many
    ("<sub-answer> a </sub-answer> <sub-answer> b", 1),                                            # unclosed tag
    ("Paris, then London", 0),
])
def test_a_count_mismatch_gives_no_round_a_sub_answer_never_a_shifted_one(text, found):
    parsed = parse_sub_answers(text, 2)
    assert parsed.answers == [None, None] and parsed.status == "count_mismatch" and parsed.found == found
