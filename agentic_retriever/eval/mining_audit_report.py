"""The mining audit's report as people read it: Markdown tables (`render_markdown`, what `agentic-retriever
mine audit` prints and writes to ``audit.md``) and a four-panel picture (`plot_audit`, ``audit.png``), both
drawn from the ``audit.json`` document that `audit.audit_mining` computes.
"""

from __future__ import annotations

import os

from agentic_retriever.base.jsonl import atomic_write
from .mining_audit_records import CLASSES, FATES, RANK_BUCKETS, SIGNALS

__all__ = ["plot_audit", "render_markdown"]

_LABELS = {"evidence": "evidence", "answer": "answer-containing"}


def _fmt(value, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}%" if percent else f"{value:.3f}" if isinstance(value, float) else str(value)


def _share(num: int, den: int) -> str:
    return f"{num} / {den}" + (f" ({100 * num / den:.1f}%)" if den else "")


def render_markdown(report: dict) -> str:
    """The headline numbers as Markdown tables (what `agentic-retriever mine audit` prints)."""
    rounds, ev, ans, pos = report["rounds"], report["evidence"], report["answer"], report["positives"]
    lines = [f"# Mining audit: {report['run_dir']}", "",
             f"{rounds['total']} rounds with candidates ({rounds['mined']} mined, {rounds['dropped']} dropped); "
             f"{rounds['judged']} judged against {report['qa'] or 'no QA file'}, {rounds['unjudged']} unjudged "
             f"(question not in the QA file), {rounds['without_supporting_titles']} without supporting titles.", "",
             "| | evidence | answer-containing |", "|---|---:|---:|"]
    rows = [("rounds", "rounds", None),
            ("retrieved (any rank)", "retrieved", "rounds"),
            ("at rank 1", "at_rank_1", "rounds"),
            ("mined rounds with one retrieved", "mined_rounds_with_member", None),
            ("... positive is one", "positive_is_member", "mined_rounds_with_member"),
            ("... one sampled as negative", "member_as_negative", "mined_rounds_with_member")]
    for label, key, den in rows:
        lines.append(f"| {label} | " + " | ".join(
            _share(c[key], c[den]) if den else str(c[key]) for c in (ev, ans)) + " |")
    lines.append("| ... positive is the other class | " + " | ".join(
        str(c["positive_otherwise"]["other_class"]) for c in (ev, ans)) + " |")
    lines.append("| ... positive is neither | " + " | ".join(
        str(c["positive_otherwise"]["neither"]) for c in (ev, ans)) + " |")
    for fate in FATES:
        lines.append(f"| went: {fate.replace('_', ' ')} | {ev['fate'][fate]} | {ans['fate'][fate]} |")

    lines += ["", "Within-round AUC (mean over rounds with a member and a non-member; n = rounds):", "",
              "| signal | evidence | answer-containing |", "|---|---:|---:|"]
    for signal in SIGNALS:
        cells = []
        for cls in CLASSES:
            auc = report["auc"][cls][signal]
            cells.append("absent" if auc["absent"] else f"{_fmt(auc['mean'])} (n={auc['rounds']})")
        lines.append(f"| {signal} | " + " | ".join(cells) + " |")

    fn = report["false_negatives"]
    row, cand = fn["by_row"], fn["by_candidate"]
    lines += ["", "False negatives:", "", "| | by row slot | by distinct candidate |", "|---|---:|---:|",
              "| negatives that are evidence | "
              + (_share(row["evidence"], row["judged_negatives"]) if row else "–")
              + f" | {_share(cand['evidence'], cand['judged_negatives'])} |",
              "| negatives that contain an answer | "
              + (_share(row["answer"], row["negatives"]) if row else "–")
              + f" | {_share(cand['answer'], cand['negatives'])} |",
              "| rows with an evidence negative | "
              + (_share(row["rows_with_evidence_negative"], row["judged_rows"]) if row
                 else "– (no retriever_train.jsonl)")
              + " | |"]

    classes = pos["classes"]
    lines += ["", f"Positives: {pos['count']}; retriever rank mean {_fmt(pos['mean_rank'])}, median "
              f"{_fmt(pos['median_rank'])}, at rank 1 {_fmt(pos['at_rank_1_rate'], percent=True)}; in judged rounds: "
              + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in classes.items()) + ".", "",
              "| positive's rank | " + " | ".join(RANK_BUCKETS) + " |", "|---|" + "---:|" * len(RANK_BUCKETS),
              "| positives | " + " | ".join(str(pos["rank_buckets"][b]) for b in RANK_BUCKETS) + " |"]

    drops = report["drops"]
    if drops["by_reason"]:
        lines += ["", f"Dropped rounds ({drops['missed_opportunities']} with the evidence at rank 1: "
                      "missed opportunities):",
                  "", "| reason | rounds | judged | evidence retrieved | evidence at rank 1 | answer at rank 1 |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {reason} | {e['rounds']} | {e['judged']} | {e['evidence_retrieved']} | {e['evidence_at_rank_1']} "
                  f"| {e['answer_at_rank_1']} |" for reason, e in drops["by_reason"].items()]
    return "\n".join(lines)


