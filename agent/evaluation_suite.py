"""`agentic-retriever eval suite`: the agent over the paper's seven QA sets with one retriever, into its Table 1.

"Agentic-R: Learning to Retrieve for Agentic Search" (arXiv 2601.11888, section 5.1 and Table 1) evaluates the
search agent with each retriever on HotpotQA, 2WikiMultihopQA, MuSiQue, Bamboogle, NQ, TriviaQA and PopQA by
exact match, with the plain mean of the seven as "Avg.". The paper does not name the splits; it follows
Search-R1, whose ``qa_search_test_merge.py`` takes each FlashRAG dataset's test split where it has one and its
dev split otherwise: test for NQ, TriviaQA, PopQA and Bamboogle, dev for HotpotQA, 2Wiki and MuSiQue
(`PAPER_SPLITS`, the default ``qa``). Any QA set spec works instead (`agentic_retriever.base.qa_sources`: local
FlashRAG files, Search-R1's merged test parquet, whose ``data_source`` names each row's dataset).

The rollouts go to ``OUT/trajectories.jsonl`` (greedy unless ``env.temperature`` says otherwise; a rerun
completes the file), the table to ``OUT/suite.md`` and ``OUT/suite.json``: EM, F1 and searches per question for
each dataset, and their unweighted means.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentic_retriever.base.client import RetrievalClient, RetrievalConfig
from agentic_retriever.base.jsonl import atomic_write, write_json
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.llm.protocol import LLM
from agentic_retriever.base.qa_sources import QARow, read_qa_rows
from agentic_retriever.retrieval import open_client

from .env import EnvConfig
from .evaluate import evaluate_trajectories
from .rollouts import run_rollouts
from .trajectory import read_trajectories

__all__ = ["PAPER_QA", "PAPER_SPLITS", "SuiteConfig", "run_suite", "suite_table"]

#: The paper's datasets in its Table 1 order, with the FlashRAG split Search-R1's evaluation reads and the column name.
PAPER_SPLITS: tuple[tuple[str, str, str], ...] = (
    ("hotpotqa", "dev", "HotpotQA"), ("2wikimultihopqa", "dev", "2Wiki"), ("musique", "dev", "Musique"),
    ("bamboogle", "test", "Bamboogle"), ("nq", "test", "NQ"), ("triviaqa", "test", "TriviaQA"),
    ("popqa", "test", "PopQA"),
)
PAPER_QA = ",".join(f"hf:RUC-NLPIR/FlashRAG_datasets:{name}:{split}" for name, split, _ in PAPER_SPLITS)
_COLUMN = {name: column for name, _, column in PAPER_SPLITS}


@dataclass
class SuiteConfig:
    """Settings of `agentic-retriever eval suite` (section ``eval_suite``)."""

    qa: str = field(default=PAPER_QA, metadata={
        "help": "QA set whose rows name their dataset (default: the paper's seven FlashRAG splits on the hub)"})
    per_dataset: int | None = field(default=None, metadata={"help": "only the first N questions of each dataset"})
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    agent: LLMConfig = field(default_factory=LLMConfig)
    env: EnvConfig = field(default_factory=lambda: EnvConfig(temperature=0.0))
    out: str = field(default="", metadata={"help": "folder for trajectories.jsonl, suite.json and suite.md",
                                           "derive": "{workdir}/eval_suite"})
    batch_size: int = field(default=16, metadata={"help": "trajectories advanced together per rollout call"})


def _first_per_dataset(rows: list[QARow], limit: int | None) -> list[QARow]:
    if limit is None:
        return rows
    if limit < 1:
        raise ValueError(f"per_dataset must be at least 1, got {limit}")
    taken: dict[str, int] = defaultdict(int)
    kept = []
    for row in rows:
        name = row.dataset or ""
        if taken[name] < limit:
            taken[name] += 1
            kept.append(row)
    return kept


def run_suite(config: SuiteConfig, llm: LLM | None = None, client: RetrievalClient | None = None) -> dict[str, Any]:
    """Roll the agent out on every question of `config.qa` and write the per-dataset table; `llm` and `client`
    override `config.agent` and `config.retrieval` (callers that hold them). Returns the report."""
    if not config.out:
        raise ValueError("eval suite needs --out (or a workdir)")
    out = Path(config.out)
    rows = _first_per_dataset(read_qa_rows(config.qa), config.per_dataset)
    if not rows:
        raise ValueError(f"QA set {config.qa!r} holds no questions")
    trajectories = out / "trajectories.jsonl"
    wanted = {row.id for row in rows}
    stray = sorted({t.question_id for t in read_trajectories(trajectories)} - wanted) if trajectories.is_file() else []
    if stray:
        raise ValueError(f"{trajectories} holds trajectories of questions outside this QA set (e.g. {stray[:3]}): it "
                         "was written for another QA set or per_dataset; give another --out")
    client = client if client is not None else open_client(config.retrieval)
    retriever = config.retrieval.index or config.retrieval.url or type(client).__name__
    if llm is not None:
        run_rollouts(rows, llm, client, config.env, trajectories, config.batch_size, retriever)
    else:
        from agentic_retriever.base.llm import load_llm

        with load_llm(config.agent) as loaded:
            run_rollouts(rows, loaded, client, config.env, trajectories, config.batch_size, retriever)
    evaluated = evaluate_trajectories(trajectories, rows)
    datasets = _ordered(evaluated["by_dataset"])
    report = {"qa": config.qa, "retriever": retriever, "agent": config.agent.model if llm is None else llm.name,
              "questions": len(rows), "datasets": datasets,
              "average": {metric: sum(d[metric] for d in datasets.values()) / len(datasets)
                          for metric in ("em", "f1", "searches")}}
    write_json(out / "suite.json", report)
    with atomic_write(out / "suite.md") as handle:
        handle.write(suite_table(report))
    return report


def _ordered(by_dataset: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The paper's datasets in its column order, then any others by name."""
    order = [name for name, _, _ in PAPER_SPLITS if name in by_dataset]
    return {name: by_dataset[name] for name in order + sorted(set(by_dataset) - set(order))}


def suite_table(report: dict[str, Any]) -> str:
    """The report as the paper's Table 1 (EM x 100), with F1 and searches per question below."""
    names = list(report["datasets"])
    head = ["", *(_COLUMN.get(name, name) for name in names), "Avg."]
    lines = [f"Agent {report['agent']} with retriever {report['retriever']} on {report['questions']} questions.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric, label, scale in (("em", "EM", 100), ("f1", "F1", 100), ("searches", "searches / question", 1)):
        cells = [f"{report['datasets'][n][metric] * scale:.2f}" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {report['average'][metric] * scale:.2f} |")
    lines.append("| questions | " + " | ".join(str(report["datasets"][n]["questions"]) for n in names) + " | |")
    return "\n".join(lines) + "\n"
