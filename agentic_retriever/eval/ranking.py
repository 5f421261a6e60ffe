"""Ranking measures by trec_eval's own code: Recall@k, MRR@k (reciprocal rank), nDCG@k and Success@k through
ir-measures (its pytrec_eval provider), the implementation the BEIR and TREC figures that papers quote come from.

`measure_rankings(rankings, qrels, names)` takes each query's ranked keys (passage ids, or page titles where
evidence is judged by page) and its judgements (key -> grade; grade > 0 is relevant, nDCG's gain is the grade), and
gives each query's value of each named measure (``recall@5``, ``mrr@10``, ``ndcg@10``, ``success@1``).

trec_eval takes a document once per query, and a ranking by title repeats a page when several of its passages are
retrieved. A repeated key counts at its first rank; its later places stay in the ranking as entries that match no
judgement (dropping them would move every later key up a rank). A query without a relevant key (or without a
ranking) scores 0 on every measure, as in BEIR's own evaluation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import ir_measures

__all__ = ["MEASURE_PATTERN", "measure_rankings", "query_measures"]

#: A measure's name: ``recall@k``, ``mrr@k``, ``ndcg@k`` or ``success@k``.
MEASURE_PATTERN = re.compile(r"^(recall|mrr|ndcg|success)@([1-9]\d*)$")
_IR_MEASURES = {"recall": ir_measures.R, "mrr": ir_measures.RR, "ndcg": ir_measures.nDCG,
                "success": ir_measures.Success}


def _measure(name: str):
    match = MEASURE_PATTERN.match(name)
    if not match:
        raise ValueError(f"unknown ranking measure {name!r}; use recall@k, mrr@k, ndcg@k or success@k")
    return _IR_MEASURES[match.group(1)] @ int(match.group(2))


def _run(ranked: Sequence[str]) -> dict[str, float]:
    """A ranking as trec_eval reads one: scores falling with the rank; a repeated key's later places kept as
    entries of their own that match no judgement."""
    run: dict[str, float] = {}
    for rank, key in enumerate(ranked, start=1):
        run[key if key not in run else f"<repeat at rank {rank}>"] = float(len(ranked) - rank)
    return run


def measure_rankings(rankings: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]],
                     names: Sequence[str]) -> dict[str, dict[str, float]]:
    """Query id -> {measure name: value} for every query of `rankings` (see module)."""
    measures = {_measure(name): name for name in names}
    values = {qid: dict.fromkeys(names, 0.0) for qid in rankings}
    judged = {qid: {key: int(grade) for key, grade in qrels.get(qid, {}).items()} for qid, ranked in rankings.items()
              if ranked and any(grade > 0 for grade in qrels.get(qid, {}).values())}
    if judged:
        run = {qid: _run(rankings[qid]) for qid in judged}
        for metric in ir_measures.iter_calc(list(measures), judged, run):
            values[metric.query_id][measures[metric.measure]] = float(metric.value)
    return values


def query_measures(ranked: Sequence[str], relevant: Mapping[str, int] | set[str], names: Sequence[str]
                   ) -> dict[str, float]:
    """`measure_rankings` of one query; `relevant` as judgements, or a set of relevant keys (grade 1 each)."""
    grades = relevant if isinstance(relevant, Mapping) else dict.fromkeys(relevant, 1)
    return measure_rankings({"q": list(ranked)}, {"q": grades}, names)["q"]
