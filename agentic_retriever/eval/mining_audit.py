"""Mining audit: where the evidence went in a utility-mining run (issue 12).

Evaluation-side. Mining itself ("Agentic-R: Learning to Retrieve for Agentic Search", section 4.1.1) never
reads evidence labels; this audit does:
it joins the run's ``rounds.jsonl`` with a QA file (``{"id", "question", "golden_answers",
"supporting_titles"}``, on ``question_id == id``) and asks, per round and over the run:

* **classes**: *evidence* (a candidate whose title is one of the question's ``supporting_titles``, exact string
  match) and *answer-containing* (the candidate's ``contains_answer`` flag, written by mining). For each: was a
  member retrieved, at which best rank, was the positive a member (a round with several tied positives counts
  when any of them is), was a member sampled as a negative, and otherwise what the positive was (a member of
  the other class, or neither). Where each class "went": positive / negative / excluded / unused (a mined
  round that used it for nothing) / round_dropped / not_retrieved.
* **AUC per signal** (Mann-Whitney): within a round, the probability that a random member scores above a
  random non-member, ties counting 1/2, for LR, GAC and the retriever (its score; ``-rank`` where a candidate
  has no score). Candidates without a value for a signal are left out of that signal's AUC; rounds without a
  member or without a non-member are left out; the run's figure is the mean over the remaining rounds, with
  their number. A signal that no candidate of the run has (e.g. GAC under "w/o GAC") is reported ``absent``.
* **false negatives**: the share of sampled negatives (every negative slot of every row of
  ``retriever_train.jsonl``) that is evidence, and that contains a gold answer; the rows with an evidence
  negative. The same by distinct candidate (``role == "negative"`` in ``rounds.jsonl``).
* **drops**: rounds by drop reason, and the dropped rounds whose evidence was at rank 1 (missed opportunities).
* **positives vs the base ranking**: the distribution of the positives' retriever ranks.

Evidence figures count only *judged* rounds: rounds whose question is in the QA file (the others are counted
as ``unjudged``) and has supporting titles. Answer-containing figures need no QA file and count every round.

Outputs (atomic): ``audit.json`` (everything, with one record per round), ``audit.md`` (the headline table)
and ``audit.png``. This module computes the figures; `audit_records` reads the inputs and `audit_report`
renders the tables and the picture. See docs/mining.md, "mine audit".

    report = audit_mining("runs/x/iter_1/mining", "data/fanoutqa/dev.jsonl")
    report["false_negatives"]["evidence_rate"], report["auc"]["evidence"]["lr"]["mean"]
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentic_retriever.base.jsonl import atomic_write, write_json
from .mining_audit_records import (CLASSES, FATES, RANK_BUCKETS, ROUNDS_FILE, ROWS_FILE, SIGNALS, AuditCandidate, AuditRound,
                            load_evidence_titles, load_rounds, load_rows)
from .mining_audit_report import plot_audit, render_markdown

__all__ = ["AUDIT_FILES", "CLASSES", "FATES", "SIGNALS", "AuditCandidate", "AuditRound", "MineAuditConfig", "audit_mining",
           "load_evidence_titles", "load_rounds", "mann_whitney_auc", "plot_audit", "render_markdown"]

AUDIT_FILES = ("audit.json", "audit.md", "audit.png")


def mann_whitney_auc(members: Sequence[float], others: Sequence[float]) -> float | None:
    """P(random member > random non-member), ties counting 1/2; None without a member or a non-member."""
    if not members or not others:
        return None
    wins = sum(1.0 if m > o else 0.5 if m == o else 0.0 for m in members for o in others)
    return wins / (len(members) * len(others))


def _rate(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def _bucket(rank: int) -> str:
    for bucket in RANK_BUCKETS[:-1]:
        lo, _, hi = bucket.partition("-")
        if int(lo) <= rank <= int(hi or lo):
            return bucket
    return RANK_BUCKETS[-1]


def _class_record(rnd: AuditRound, is_member, is_other) -> dict:
    """One class in one round: retrieved, best rank, the positive's class, and where the class went.

    `is_other` tells the other class; None when it cannot be judged (the positive's class is then "unjudged")."""
    members = [c for c in rnd.candidates if is_member(c)]
    positives = [c for c in rnd.candidates if c.role == "positive"]
    roles = {c.role for c in members}
    mined = rnd.status == "mined"
    if not members:
        fate = "not_retrieved"
    elif not mined:
        fate = "round_dropped"
    else:
        fate = next((r for r in ("positive", "negative", "excluded") if r in roles), "unused")
    positive_is_member = any(is_member(c) for c in positives) if mined else None
    otherwise = None
    if mined and members and not positive_is_member:
        otherwise = ("unjudged" if is_other is None
                     else "other_class" if any(is_other(c) for c in positives) else "neither")
    return {"retrieved": bool(members), "members": len(members),
            "best_rank": min((c.rank for c in members), default=None), "fate": fate,
            "positive_is_member": positive_is_member, "member_as_negative": "negative" in roles,
            "positive_otherwise": otherwise}


def _round_aucs(rnd: AuditRound, is_member) -> dict[str, float | None]:
    aucs = {}
    for signal in SIGNALS:
        scored = [(c.signal(signal), is_member(c)) for c in rnd.candidates if c.signal(signal) is not None]
        aucs[signal] = mann_whitney_auc([v for v, m in scored if m], [v for v, m in scored if not m])
    return aucs


def _audit_round(rnd: AuditRound, titles: frozenset[str] | None) -> tuple[dict, frozenset[str] | None]:
    """The round's record, and the ids of its evidence candidates (None when the round cannot be judged)."""
    judged = bool(titles)
    evidence_ids = frozenset(c.id for c in rnd.candidates if c.title in titles) if judged else None

    def is_evidence(c: AuditCandidate) -> bool:
        return judged and c.id in evidence_ids

    def is_answer(c: AuditCandidate) -> bool:
        return c.contains_answer

    positives = [c for c in rnd.candidates if c.role == "positive"]
    record = {"round_id": rnd.round_id, "question_id": rnd.question_id, "round_index": rnd.round_index,
              "status": rnd.status, "drop_reason": rnd.drop_reason, "candidates": len(rnd.candidates),
              "in_qa": titles is not None, "judged": judged,
              "positive_ranks": sorted(c.rank for c in positives),
              "answer": _class_record(rnd, is_answer, is_evidence if judged else None),
              "auc": {"answer": _round_aucs(rnd, is_answer)}}
    if judged:
        record["evidence"] = _class_record(rnd, is_evidence, is_answer)
        record["auc"]["evidence"] = _round_aucs(rnd, is_evidence)
        record["positive_classes"] = [_positive_class(c, is_evidence(c)) for c in positives]
    return record, evidence_ids


@dataclass
class MineAuditConfig:
    """Settings of `agentic-retriever mine audit RUN --qa FILE` (section ``mine_audit``)."""

    run: str = field(default="", metadata={"help": "mining run folder holding rounds.jsonl (also the positional RUN)",
                                           "derive": "{workdir}/mining"})
    qa: str = field(default="", metadata={"help": "QA JSONL with supporting_titles: the evidence labels",
                                          "required": True})
    out: str = field(default="", metadata={"help": "folder for audit.{json,md,png} (default: the run folder)"})


def audit_mining(run_dir: str | os.PathLike, qa_path: str | os.PathLike | None,
                 out_dir: str | os.PathLike | None = None) -> dict:
    """Audit a mining run folder against the QA file's evidence labels; write audit.{json,md,png} to
    `out_dir` (default: `run_dir`) and return the audit.json document (see the module docstring).

    `qa_path` None: no evidence labels, every round is unjudged (answer-containing figures only)."""
    run_dir = Path(run_dir)
    rounds_path = run_dir / ROUNDS_FILE
    if not rounds_path.is_file():
        raise FileNotFoundError(
            f"{rounds_path} not found: it is written by `agentic-retriever mine` (a mining run with this version "
            f"of the code; runs made before rounds.jsonl existed must be mined again to be audited)")
    rounds = load_rounds(rounds_path)
    evidence = load_evidence_titles(qa_path) if qa_path else {}
    rows_path = run_dir / ROWS_FILE
    rows = load_rows(rows_path) if rows_path.is_file() else None

    per_round, evidence_ids = [], []
    for rnd in rounds:
        record, ids = _audit_round(rnd, evidence.get(rnd.question_id))
        per_round.append(record)
        evidence_ids.append(ids)
    by_key = {r.key: (r, ev) for r, ev in zip(rounds, evidence_ids)}
    present = {s: any(c.signal(s) is not None for r in rounds for c in r.candidates) for s in SIGNALS}
    report = {
        "run_dir": str(run_dir), "qa": None if qa_path is None else str(qa_path),
        "note": "evaluation-side audit: reads the QA file's evidence labels (supporting_titles); mining never does",
        "rounds": _round_counts(per_round),
        "evidence": _class_summary([r for r in per_round if r["judged"]], "evidence"),
        "answer": _class_summary(per_round, "answer"),
        "positives": _positive_summary(per_round),
        "auc": {cls: {s: _auc_summary(per_round, cls, s, present[s]) for s in SIGNALS} for cls in CLASSES},
        "false_negatives": _false_negatives(rounds, evidence_ids, rows, by_key),
        "drops": _drop_summary(per_round),
        "per_round": per_round,
    }
    out = Path(out_dir) if out_dir is not None else run_dir
    write_json(out / "audit.json", report)
    with atomic_write(out / "audit.md") as handle:
        handle.write(render_markdown(report) + "\n")
    plot_audit(report, out / "audit.png")
    return report


def _positive_class(c: AuditCandidate, evidence: bool) -> str:
    if evidence:
        return "evidence_and_answer" if c.contains_answer else "evidence_only"
    return "answer_only" if c.contains_answer else "neither"


def _round_counts(per_round: list[dict]) -> dict:
    return {"total": len(per_round), "mined": sum(r["status"] == "mined" for r in per_round),
            "dropped": sum(r["status"] == "dropped" for r in per_round),
            "judged": sum(r["judged"] for r in per_round),
            "unjudged": sum(not r["in_qa"] for r in per_round),
            "without_supporting_titles": sum(r["in_qa"] and not r["judged"] for r in per_round)}


def _class_summary(records: list[dict], cls: str) -> dict:
    """Counts over `records` (rounds where the class can be judged); rates over the rounds they can happen in."""
    recs = [r[cls] for r in records]
    mined = [c for r, c in zip(records, recs) if r["status"] == "mined" and c["retrieved"]]
    otherwise = Counter(c["positive_otherwise"] for c in mined if c["positive_otherwise"])
    best = Counter(_bucket(c["best_rank"]) for c in recs if c["retrieved"])
    retrieved = sum(c["retrieved"] for c in recs)
    return {
        "rounds": len(recs), "retrieved": retrieved, "retrieved_rate": _rate(retrieved, len(recs)),
        "at_rank_1": sum(c["best_rank"] == 1 for c in recs),
        "best_rank": {b: best.get(b, 0) for b in RANK_BUCKETS},
        "fate": {f: sum(c["fate"] == f for c in recs) for f in FATES},
        "mined_rounds_with_member": len(mined),
        "positive_is_member": sum(bool(c["positive_is_member"]) for c in mined),
        "positive_is_member_rate": _rate(sum(bool(c["positive_is_member"]) for c in mined), len(mined)),
        "member_as_negative": sum(c["member_as_negative"] for c in mined),
        "member_as_negative_rate": _rate(sum(c["member_as_negative"] for c in mined), len(mined)),
        "positive_otherwise": {k: otherwise.get(k, 0) for k in ("other_class", "neither", "unjudged")},
    }


def _positive_summary(per_round: list[dict]) -> dict:
    """The positives' retriever ranks (every positive), and their classes (positives of judged rounds)."""
    ranks = [k for r in per_round for k in r["positive_ranks"]]
    buckets = Counter(_bucket(k) for k in ranks)
    classes = Counter(c for r in per_round if r["judged"] for c in r["positive_classes"])
    return {
        "count": len(ranks), "rank_buckets": {b: buckets.get(b, 0) for b in RANK_BUCKETS},
        "rank_counts": {str(k): v for k, v in sorted(Counter(ranks).items())},
        "mean_rank": round(statistics.fmean(ranks), 3) if ranks else None,
        "median_rank": statistics.median(ranks) if ranks else None,
        "at_rank_1_rate": _rate(sum(k == 1 for k in ranks), len(ranks)),
        "classes": {c: classes.get(c, 0) for c in ("evidence_and_answer", "evidence_only", "answer_only", "neither")},
    }


def _auc_summary(per_round: list[dict], cls: str, signal: str, present: bool) -> dict:
    if not present:
        return {"absent": True, "mean": None, "rounds": 0}
    values = [r["auc"][cls][signal] for r in per_round if cls in r["auc"] and r["auc"][cls][signal] is not None]
    return {"absent": False, "mean": round(statistics.fmean(values), 4) if values else None, "rounds": len(values)}


def _false_negatives(rounds: list[AuditRound], evidence_ids: list[frozenset[str] | None], rows,
                     by_key: dict) -> dict:
    """Sampled negatives that are evidence or contain a gold answer: by row slot (``retriever_train.jsonl``;
    None when the run has none) and by distinct candidate (``role == "negative"``). Evidence over judged rounds."""
    negatives = [(c, ev) for rnd, ev in zip(rounds, evidence_ids) for c in rnd.candidates if c.role == "negative"]
    judged = [c for c, ev in negatives if ev is not None]
    answer = sum(c.contains_answer for c, _ in negatives)
    evidence = sum(c.id in ev for c, ev in negatives if ev is not None)
    by_candidate = {"negatives": len(negatives), "answer": answer, "answer_rate": _rate(answer, len(negatives)),
                    "judged_negatives": len(judged), "evidence": evidence,
                    "evidence_rate": _rate(evidence, len(judged))}
    if rows is None:
        return {"by_row": None, "by_candidate": by_candidate}
    counts = dict.fromkeys(("rows", "rows_without_round", "negatives", "negatives_not_in_round", "answer",
                            "judged_rows", "judged_negatives", "evidence", "rows_with_evidence_negative"), 0)
    for key, ids in rows:
        if key not in by_key:
            counts["rows_without_round"] += 1
            continue
        rnd, ev = by_key[key]
        by_id = {c.id: c for c in rnd.candidates}
        negs = [by_id[p] for p in ids[1:] if p in by_id]
        counts["rows"] += 1
        counts["negatives_not_in_round"] += len(ids[1:]) - len(negs)
        counts["negatives"] += len(negs)
        counts["answer"] += sum(c.contains_answer for c in negs)
        if ev is not None:
            hits = sum(c.id in ev for c in negs)
            counts["judged_rows"] += 1
            counts["judged_negatives"] += len(negs)
            counts["evidence"] += hits
            counts["rows_with_evidence_negative"] += hits > 0
    by_row = {**counts, "answer_rate": _rate(counts["answer"], counts["negatives"]),
              "evidence_rate": _rate(counts["evidence"], counts["judged_negatives"]),
              "rows_with_evidence_negative_rate": _rate(counts["rows_with_evidence_negative"], counts["judged_rows"])}
    return {"by_row": by_row, "by_candidate": by_candidate}


def _drop_summary(per_round: list[dict]) -> dict:
    """Dropped rounds by reason; how many had their evidence (or an answer-containing passage) at rank 1."""
    reasons: dict[str, dict] = {}
    for r in per_round:
        if r["status"] != "dropped":
            continue
        entry = reasons.setdefault(r["drop_reason"] or "unknown", dict.fromkeys(
            ("rounds", "judged", "evidence_retrieved", "evidence_at_rank_1", "answer_at_rank_1"), 0))
        entry["rounds"] += 1
        entry["answer_at_rank_1"] += r["answer"]["best_rank"] == 1
        if r["judged"]:
            entry["judged"] += 1
            entry["evidence_retrieved"] += r["evidence"]["retrieved"]
            entry["evidence_at_rank_1"] += r["evidence"]["best_rank"] == 1
    reasons = dict(sorted(reasons.items(), key=lambda kv: -kv[1]["rounds"]))
    return {"by_reason": reasons,
            "missed_opportunities": sum(e["evidence_at_rank_1"] for e in reasons.values())}
