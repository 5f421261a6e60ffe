"""Positive and negative selection (section 4.1.1) on hand-made candidate tables, with every switch."""

from __future__ import annotations

import pytest

from agentic_retriever.mining.selection import Candidate, SelectionConfig, select_passages


def table(*rows: tuple, n: int = 20, filler: tuple = (0, 10)) -> list[Candidate]:
    """Candidates p0.. in retriever order: the given (gac, lr[, contains_answer]) first, then `filler` up to n."""
    rows = list(rows) + [filler] * (n - len(rows))
    return [Candidate(f"p{i}", lr=row[1], gac=row[0], rank=i + 1, contains_answer=row[2] if len(row) > 2 else False)
            for i, row in enumerate(rows)]


def ids(candidates) -> list[str]:
    return [c.passage_id for c in candidates]


def select(cands, **settings):
    return select_passages(cands, SelectionConfig(**{"gac_threshold": 1.0, **settings}), "q#1")


def test_passing_candidates_are_ranked_by_lr_and_the_best_is_the_positive():
    result = select(table((0, 95), (1, 70), (1, 85), (0, 99)))
    assert result.drop_reason is None
    [example] = result.examples
    assert example.positive.passage_id == "p2"  # passes GAC and has the highest LR among those that pass
    assert len(example.negatives) == 15 == len(set(ids(example.negatives)))
    assert "p2" not in ids(example.negatives)


def test_candidates_that_pass_gac_are_never_negatives():
    result = select(table((1, 70), (1, 85), (1, 90), (1, 65), (1, 61), n=21))
    [example] = result.examples
    assert example.positive.passage_id == "p2"
    assert not {"p0", "p1", "p3", "p4"} & set(ids(example.negatives))
    assert {result.roles[p] for p in ("p0", "p1", "p3", "p4")} == {"excluded"}


def test_graded_gac_is_thresholded_first_then_lr_decides():
    # a high answer likelihood alone does not make the positive: among passing candidates LR decides
    cands = table((0.99, 61), (0.6, 90), (0.4, 100), filler=(0.1, 10))
    result = select(cands, gac_threshold=0.5)
    assert result.examples[0].positive.passage_id == "p1"
    assert result.roles["p0"] == "excluded"  # passed GAC, not chosen: not a negative either
    assert select(cands, gac_threshold=0.995).drop_reason == "no_gac_pass"


def test_equal_lr_among_passing_candidates_keeps_the_retriever_order():
    result = select(table((0, 50), (0, 50), (0, 50), n=21), use_gac=False, lr_threshold=40, positives="first")
    assert result.examples[0].positive.passage_id == "p0"


@pytest.mark.parametrize("rows, reason", [
    (((0, 100),), "no_gac_pass"),          # nothing leads to the right answer
    (((1, 59), (0, 100)), "no_lr_pass"),  # the correct candidate is not relevant enough
])
def test_the_round_is_dropped_without_a_candidate_passing_both(rows, reason):
    result = select(table(*rows))
    assert result.examples == () and result.drop_reason == reason


def test_the_lr_threshold_is_checked_on_every_passing_candidate_not_only_the_first():
    # the old rule sorted by GAC value and checked the thresholds on the top candidate only
    cands = table((0.9, 20), (0.6, 70), filler=(0.1, 10))
    result = select(cands, gac_threshold=0.5)
    assert result.examples[0].positive.passage_id == "p1"


def test_lr_exactly_at_the_threshold_is_enough():
    assert select(table((1, 60))).examples[0].positive.passage_id == "p0"


def test_ties_with_the_best_are_positives_at_most_three_one_row_each():
    result = select(table((1, 80), (1, 80), (0, 80), (1, 80), (1, 80), (1, 70), n=25))
    assert ids(e.positive for e in result.examples) == ["p0", "p1", "p3"]
    for example in result.examples:  # no positive of the round, and no passing candidate, is a negative
        assert not {"p0", "p1", "p3", "p4", "p5"} & set(ids(example.negatives))


def test_first_switch_takes_only_the_best():
    result = select(table((1, 80), (1, 80), n=21), positives="first")
    assert ids(e.positive for e in result.examples) == ["p0"]


def test_false_negative_filter_keeps_answer_containing_candidates_out_of_the_negatives():
    cands = table((1, 80), (0, 10, True), (0, 10, True), n=22)
    result = select(cands)
    assert not {"p1", "p2"} & set(ids(result.examples[0].negatives))
    assert result.roles["p1"] == result.roles["p2"] == "excluded"
    unfiltered = select(cands, false_negative_filter=False, num_negatives=21)
    assert {"p1", "p2"} <= set(ids(unfiltered.examples[0].negatives))


def test_require_answer_in_positive():
    cands = table((1, 90), (1, 70, True), n=21)
    assert select(cands).examples[0].positive.passage_id == "p0"
    assert select(cands, require_answer_in_positive=True).examples[0].positive.passage_id == "p1"
    assert select(table((1, 90)), require_answer_in_positive=True).drop_reason == "no_answer_in_passing"


