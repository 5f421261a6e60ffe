"""Paired bootstrap: is system b better than system a on the same questions, and by how much?

Both systems are scored on the same n questions, giving paired values (a_i, b_i). The statistic is the mean
paired difference d = mean(b) - mean(a), **b minus a** (called as ``(base, trained)`` it is trained minus base:
positive means the second system is better). Its sampling distribution is estimated by resampling the n
questions with replacement ``num_samples`` times, keeping each question's pair together (Efron & Tibshirani,
"An Introduction to the Bootstrap", 1993, ch. 13 percentile intervals; Koehn, "Statistical Significance Tests
for Machine Translation Evaluation", EMNLP 2004, paired bootstrap resampling):

* ci_low, ci_high: the (1-confidence)/2 and (1+confidence)/2 quantiles of the resampled differences
  (percentile interval);
* p_value: two-sided, 2 * min(#{d* <= 0}, #{d* >= 0}) / num_samples with add-one smoothing
  ((count + 1) / (num_samples + 1), so never exactly 0), capped at 1: how often a resample reverses or erases
  the observed difference.

Resampled indices are drawn as a (chunk, n) integer array, chunked over samples so memory stays bounded for
large n. Pure numpy; the same seed gives the same result.

    result = paired_bootstrap(base_recall, trained_recall)       # per-question values, same order
    result["diff"], (result["ci_low"], result["ci_high"]), result["p_value"]
    compare_reports(base_report, trained_report, ["recall@5", "answer_recall@5"])   # pairs by question id
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["compare_reports", "paired_bootstrap"]

_MAX_CHUNK_ELEMENTS = 1 << 22  # resampled indices held at once (32 MiB of int64)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], num_samples: int = 10_000, confidence: float = 0.95,
                     seed: int = 0) -> dict:
    """Paired bootstrap of mean(b) - mean(a) over per-question values; b minus a.

    Returns ``{"n", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_value", "confidence", "num_samples"}``.
    """
    a_values, b_values = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a_values.ndim != 1 or a_values.shape != b_values.shape:
        raise ValueError(f"paired values must be two flat sequences of one length, got {a_values.shape} and {b_values.shape}")
    n = len(a_values)
    if n == 0:
        raise ValueError("paired bootstrap needs at least one pair of values")
    if not np.isfinite(a_values).all() or not np.isfinite(b_values).all():
        raise ValueError("paired values must be finite numbers")
    if num_samples < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    diffs = b_values - a_values
    rng = np.random.default_rng(seed)
    resampled = np.empty(num_samples, dtype=np.float64)
    chunk = max(1, _MAX_CHUNK_ELEMENTS // n)
    for start in range(0, num_samples, chunk):
        stop = min(start + chunk, num_samples)
        indices = rng.integers(0, n, size=(stop - start, n))
        resampled[start:stop] = diffs[indices].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(resampled, [alpha / 2, 1 - alpha / 2])
    at_most_zero, at_least_zero = int((resampled <= 0).sum()), int((resampled >= 0).sum())
    p_value = min(1.0, 2 * (min(at_most_zero, at_least_zero) + 1) / (num_samples + 1))
    return {
        "n": n, "mean_a": float(a_values.mean()), "mean_b": float(b_values.mean()), "diff": float(diffs.mean()),
        "ci_low": float(low), "ci_high": float(high), "p_value": p_value, "confidence": confidence,
        "num_samples": num_samples,
    }


def compare_reports(base_report: dict, other_report: dict, metrics: Sequence[str] | None = None,
                    num_samples: int = 10_000, confidence: float = 0.95, seed: int = 0) -> dict[str, dict]:
    """Per metric, the paired bootstrap of other minus base over the reports' ``per_question`` entries.

    Entries are paired by question ``id``; the two reports must hold the same ids (else ValueError). A metric
    whose value is None in both entries of a pair (``answer_recall@k`` of a row without golden answers) leaves
    that pair out; None on one side only is an error. `metrics` defaults to those in both reports' ``metrics``.
    """
    base, other = _by_id(base_report, "base"), _by_id(other_report, "other")
    if base.keys() != other.keys():
        only_base, only_other = sorted(base.keys() - other.keys()), sorted(other.keys() - base.keys())
        raise ValueError(f"the reports judge different questions: {len(only_base)} only in the base report "
                         f"(e.g. {only_base[:3]}), {len(only_other)} only in the other (e.g. {only_other[:3]}); "
                         "compare reports made on the same QA file and corpus")
    if metrics is None:
        metrics = [m for m in base_report.get("metrics", {}) if m in other_report.get("metrics", {})]
    results = {}
    for metric in metrics:
        pairs = []
        for qid, entry in base.items():
            a, b = entry.get(metric), other[qid].get(metric)
            if a is None and b is None:
                continue
            if a is None or b is None:
                side = "base" if a is None else "other"
                raise ValueError(f"question {qid!r}: metric {metric!r} is missing in the {side} report only")
            pairs.append((a, b))
        if not pairs:
            raise ValueError(f"metric {metric!r} has no per-question values in the reports")
        a_values, b_values = zip(*pairs)
        results[metric] = paired_bootstrap(a_values, b_values, num_samples, confidence, seed)
    return results


def _by_id(report: dict, name: str) -> dict[str, dict]:
    entries = report.get("per_question")
    if not isinstance(entries, list):
        raise ValueError(f"the {name} report has no per_question list (write it with eval retrieval --out)")
    out: dict[str, dict] = {}
    for entry in entries:
        qid = str(entry["id"])
        if qid in out:
            raise ValueError(f"the {name} report has question id {qid!r} twice")
        out[qid] = entry
    return out
