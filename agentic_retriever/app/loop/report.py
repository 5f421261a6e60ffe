"""``loop_report.{md,json,png}``: one row per iteration of the loop (the evaluation of step 6, the mining statistics,
the RL reward curve) and the wall time of every step, from ``loop.json``. Rewritten after every iteration, so a
loop still running has a report of the iterations it finished."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentic_retriever.base.jsonl import atomic_write, write_json
from .manifest import LoopManifest
from .steps import STEPS

__all__ = ["loop_rows", "status_table", "write_report"]

#: Leaf-question retrieval metrics shown per retriever: evidence metrics, or answer recall where the dev rows carry
#: no evidence labels (the paper's QA sets).
RETRIEVAL_METRICS = ("recall@1", "recall@5", "recall@20", "mrr@10")
ANSWER_METRICS = ("answer_recall@1", "answer_recall@5", "answer_recall@20")
SHOWN = (*RETRIEVAL_METRICS, *ANSWER_METRICS, "multihop_recall@20", "multihop_answer_recall@20")


def _summary(manifest: LoopManifest, iteration: int, step: str) -> dict | None:
    record = manifest.get(iteration, step)
    return record.summary if record is not None and record.status == "done" else None


def _retriever_metrics(evaluation: dict) -> dict[str, float]:
    shown = RETRIEVAL_METRICS if "recall@1" in evaluation["leaf"] else ANSWER_METRICS
    row = {m: evaluation["leaf"][m] for m in shown if m in evaluation["leaf"]}
    for metric in ("recall@20", "answer_recall@20"):
        if metric in evaluation["multihop"]:
            row[f"multihop_{metric}"] = evaluation["multihop"][metric]
            break
    return row


def loop_rows(manifest: LoopManifest, iterations: int) -> list[dict[str, Any]]:
    """Row 0: the base retriever (from iteration 1's evaluation); row i: Agentic-R_i, Agent_i with Agentic-R_{i-1}
    and with Agentic-R_i, mining statistics, RL rewards, step wall times. Rows stop at the first unevaluated
    iteration."""
    rows: list[dict[str, Any]] = []
    for i in range(1, iterations + 1):
        evaluation = _summary(manifest, i, "evaluate")
        if evaluation is None:
            break
        if i == 1:
            rows.append({"iteration": 0, "retriever": _retriever_metrics(evaluation["retrieval"]["previous"])})
        row: dict[str, Any] = {"iteration": i, "retriever": _retriever_metrics(evaluation["retrieval"]["new"])}
        if "agent" in evaluation:
            row["agent_with_previous_retriever"] = evaluation["agent"]["previous"]
            row["agent_with_new_retriever"] = evaluation["agent"]["new"]
        mining = _summary(manifest, i, "mining") or {}
        rounds = mining.get("rounds") or {}
        row["mining"] = {"rows": mining.get("rows"), "rounds": rounds.get("in"), "dropped": rounds.get("dropped", {})}
        agent = _summary(manifest, i, "agent") or {}
        row["rl"] = {"trainer": agent.get("trainer"), "algorithm": agent.get("algorithm"),
                     "rewards": agent.get("rewards", [])}
        row["retriever_kept"] = (_summary(manifest, i, "retriever") or {}).get("kept")
        row["seconds"] = {s: manifest.get(i, s).seconds for s in STEPS if manifest.get(i, s) is not None}
        rows.append(row)
    return rows


def _f(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))


def _markdown(rows: list[dict[str, Any]], manifest: LoopManifest) -> str:
    metrics = [m for m in SHOWN if rows and m in rows[0]["retriever"]]
    head = ["iteration", *metrics, "agent EM (R_i-1 / R_i)", "agent F1 (R_i-1 / R_i)", "searches/q (R_i)",
            "mined rows / rounds", "R_i kept", "RL reward first -> last"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        previous, new = row.get("agent_with_previous_retriever", {}), row.get("agent_with_new_retriever", {})
        rewards = row.get("rl", {}).get("rewards") or []
        mining = row.get("mining", {})
        cells = [str(row["iteration"]) + (" (base)" if row["iteration"] == 0 else ""),
                 *(_f(row["retriever"].get(m)) for m in metrics),
                 f"{_f(previous.get('em'))} / {_f(new.get('em'))}" if new else "",
                 f"{_f(previous.get('f1'))} / {_f(new.get('f1'))}" if new else "", _f(new.get("searches")),
                 f"{mining['rows']} / {mining['rounds']}" if mining.get("rows") is not None else "",
                 _f(row.get("retriever_kept")), f"{rewards[0]:.3f} -> {rewards[-1]:.3f}" if rewards else ""]
        lines.append("| " + " | ".join(cells) + " |")
    timed = [r for r in rows if r.get("seconds")]
    times = ["", "Wall time per step (minutes):", "", "| iteration | " + " | ".join(STEPS) + " | total |",
             "|" + "---|" * (len(STEPS) + 2)]
    for row in timed:
        seconds = row["seconds"]
        times.append(f"| {row['iteration']} | " + " | ".join(f"{seconds.get(s, 0) / 60:.1f}" for s in STEPS)
                     + f" | {sum(seconds.values()) / 60:.1f} |")
    datasets = _dataset_table(rows)
    inputs = {s: manifest.get(0, s).seconds for s in ("data", "base_index", "initial_agent") if manifest.get(0, s)}
    text = ("Co-training loop (Algorithm 1 of Agentic-R): retrieval on the leaf dev questions (R_i = the retriever "
            "after iteration i; row 0 the base), the agent Agent_i with the previous and the new retriever.\n\n"
            + "\n".join(lines) + "\n" + datasets + ("\n".join(times) + "\n" if timed else ""))
    if inputs:
        text += "\nInputs (iteration 0): " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in inputs.items()) + "\n"
    return text


def _dataset_table(rows: list[dict[str, Any]]) -> str:
    """Agent_i's EM and F1 per dataset with Agentic-R_{i-1} and Agentic-R_i (the paper's table layout: one column
    pair per dataset), or nothing for an evaluation without the agent."""
    agent_rows = [r for r in rows if r.get("agent_with_new_retriever", {}).get("by_dataset")]
    if not agent_rows:
        return ""
    names = sorted({name for r in agent_rows for name in r["agent_with_new_retriever"]["by_dataset"]})
    head = ["iteration", *(f"{name} EM (R_i-1 / R_i)" for name in names), *(f"{name} F1" for name in names)]
    lines = ["", "Agent_i per dataset (questions: " + ", ".join(
        f"{name} {agent_rows[-1]['agent_with_new_retriever']['by_dataset'].get(name, {}).get('questions', 0)}"
        for name in names) + "):", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in agent_rows:
        before = row["agent_with_previous_retriever"].get("by_dataset", {})
        after = row["agent_with_new_retriever"]["by_dataset"]
        cells = [str(row["iteration"]),
                 *(f"{_f(before.get(n, {}).get('em'))} / {_f(after.get(n, {}).get('em'))}" for n in names),
                 *(f"{_f(before.get(n, {}).get('f1'))} / {_f(after.get(n, {}).get('f1'))}" for n in names)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    x = [r["iteration"] for r in rows]
    for metric in SHOWN:
        if rows and metric in rows[0]["retriever"]:
            axes[0].plot(x, [r["retriever"].get(metric) for r in rows], marker="o", label=metric)
    axes[0].set(title="retriever R_i on dev", xlabel="iteration", xticks=x)
    axes[0].legend(fontsize=8)
    agent_rows = [r for r in rows if "agent_with_new_retriever" in r]
    for key, label in (("agent_with_previous_retriever", "Agent_i + R_i-1"), ("agent_with_new_retriever",
                                                                                 "Agent_i + R_i")):
        axes[1].plot([r["iteration"] for r in agent_rows], [r[key]["em"] for r in agent_rows], marker="o", label=label)
    axes[1].set(title="agent EM on dev", xlabel="iteration", xticks=[r["iteration"] for r in agent_rows])
    axes[1].legend(fontsize=8)
    for r in rows:
        rewards = (r.get("rl") or {}).get("rewards") or []
        if rewards:
            axes[2].plot(range(1, len(rewards) + 1), rewards, marker=".", label=f"iteration {r['iteration']}")
    axes[2].set(title="RL mean reward per step", xlabel="RL step")
    if any((r.get("rl") or {}).get("rewards") for r in rows):
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    with atomic_write(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)


def write_report(manifest: LoopManifest, iterations: int) -> dict[str, Any]:
    """Write ``loop_report.{md,json,png}`` next to ``loop.json``; returns the JSON report."""
    rows = loop_rows(manifest, iterations)
    report = {"iterations": iterations, "rows": rows, "manifest": str(manifest.path)}
    folder = manifest.folder
    write_json(folder / "loop_report.json", report)
    text = _markdown(rows, manifest)
    with atomic_write(folder / "loop_report.md") as handle:
        handle.write(text)
    if rows:
        _plot(rows, folder / "loop_report.png")
    return report


def status_table(manifest: LoopManifest) -> str:
    """`agentic-retriever loop status DIR`: the manifest as a table, one line per (iteration, step)."""
    head = "| iteration | step | status | minutes | attempts | key | artifact |\n|---|---|---|---|---|---|---|"
    lines = [f"| {name.split('/')[0]} | {name.split('/')[1]} | {r.status} | {r.seconds / 60:.1f} | {r.attempts} "
             f"| {r.key[:12]} | {r.artifact} |" for name, r in manifest.steps.items()]
    return head + "\n" + "\n".join(lines) if lines else f"{manifest.path}: no step has run yet"
