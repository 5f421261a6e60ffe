import numpy as np
import pytest

from agentic_retriever.eval.bootstrap import compare_reports, paired_bootstrap


def test_identical_systems_have_zero_difference_and_a_ci_containing_zero():
    values = np.random.default_rng(1).random(50)
    result = paired_bootstrap(values, values)
    assert result["diff"] == 0.0 and result["ci_low"] == 0.0 and result["ci_high"] == 0.0
    assert result["p_value"] == 1.0 and result["n"] == 50


def test_a_constant_shift_gives_that_difference_with_a_zero_width_ci():
    a = np.random.default_rng(2).random(40)
    result = paired_bootstrap(a, a + 0.25, num_samples=2000)
    assert result["diff"] == pytest.approx(0.25)
    assert result["ci_low"] == pytest.approx(0.25) and result["ci_high"] == pytest.approx(0.25)
    assert result["ci_high"] - result["ci_low"] == pytest.approx(0.0, abs=1e-12)
    assert result["p_value"] == pytest.approx(2 / 2001)  # add-one smoothed: never exactly 0


def test_the_default_interval_is_95_percent():
    """Differences of +1 and -1 in equal numbers (n = 400): the mean's bootstrap distribution is close to normal
    with sd 1/sqrt(400) = 0.05, so the 95% interval is about +-1.96 x 0.05 = +-0.098 (an 80% one: +-0.064)."""
    diffs = np.array([1.0, -1.0] * 200)
    result = paired_bootstrap(np.zeros(400), diffs, num_samples=20_000)
    assert result["confidence"] == 0.95
    assert result["ci_high"] == pytest.approx(1.96 * 0.05, rel=0.08) and result["ci_low"] == pytest.approx(-0.098, rel=0.08)
    narrower = paired_bootstrap(np.zeros(400), diffs, num_samples=20_000, confidence=0.80)
    assert narrower["ci_high"] == pytest.approx(1.2816 * 0.05, rel=0.08)  # the level is a parameter, read


def test_sign_is_b_minus_a():
    result = paired_bootstrap([1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0], num_samples=500)
    assert result["diff"] == pytest.approx(-0.5) and result["mean_a"] == 0.75 and result["mean_b"] == 0.25


def test_a_large_consistent_gain_is_significant_and_a_noisy_small_one_is_not():
    rng = np.random.default_rng(3)
    base = (rng.random(300) < 0.4).astype(float)
    better = np.maximum(base, (rng.random(300) < 0.3).astype(float))  # only gains, ~18 points
    significant = paired_bootstrap(base, better)
    assert significant["ci_low"] > 0 and significant["p_value"] < 0.01

    noisy = base.copy()  # 16 questions gained, 14 lost: a small difference (+2/300) within the noise
    noisy[np.flatnonzero(base == 0)[:16]] = 1.0
    noisy[np.flatnonzero(base == 1)[:14]] = 0.0
    null = paired_bootstrap(base, noisy)
    assert null["diff"] == pytest.approx(2 / 300)
    assert null["ci_low"] < 0 < null["ci_high"] and null["p_value"] > 0.05


def test_same_seed_same_result_and_chunking_does_not_change_it(monkeypatch):
    rng = np.random.default_rng(4)
    a, b = rng.random(100), rng.random(100)
    first = paired_bootstrap(a, b, num_samples=1000, seed=7)
    assert paired_bootstrap(a, b, num_samples=1000, seed=7) == first
    assert paired_bootstrap(a, b, num_samples=1000, seed=8) != first
    import agentic_retriever.eval.bootstrap as bootstrap
    monkeypatch.setattr(bootstrap, "_MAX_CHUNK_ELEMENTS", 100 * 7)  # 7 samples per chunk
    chunked = paired_bootstrap(a, b, num_samples=1000, seed=7)
    assert chunked["ci_low"] == pytest.approx(first["ci_low"]) and chunked["ci_high"] == pytest.approx(first["ci_high"])


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError, match="one length"):
        paired_bootstrap([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="at least one pair"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([1.0], [1.0], confidence=1.0)


def _report(values: dict[str, float | None]) -> dict:
    return {"metrics": {"recall@5": 0.0, "answer_recall@5": 0.0},
            "per_question": [{"id": q, "recall@5": v if v is not None else 0.0, "answer_recall@5": v}
                             for q, v in values.items()]}


def test_compare_reports_pairs_by_question_id_and_skips_rows_without_answers():
    base = _report({"q1": 0.0, "q2": 1.0, "q3": None})
    other = _report({"q2": 1.0, "q3": None, "q1": 1.0})  # other order: pairing is by id
    results = compare_reports(base, other, num_samples=200)
    assert set(results) == {"recall@5", "answer_recall@5"}
    assert results["recall@5"]["n"] == 3 and results["recall@5"]["diff"] == pytest.approx(1 / 3)
    assert results["answer_recall@5"]["n"] == 2 and results["answer_recall@5"]["diff"] == pytest.approx(0.5)


def test_compare_reports_rejects_reports_on_different_questions():
    with pytest.raises(ValueError, match=r"different questions: 1 only in the base report \(e.g. \['q3'\]\)"):
        compare_reports(_report({"q1": 0.0, "q3": 1.0}), _report({"q1": 0.0, "q4": 1.0}))
    with pytest.raises(ValueError, match="twice"):
        compare_reports(_report({"q1": 0.0}), {"per_question": [{"id": "q1"}, {"id": "q1"}]})