def plot_audit(report: dict, path: str | os.PathLike) -> None:
    """Four panels: where evidence and answer-containing passages went, AUC per signal, the positives' ranks,
    dropped rounds by reason (with the evidence at rank 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0][0]
    width = 0.4
    for i, (cls, color) in enumerate(zip(CLASSES, ("tab:green", "tab:blue"))):
        values = [report[cls]["fate"][f] for f in FATES]
        xs = [k + (i - 0.5) * width for k in range(len(FATES))]
        bars = ax.bar(xs, values, width, label=_LABELS[cls], color=color)
        ax.bar_label(bars, fontsize=7)
    ax.set_xticks(range(len(FATES)), [f.replace("_", " ") for f in FATES], fontsize=7, rotation=20)
    ax.legend(fontsize=7)
    ax.set_title(f"where they went (rounds; {report['rounds']['judged']} judged for evidence)", fontsize=9)

    ax = axes[0][1]
    for i, (cls, color) in enumerate(zip(CLASSES, ("tab:green", "tab:blue"))):
        aucs = [report["auc"][cls][s] for s in SIGNALS]
        xs = [k + (i - 0.5) * width for k in range(len(SIGNALS))]
        bars = ax.bar(xs, [a["mean"] or 0.0 for a in aucs], width, label=_LABELS[cls], color=color)
        ax.bar_label(bars, labels=["absent" if a["absent"] else "n/a" if a["mean"] is None
                                   else f"{a['mean']:.2f}\nn={a['rounds']}" for a in aucs], fontsize=6)
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(SIGNALS)), list(SIGNALS), fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("within-round AUC per signal (0.5 = chance)", fontsize=9)

    ax = axes[1][0]
    pos = report["positives"]
    bars = ax.bar(list(RANK_BUCKETS), [pos["rank_buckets"][b] for b in RANK_BUCKETS], color="tab:purple")
    ax.bar_label(bars, fontsize=7)
    ax.set_title(f"positives by retriever rank ({pos['count']} positives)", fontsize=9)

    ax = axes[1][1]
    reasons = report["drops"]["by_reason"]
    labels = list(reasons) or ["(none)"]
    bars = ax.barh(labels, [e["rounds"] for e in reasons.values()] or [0], color="tab:red", label="dropped")
    ax.bar_label(bars, fontsize=7)
    ax.barh(labels, [e["evidence_at_rank_1"] for e in reasons.values()] or [0], color="tab:orange",
            label="evidence at rank 1")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7)
    ax.set_title(f"dropped rounds: {report['drops']['missed_opportunities']} missed opportunities", fontsize=9)
    fig.suptitle(f"mining audit: {report['rounds']['total']} rounds, {report['rounds']['mined']} mined", fontsize=10)
    fig.tight_layout()
    with atomic_write(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
