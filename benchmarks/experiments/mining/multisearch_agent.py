"""The multi-search agent against the single-search one, on their own searches over multi-hop dev questions.

The leaf warm start (`configs/quickstart.yaml`) makes an agent that searches about once per question, so its rounds
have Q and q nearly the same text; the multi-search warm start (`configs/multisearch_quickstart.yaml`,
`agent.sft.multihop`) adds trajectories that search a multi-hop question's parts one by one. Both agents answer the
same multi-hop dev questions with the same retriever and environment (the multi-search config's `agent_rollout`),
sending their question with every search; per question: evidence recall over everything their searches retrieved
(EVALUATION: reads the dev questions' evidence titles), answer recall over those passages, EM, F1, searches. The
multi-search agent minus the single-search one, paired bootstrap over questions. Two reference rows bound what
searching can reach here (EVALUATION: they read the dev questions' decompositions and evidence titles): the
evidence recall when the searches are the gold sub-questions of FanOutQA's decomposition (the first `max_turns`,
the agent's search budget, and all of them) with the same retriever, question and top-k, and the share of
evidence pages the corpus holds at all:

    .venv/bin/python benchmarks/experiments/mining/multisearch_agent.py

Writes ``results.json`` and ``results.md`` into ``--work`` (trajectories under ``--work/agent``, reused by a rerun).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _common (an experiment runs as a script)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # mining_experiment, beside it
from _common import describe_device  # noqa: E402
from mining_experiment import (AGENT_BEHAVIOUR, AGENT_METRICS, ExperimentConfig, _ci_cell, agent_report,  # noqa: E402
                               compare_agents)

from agent.rollouts import RolloutConfig  # noqa: E402
from agent.sft import WarmStartConfig, warm_start_agent  # noqa: E402
from agentic_retriever.app.config_loader import build_config  # noqa: E402
from agentic_retriever.app.demo import Steps  # noqa: E402
from agentic_retriever.base.jsonl import iter_jsonl, write_json  # noqa: E402
from agentic_retriever.eval.retrieval import keys_in_corpus  # noqa: E402
from agentic_retriever.index import open_index  # noqa: E402


def gold_decomposition_recall(index_dir: str, parents_path: Path, leaves_path: Path, questions: int, topk: int,
                              budget: int) -> dict:
    """EVALUATION (reads the dev decompositions and evidence titles): mean evidence recall of the first `questions`
    multi-hop questions when their searches are the gold leaf questions (the first `budget`, and all), each sent
    with its multi-hop question as a search agent sends it; and the mean share of their evidence pages in the
    corpus, the ceiling of any search."""
    leaves = {row["id"]: row["question"] for _, row in iter_jsonl(leaves_path)}
    index = open_index(index_dir)
    parents = [row for _, row in iter_jsonl(parents_path, stop=questions)]
    titles = set().union(*(row["supporting_titles"] for row in parents))
    in_corpus = keys_in_corpus(index.corpus, titles, "title")
    recall = {"first": [], "all": [], "in_corpus": []}
    for row in parents:
        evidence = set(row["supporting_titles"])
        if not evidence:
            continue
        missing = [leaf for leaf in row["leaf_ids"] if leaf not in leaves]
        if missing:
            raise ValueError(f"{leaves_path}: no leaf question with id {missing[0]!r} (a leaf of {row['id']!r} in "
                             f"{parents_path})")
        subs = [leaves[leaf] for leaf in row["leaf_ids"]]
        hits = index.retrieve(subs, topk, questions=[row["question"]] * len(subs))
        found = [{passage.title for passage in passages} for passages in hits]
        recall["first"].append(len(evidence & set().union(*found[:budget])) / len(evidence))
        recall["all"].append(len(evidence & set().union(*found)) / len(evidence))
        recall["in_corpus"].append(len(evidence & in_corpus) / len(evidence))
    return {name: sum(values) / len(values) for name, values in recall.items()} | {
        "budget": budget, "questions": len(recall["all"]),
        "sub_questions_per_question": sum(len(row["leaf_ids"]) for row in parents) / len(parents)}


def render_ceiling(ceiling: dict) -> str:
    return (f"References (read the dev decompositions and evidence titles): the gold sub-questions as searches, "
            f"the first {ceiling['budget']}: evidence recall {ceiling['first']:.3f}; all "
            f"({ceiling['sub_questions_per_question']:.1f} per question): {ceiling['all']:.3f}; evidence pages in "
            f"the corpus: {ceiling['in_corpus']:.3f}\n")


def render(reports: dict[str, dict], comparison: dict, questions: int) -> str:
    lines = [f"Multi-hop dev questions ({questions}), each agent's own searches with its question sent along; value "
             "(multi-search minus single-search [95% CI])", "",
             "| agent | " + " | ".join(AGENT_METRICS) + " | searches/q | distinct queries/q | answered |",
             "|---|" + "---:|" * (len(AGENT_METRICS) + 3)]
    for name, report in reports.items():
        cells = [_ci_cell(comparison.get(m) if name == "multi-search" else None, report["metrics"][m])
                 for m in AGENT_METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " | "
                     + " | ".join(f"{report['metrics'][m]:.2f}" for m in AGENT_BEHAVIOUR) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multisearch_quickstart.yaml",
                        help="the multi-search agent's warm start, and the rollouts both agents are evaluated with")
    parser.add_argument("--baseline-config", default="configs/quickstart.yaml",
                        help="the single-search agent's warm start (its agent_sft section)")
    parser.add_argument("--data", default="runs/quickstart/data")
    parser.add_argument("--questions", type=int, default=48, help="the first N multi-hop dev questions")
    parser.add_argument("--leaves", default="fanoutqa_leaf_dev.jsonl",
                        help="under --data: every dev leaf question (the gold decomposition the reference row reads)")
    parser.add_argument("--work", default="runs/multisearch")
    parser.add_argument("--bootstrap-samples", type=int, default=10000)
    args = parser.parse_args()
    steps = Steps()
    agents = {name: steps.run(f"warm start: {name}", lambda: warm_start_agent(
        build_config(WarmStartConfig, "agent_sft", None, path, ())))
        for name, path in (("single-search", args.baseline_config), ("multi-search", args.config))}
    rollout = build_config(RolloutConfig, "agent_rollout", None, args.config, ())
    index = rollout.retrieval.index
    if not index:
        raise ValueError(f"{args.config}: the agent_rollout section (or retrieval) must name the index to search")
    experiment = ExperimentConfig(data=args.data, agent_eval_questions=args.questions,
                                  bootstrap_samples=args.bootstrap_samples)
    work = Path(args.work)
    reports = {name: steps.run(f"rollouts on multi-hop dev: {name}", lambda: agent_report(
        index, str(model), rollout, experiment, Path(args.data), work)) for name, model in agents.items()}
    comparison = compare_agents(reports["single-search"], reports["multi-search"], args.bootstrap_samples)
    ceiling = steps.run("references: gold sub-questions, evidence in the corpus", lambda: gold_decomposition_recall(
        index, Path(args.data) / experiment.dev_parents, Path(args.data) / args.leaves, args.questions,
        rollout.env.topk, rollout.env.max_turns))
    table = render(reports, comparison, reports["multi-search"]["questions"]) + "\n" + render_ceiling(ceiling)
    results = {"agents": {n: str(p) for n, p in agents.items()}, "index": index,
               "env": dataclasses.asdict(rollout.env), "metrics": {n: r["metrics"] for n, r in reports.items()},
               "questions": reports["multi-search"]["questions"], "multi_minus_single": comparison,
               "references": ceiling, "step_seconds": steps.seconds, "device": describe_device()}
    write_json(work / "results.json", results)
    (work / "results.md").write_text(table)
    print("\n" + table + f"\nwrote {work / 'results.json'}, {work / 'results.md'}")


if __name__ == "__main__":
    main()