def test_fewer_than_15_negatives_drop_the_round():
    assert select(table((1, 80), n=15)).drop_reason == "too_few_negatives"
    assert select(table((1, 80), n=16)).drop_reason is None
    # excluded candidates do not count towards the negatives
    assert select(table((1, 80), (1, 70), n=16)).drop_reason == "too_few_negatives"


def test_negative_sampling_is_seeded_by_round_and_positive():
    cands = table((1, 80), n=20)
    config = SelectionConfig(gac_threshold=1.0)
    first = select_passages(cands, config, "q#1").examples[0].negatives
    assert first == select_passages(list(cands), config, "q#1").examples[0].negatives
    assert first != select_passages(cands, config, "q#2").examples[0].negatives


def test_without_gac_lr_alone_thresholds_and_ranks():
    cands = table((0, 70), (0, 90), (0, 50))
    result = select(cands, use_gac=False)
    assert result.examples[0].positive.passage_id == "p1"
    assert result.roles["p0"] == "excluded"  # passes the LR threshold: not a negative under "w/o GAC"
    assert select(table((0, 50)), use_gac=False).drop_reason == "lr_below"


def test_without_lr_passing_candidates_are_ranked_by_gac_value_then_retriever_rank():
    cands = table((0.6, 10), (0.8, 5), (0.8, 99), filler=(0.1, 10))
    result = select(cands, use_lr=False, gac_threshold=0.5, positives="first")
    assert result.examples[0].positive.passage_id == "p1"  # p1 and p2 tie on GAC; p1 ranks higher
    ties = select(cands, use_lr=False, gac_threshold=0.5)
    assert ids(e.positive for e in ties.examples) == ["p1", "p2"]


def test_missing_scores_and_bad_settings_are_errors():
    with pytest.raises(ValueError, match="no GAC"):
        select([Candidate("p", lr=80)] * 20)
    with pytest.raises(ValueError, match="no LR"):
        select([Candidate("p", gac=1)] * 20)
    with pytest.raises(ValueError, match="GAC, LR or both"):
        select(table((1, 80)), use_gac=False, use_lr=False)
    with pytest.raises(ValueError, match="gac_threshold"):
        select_passages(table((1, 80)), SelectionConfig(), "k")
    with pytest.raises(ValueError, match="positives"):
        select(table((1, 80)), positives="all")
    assert select([]).drop_reason == "no_candidates"


def test_a_candidate_the_judge_finds_relevant_is_not_a_negative_even_when_it_fails_gac():
    # the evidence page (p1: LR 95) does not raise the agent's answer likelihood; it must not be trained away
    result = select(table((1, 70), (0, 95), n=21))
    assert result.examples[0].positive.passage_id == "p0"
    assert result.roles["p1"] == "excluded" and "p1" not in ids(result.examples[0].negatives)


def release(cands, key="q#1", **settings):
    return select_passages(cands, SelectionConfig(**{"gac_threshold": 1.0, "negatives": "release",
                                                     "false_negative_filter": False, **settings}), key)


def test_release_negatives_are_every_candidate_not_tied_with_the_best_one_sample_for_all_rows():
    """The authors' step4_construct_retriever_data.py on a round built by hand: four candidates tie at (GAC 1, LR
    90); the first three are rows, the fourth neither; the pool is the other 15, a GAC = 1 one and an answer-bearing
    one included, all sampled, shared by the three rows, in ranking order (GAC, LR, retriever rank)."""
    cands = table((0, 10), (1, 90), (1, 90), (0, 95, True), (1, 90), (1, 70), (1, 90), n=19)
    result = release(cands)
    assert result.drop_reason is None
    assert [e.positive.passage_id for e in result.examples] == ["p1", "p2", "p4"]
    expected = ["p5", "p3", "p0"] + [f"p{i}" for i in range(7, 19)]  # GAC 1 LR 70; GAC 0 LR 95; then LR 10 by rank
    assert all(ids(e.negatives) == expected for e in result.examples)
    assert result.roles["p6"] == "excluded" and result.roles["p5"] == result.roles["p3"] == "negative"


def test_release_drops_a_round_with_fewer_than_15_other_candidates_and_samples_once_per_round():
    assert release(table((1, 90), (1, 90), n=16)).drop_reason == "too_few_negatives"  # 14 not tied
    cands = table((1, 90), (1, 80), n=30)  # p1 passes GAC and LR: useful, never a filtered negative
    runs = [release(cands, key=f"q#{i}") for i in range(20)]
    assert ids(runs[0].examples[0].negatives) == ids(release(cands, key="q#0").examples[0].negatives)  # seeded
    assert {len(set(ids(run.examples[0].negatives))) for run in runs} == {15}
    assert len({tuple(ids(run.examples[0].negatives)) for run in runs}) > 1  # the round's key seeds it
    assert any("p1" in ids(run.examples[0].negatives) for run in runs)
    assert "p1" not in ids(select(cands).examples[0].negatives)


def test_release_negatives_refuse_the_false_negative_filter_by_name():
    with pytest.raises(ValueError, match="set false_negative_filter false"):
        release(table((1, 90)), false_negative_filter=True)
