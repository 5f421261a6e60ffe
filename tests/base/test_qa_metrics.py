import pytest

from agentic_retriever.base.qa_metrics import (
    contains_match, exact_match, f1_score, golden_strings, normalize_answer, qa_scores, span_match,
)


@pytest.mark.parametrize("text, normalized", [
    ("The  Eiffel Tower!", "eiffel tower"),
    ("A man, a plan, an apple.", "man plan apple"),
    ("  Théâtre   du Soleil ", "théâtre du soleil"),
    ("there", "there"),  # articles only as whole words
    ("U.S.A.", "usa"),
    ("the", ""),
])
def test_normalize_answer_lowercases_strips_punctuation_articles_and_spaces(text, normalized):
    assert normalize_answer(text) == normalized


def test_golden_answers_flatten_nested_lists_and_numbers_become_text():
    assert golden_strings(["Paris", ["paris france", 1889], 4.0, 2.5, True]) == ["Paris", "paris france", "1889", "4",
                                                                                  "2.5", "yes"]
    assert golden_strings("one") == ["one"]
    with pytest.raises(TypeError, match="dict"):
        golden_strings([{"a": 1}])


def test_exact_match_is_the_max_over_golden_answers_after_normalisation():
    assert exact_match("The Eiffel Tower!", ["tour eiffel", "eiffel tower"]) == 1.0
    assert exact_match("Eiffel Tower in Paris", ["eiffel tower"]) == 0.0
    assert exact_match("1889", [1889]) == 1.0
    assert exact_match(None, ["x"]) == 0.0


def test_f1_is_token_overlap_max_over_golds():
    assert f1_score("Eiffel Tower in Paris", ["eiffel tower"]) == pytest.approx(2 / 3)  # P 2/4, R 2/2
    assert f1_score("Eiffel", ["eiffel tower", "eiffel"]) == 1.0
    assert f1_score("London", ["Paris"]) == 0.0
    assert f1_score("red red", ["red"]) == pytest.approx(2 * 0.5 * 1 / 1.5)  # repeated tokens count once
    assert f1_score("the", ["a"]) == 1.0  # both normalise to nothing
    assert f1_score(None, ["Paris"]) == 0.0


def test_contains_match_needs_word_boundaries():
    assert contains_match("It was built in 1889 by Eiffel.", [1889]) == 1.0
    assert contains_match("1234", ["4"]) == 0.0
    assert contains_match("4 times", ["4"]) == 1.0
    assert contains_match("the new york times", ["New York"]) == 1.0
    assert contains_match("newyork", ["new york"]) == 0.0
    assert contains_match("anything", ["The"]) == 0.0  # an empty gold matches nothing
    assert contains_match(None, ["x"]) == 0.0


def test_span_match_checks_token_spans_of_the_normalised_strings():
    assert span_match("He was born in New York City", ["new york"]) == 1.0
    assert span_match("He was born in New Yorkshire", ["new york"]) == 0.0
    assert span_match("o’neill wrote it", ["neill"]) == 1.0  # a non-ASCII apostrophe is its own token
    assert contains_match("o’neill wrote it", ["neill"]) == 0.0
    assert span_match("yes", ["the"]) == 0.0
    assert span_match(None, ["x"]) == 0.0


def test_qa_scores_bundles_em_f1_and_contains():
    scores = qa_scores("Paris, France", ["paris"])
    assert (scores.em, scores.contains_em) == (0.0, 1.0)
    assert scores.f1 == pytest.approx(2 / 3)
