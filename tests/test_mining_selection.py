"""Positive and negative selection (section 4.1.1) on hand-made candidate tables, with every switch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentic_retriever.mining.selection import Candidate, SelectionConfig, select_passages


def table(*rows: tuple[float, float], n: int = 20, filler: tuple[float, float] = (0, 10)) -> list[Candidate]:
    """Candidates p0.. in retriever order: the given (gac, lr) first, then `filler` up to n."""
    rows = list(rows) + [filler] * (n - len(rows))
    return [Candidate(f"p{i}", lr=lr, gac=gac) for i, (gac, lr) in enumerate(rows)]


def ids(candidates) -> list[str]:
    return [c.passage_id for c in candidates]


def test_ranks_by_gac_then_lr_and_takes_the_best_as_positive():
    cands = table((0, 95), (1, 70), (1, 85), (0, 99))
    result = select_passages(cands, SelectionConfig(), "q#1")
    assert result.drop_reason is None
    assert ids(result.ranked[:4]) == ["p2", "p1", "p3", "p0"]  # GAC first: a correct answer beats any LR
    [example] = result.examples
    assert example.positive.passage_id == "p2"
    assert len(example.negatives) == 15 and "p2" not in ids(example.negatives)
    assert len(set(ids(example.negatives))) == 15


def test_equal_keys_keep_the_retriever_order():
    result = select_passages(table((0, 50), (0, 50), (0, 50)), SelectionConfig(use_gac=False, lr_threshold=0), "k")
    assert ids(result.ranked[:3]) == ["p0", "p1", "p2"]


@pytest.mark.parametrize("rows, reason", [
    (((0, 100),), "best_gac_below"),      # nothing leads to the right answer
    (((1, 59), (0, 100)), "best_lr_below"),  # the correct candidate is not relevant enough
])
def test_the_round_is_dropped_unless_the_best_has_gac_1_and_lr_60(rows, reason):
    result = select_passages(table(*rows), SelectionConfig(), "k")
    assert result.examples == () and result.drop_reason == reason


def test_lr_exactly_at_the_threshold_is_enough():
    assert select_passages(table((1, 60)), SelectionConfig(), "k").drop_reason is None


def test_ties_with_the_best_are_positives_at_most_three_one_row_each():
    cands = table((1, 80), (1, 90), (1, 90), (1, 90), (1, 90))
    result = select_passages(cands, SelectionConfig(), "k")
    assert [e.positive.passage_id for e in result.examples] == ["p1", "p2", "p3"]
    for example in result.examples:
        assert example.positive.passage_id not in ids(example.negatives)
        assert not {"p1", "p2", "p3"} & set(ids(example.negatives))
    # the fourth tie is in "the rest" (paper, release) unless ties are kept out of the negatives:
    # 17 non-positives, 17 negatives asked -> every one of them is drawn
    loose = select_passages(cands, SelectionConfig(num_negatives=17), "k")
    assert all("p4" in ids(e.negatives) for e in loose.examples)
    strict = select_passages(cands, SelectionConfig(num_negatives=16, exclude_ties_from_negatives=True), "k")
    assert strict.drop_reason is None and all("p4" not in ids(e.negatives) for e in strict.examples)


def test_first_switch_takes_only_the_best():
    result = select_passages(table((1, 90), (1, 90)), SelectionConfig(positives="first"), "k")
    assert [e.positive.passage_id for e in result.examples] == ["p0"]


def test_fewer_than_15_negatives_drop_the_round():
    assert select_passages(table((1, 90), n=15), SelectionConfig(), "k").drop_reason == "too_few_negatives"
    assert select_passages(table((1, 90), n=16), SelectionConfig(), "k").drop_reason is None
    # ties kept out of the negatives can leave too few
    cands = table(*[(1, 90)] * 6, n=20)
    assert select_passages(cands, SelectionConfig(), "k").drop_reason is None
    assert select_passages(cands, SelectionConfig(exclude_ties_from_negatives=True), "k").drop_reason \
        == "too_few_negatives"


def test_negative_sampling_is_seeded_by_round_and_positive():
    cands = table((1, 90), (1, 90), n=20)
    first = select_passages(cands, SelectionConfig(), "q1#1")
    assert first == select_passages(cands, SelectionConfig(), "q1#1")
    other_round = select_passages(cands, SelectionConfig(), "q1#2")
    other_seed = select_passages(cands, SelectionConfig(seed=1), "q1#1")
    negatives = lambda r: [ids(e.negatives) for e in r.examples]
    assert negatives(first) != negatives(other_round) and negatives(first) != negatives(other_seed)
    assert negatives(first)[0] != negatives(first)[1]  # each row draws its own negatives


def test_without_gac_ranks_and_thresholds_by_lr_only():
    cands = table((0, 95), (1, 70))
    config = SelectionConfig(use_gac=False)
    result = select_passages(cands, config, "k")
    assert result.examples[0].positive.passage_id == "p0"  # GAC ignored
    assert select_passages(table((1, 59)), config, "k").drop_reason == "best_lr_below"
    no_gac = [replace(c, gac=None) for c in cands]  # GAC need not exist at all
    assert select_passages(no_gac, config, "k").examples[0].positive.passage_id == "p0"


def test_without_lr_ranks_by_gac_only_with_no_lr_tie_break():
    cands = table((0, 99), (1, 20), (1, 95), (1, 90), (1, 80))
    result = select_passages(cands, SelectionConfig(use_lr=False), "k")
    # GAC=1 candidates all tie: the first three in retriever order, LR ignored (and no LR threshold)
    assert [e.positive.passage_id for e in result.examples] == ["p1", "p2", "p3"]
    no_lr = [replace(c, lr=None) for c in cands]
    assert select_passages(no_lr, SelectionConfig(use_lr=False, positives="first"), "k").examples[0].positive \
        .passage_id == "p1"
    assert select_passages(table((0, 99)), SelectionConfig(use_lr=False), "k").drop_reason == "best_gac_below"


def test_soft_gac_uses_the_threshold():
    cands = [Candidate("a", lr=90, gac=0.7), Candidate("b", lr=95, gac=0.4)] + table(n=18)
    assert select_passages(cands, SelectionConfig(gac_threshold=0.5), "k").examples[0].positive.passage_id == "a"
    assert select_passages(cands, SelectionConfig(gac_threshold=0.8), "k").drop_reason == "best_gac_below"


def test_missing_scores_and_bad_settings_are_errors():
    with pytest.raises(ValueError, match="no LR"):
        select_passages([Candidate("a", lr=None, gac=1)], SelectionConfig(), "k")
    with pytest.raises(ValueError, match="GAC, LR or both"):
        select_passages(table(), SelectionConfig(use_gac=False, use_lr=False), "k")
    with pytest.raises(ValueError):
        select_passages(table(), SelectionConfig(positives="all"), "k")
    assert select_passages([], SelectionConfig(), "k").drop_reason == "no_candidates"
