"""The main job on the embedded default stack (`make demo`).

For now (retriever core): prepare the default corpus and FanOutQA splits, build the MiniLM Flat and HNSW
indexes and the BM25 index, and evaluate each on the FanOutQA leaf dev questions whose evidence page is
in the corpus. Every step resumes: a finished artifact is reused, an interrupted index build continues.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from .data.prepare import PrepareConfig, prepare_defaults
from .encoder import EncoderConfig
from .eval.report import plot_metrics, render_table
from .eval.retrieval import evaluate_retrieval, load_judged_questions
from .index import BM25Params, DenseParams, IndexBuildConfig, build_index, open_index
from .jsonl import write_json

log = logging.getLogger(__name__)


@dataclass
class DemoConfig:
    workdir: str = field(default="runs/quickstart", metadata={"help": "folder for every artifact of the run"})
    dev_fraction: float = field(default=0.3, metadata={"help": "share of FanOutQA top-level questions in dev"})
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    dense_types: list[str] = field(default_factory=lambda: ["flat", "hnsw"], metadata={"help": "dense index types to build"})
    dense: DenseParams = field(default_factory=DenseParams)
    with_bm25: bool = field(default=True, metadata={"help": "also build and evaluate BM25"})
    bm25: BM25Params = field(default_factory=BM25Params)
    ks: list[int] = field(default_factory=lambda: [1, 5, 20], metadata={"help": "Recall@k cut-offs"})
    mrr_k: int = field(default=10, metadata={"help": "MRR cut-off"})
    ndcg_k: int = field(default=10, metadata={"help": "nDCG cut-off"})


def encoder_short_name(model: str) -> str:
    return "minilm" if model == "default" else Path(model.rstrip("/")).name


def run_demo(config: DemoConfig) -> dict:
    work = Path(config.workdir)
    data = work / "data"
    summary = prepare_defaults(PrepareConfig(out=str(data), dev_fraction=config.dev_fraction))
    print(f"prepared {summary['corpus_passages']} passages; leaf questions with their evidence page in the corpus: "
          f"{sum(summary['leaf_questions_with_evidence_in_corpus'].values())} "
          f"(dev {summary['leaf_questions_with_evidence_in_corpus']['dev']}); the others stay out of retrieval evaluation")
    builds = [
        IndexBuildConfig(corpus=str(data / "corpus.jsonl"), out=str(work / "index" / f"{encoder_short_name(config.encoder.model)}-{kind}"),
                         backend="dense", encoder=config.encoder,
                         dense=dataclasses.replace(config.dense, type=kind, keep_embeddings=True,
                                                   embeddings_dir=str(work / "embeddings")))
        for kind in config.dense_types
    ]
    if config.with_bm25:
        builds.append(IndexBuildConfig(corpus=str(data / "corpus.jsonl"), out=str(work / "index" / "bm25"),
                                       backend="bm25", bm25=config.bm25))
    questions = load_judged_questions(str(data / "fanoutqa_leaf_dev.jsonl"))
    reports = {}
    for build in builds:
        manifest = build_index(build)
        index = open_index(build.out)
        report = evaluate_retrieval(index, questions, config.ks, config.mrr_k, config.ndcg_k)
        report["build_seconds"] = manifest.build_seconds
        reports[Path(build.out).name] = report
    write_json(work / "retrieval_eval.json", {name: {k: v for k, v in r.items() if k != "per_question"}
                                              for name, r in reports.items()})
    table = render_table({name: r["metrics"] for name, r in reports.items()})
    (work / "retrieval_eval.md").write_text(table + "\n")
    plot_metrics({name: r["metrics"] for name, r in reports.items()}, work / "retrieval_eval.png",
                 title=f"FanOutQA leaf dev questions ({next(iter(reports.values()))['questions_evaluated']}), default corpus")
    print(f"\nretrieval on {next(iter(reports.values()))['questions_evaluated']} FanOutQA leaf dev questions:\n")
    print(table)
    print(f"\nwrote {work / 'retrieval_eval.json'}, {work / 'retrieval_eval.md'}, {work / 'retrieval_eval.png'}")
    return reports
