"""`agentic-retriever`: one entry point, thin wiring over library functions.

Every command takes ``--config FILE`` (it reads the section named in brackets below) and flags that
override single fields. Run ``agentic-retriever COMMAND --help`` for the fields.

    data prepare-defaults   [prepare]          embedded corpus + FanOutQA QA splits
    index build             [index]            dense (FAISS) or BM25 index, resumable
    search                  [search]           query an index from the shell
    serve                   [serve]            Search-R1-compatible HTTP retrieval service
    eval retrieval          [eval_retrieval]   Recall@k / MRR / nDCG on a QA file
    agent sft               [agent_sft]        warm-start the search agent on synthesised trajectories
    agent rollout           [agent_rollout]    run the agent over a QA file into a trajectory file
    agent eval              [agent_eval]       EM / F1 / contains-EM / searches / evidence recall of trajectories
    agent train             [agent_train]      RL of the agent (PPO or GRPO/DAPO) against a fixed retriever
    mine                    [mine]             utility mining: trajectories -> Agentic-R retriever training rows
    mine audit RUN --qa F   [mine_audit]       where the evidence went in a mining run (reads evidence labels)
    mine-merge              [mine_merge]       join the outputs of mining shards
    retriever train         [train_retriever]  contrastive training on mined rows -> sentence-transformers folder
    demo                    [demo]             the main job on the embedded default stack
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Literal

from .config import add_dataclass_arguments, build_config
from .llm.loader import LLMConfig
from .mining.pipeline import MiningConfig


@dataclass
class SearchConfig:
    index: str = field(default="", metadata={"help": "index folder"})
    queries: list[str] = field(default_factory=list, metadata={"help": "queries to search"})
    questions: list[str] = field(default_factory=list, metadata={"help": "original questions, parallel to the queries"})
    k: int = field(default=3, metadata={"help": "passages per query"})
    json: bool = field(default=False, metadata={"help": "print JSON lines instead of text"})


@dataclass
class ServeConfig:
    index: str = field(default="", metadata={"help": "index folder"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on"})
    port: int = field(default=8000, metadata={"help": "port to listen on"})
    batching: bool = field(default=True, metadata={"help": "gather concurrent requests into one search"})
    max_batch_queries: int = field(default=256, metadata={"help": "most queries gathered into one search"})
    max_wait_ms: float = field(default=5.0, metadata={"help": "longest wait for more requests before searching"})
    gpu: Literal["auto", "on", "off"] = field(default="auto", metadata={"help": "FAISS on GPUs (dense indexes)"})


def _prepare(args) -> None:
    from .data.prepare import PrepareConfig, prepare_defaults

    config = build_config(PrepareConfig, "prepare", args, args.config)
    summary = prepare_defaults(config)
    print(json.dumps(summary, indent=2))
    print(f"leaf questions with their evidence page in the corpus: "
          f"{sum(summary['leaf_questions_with_evidence_in_corpus'].values())} of {sum(summary['leaf_questions'].values())} "
          f"(the others are skipped by retrieval evaluation); files in {config.out}")


def _index_build(args) -> None:
    from .index import IndexBuildConfig, build_index

    manifest = build_index(build_config(IndexBuildConfig, "index", args, args.config))
    print(json.dumps(dataclasses.asdict(manifest), indent=2))


def _open(index_dir: str, **overrides):
    from .index import open_index

    if not index_dir:
        raise SystemExit("error: --index is required")
    return open_index(index_dir, **overrides)


def _search(args) -> None:
    config = build_config(SearchConfig, "search", args, args.config)
    if not config.queries:
        raise SystemExit("error: give at least one query (--queries 'who wrote hamlet')")
    hits = _open(config.index).retrieve(config.queries, config.k, config.questions or None)
    for query, passages in zip(config.queries, hits):
        if config.json:
            print(json.dumps({"query": query, "hits": [dataclasses.asdict(p) for p in passages]}, ensure_ascii=False))
            continue
        print(f"# {query}")
        for rank, p in enumerate(passages, start=1):
            print(f"{rank:>3}. [{p.score:.4f}] ({p.id}) {p.title}: {p.text[:160]}")


def _serve(args) -> None:
    from .server import serve

    config = build_config(ServeConfig, "serve", args, args.config)
    index = _open(config.index, **({"gpu": config.gpu} if config.gpu != "auto" else {}))
    serve(index, host=config.host, port=config.port, batching=config.batching,
          max_batch_queries=config.max_batch_queries, max_wait_ms=config.max_wait_ms)


def _eval_retrieval(args) -> None:
    from .eval.bootstrap import compare_reports
    from .eval.report import render_table
    from .eval.retrieval import (
        RetrievalEvalConfig,
        composition_questions,
        evaluate_retrieval,
        load_judged_questions,
    )
    from .jsonl import read_json, write_json

    config = build_config(RetrievalEvalConfig, "eval_retrieval", args, args.config)
    if not config.qa:
        raise SystemExit("error: --qa is required")
    baseline = read_json(config.compare_to) if config.compare_to else None
    index = _open(config.index)
    questions = load_judged_questions(config.qa, config.relevance)
    composed = composition_questions(questions, config.compose_with, config.parent_qa)
    if config.compose_with != "none" and index.composition == "query":
        print(f"note: the index does not compose queries; --compose-with {config.compose_with} changes nothing")
    report = evaluate_retrieval(index, questions, config.ks, config.mrr_k, config.ndcg_k, config.batch_size, composed)
    report |= {"index": config.index, "qa": config.qa, "compose_with": config.compose_with}
    print(render_table({config.index: report["metrics"]}))
    print(f"{report['questions_evaluated']} questions evaluated, "
          f"{report['questions_skipped_no_relevant_in_corpus']} skipped (no relevant passage in the corpus); "
          f"answer recall over the {report['questions_with_answers']} with golden answers")
    if baseline is not None:
        report["comparison"] = {"to": config.compare_to, "results": compare_reports(baseline, report)}
        print(f"difference to {config.compare_to} (this minus that, paired bootstrap, 95% CI):")
        for metric, r in report["comparison"]["results"].items():
            print(f"  {metric}: {r['mean_a']:.3f} -> {r['mean_b']:.3f}  diff {r['diff']:+.3f} "
                  f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]  p={r['p_value']:.4f}  n={r['n']}")
    if config.out:
        write_json(config.out, report)
        print(f"wrote {config.out}")


@dataclass
class AgentEvalConfig:
    trajectories: str = field(default="", metadata={"help": "trajectory file written by agent rollout"})
    qa: str = field(default="", metadata={"help": "QA rows with supporting_titles, for evidence recall (optional)"})
    out: str = field(default="", metadata={"help": "write the report as JSON here (optional)"})


def _agent_sft(args) -> None:
    from agent.warm_start import WarmStartConfig, warm_start_agent

    path = warm_start_agent(build_config(WarmStartConfig, "agent_sft", args, args.config))
    print(f"warm-started agent: {path}")


def _agent_rollout(args) -> None:
    from agent.rollouts import RolloutConfig, run_rollout_job

    config = build_config(RolloutConfig, "agent_rollout", args, args.config)
    if not config.qa or not config.out:
        raise SystemExit("error: --qa and --out are required")
    print(json.dumps(dataclasses.asdict(run_rollout_job(config)), indent=2))


def _agent_train(args) -> None:
    from agent.rl import RLConfig, run_rl_job

    path = run_rl_job(build_config(RLConfig, "agent_train", args, args.config))
    print(f"trained agent: {path}")


def _agent_eval(args) -> None:
    from agent.evaluate import evaluate_trajectories

    from .jsonl import write_json

    config = build_config(AgentEvalConfig, "agent_eval", args, args.config)
    if not config.trajectories:
        raise SystemExit("error: --trajectories is required")
    report = evaluate_trajectories(config.trajectories, config.qa or None)
    print(json.dumps(report, indent=2))
    if config.out:
        write_json(config.out, report)
        print(f"wrote {config.out}")


@dataclass
class MergeCommandConfig:
    out: str = field(default="", metadata={"help": "mining output folder holding the shard folders"})
    shards: int = field(default=1, metadata={"help": "number of shards n"})


def _mine(args) -> None:
    from .mining.job import MineJobConfig, run_mine_job

    config = build_config(MineJobConfig, "mine", args, args.config)
    if not config.trajectories or not config.out:
        raise SystemExit("error: --trajectories and --out are required")
    result = run_mine_job(config)
    print(json.dumps(result.stats, indent=2, default=str))
    print(f"wrote {result.rows_path} and {result.stats_path}")


@dataclass
class MineAuditConfig:
    run: str = field(default="", metadata={"help": "mining run folder holding rounds.jsonl (also the positional RUN)"})
    qa: str = field(default="", metadata={"help": "QA JSONL with supporting_titles: the evidence labels"})
    out: str = field(default="", metadata={"help": "folder for audit.{json,md,png} (default: the run folder)"})


def _mine_audit(args) -> None:
    from .mining.audit import audit_mining, render_markdown

    config = build_config(MineAuditConfig, "mine_audit", args, args.config)
    if not config.run or not config.qa:
        raise SystemExit("error: give the run folder and --qa (agentic-retriever mine audit RUN --qa FILE)")
    report = audit_mining(config.run, config.qa, config.out or None)
    print(render_markdown(report))
    print(f"wrote audit.json, audit.md and audit.png to {config.out or config.run}")


def _mine_merge(args) -> None:
    from .mining import merge_shards

    config = build_config(MergeCommandConfig, "mine_merge", args, args.config)
    if not config.out:
        raise SystemExit("error: --out is required")
    result = merge_shards(config.out, config.shards)
    print(f"wrote {result.rows_path} and {result.stats_path}")


def _retriever_train(args) -> None:
    from .training.config import RetrieverTrainConfig
    from .training.trainer import train_retriever

    out = train_retriever(build_config(RetrieverTrainConfig, "train_retriever", args, args.config))
    print(f"wrote the trained retriever to {out} (sentence-transformers folder; model card in {out / 'README.md'})")


def _demo(args) -> None:
    from agent.rollouts import RolloutConfig
    from agent.warm_start import WarmStartConfig

    from .config import load_yaml_section
    from .demo import DemoConfig, MainJob, run_demo
    from .mining.job import MineJobConfig
    from .training.config import RetrieverTrainConfig

    def section(cls, name: str):
        """A step's settings from its section of the same config file; None when the file has no such section."""
        if not args.config or not load_yaml_section(args.config, name):
            return None
        return build_config(cls, name, argparse.Namespace(), args.config)

    run_demo(MainJob(build_config(DemoConfig, "demo", args, args.config), section(WarmStartConfig, "agent_sft"),
                     section(RolloutConfig, "demo_rollout"), section(MineJobConfig, "mine"),
                     section(RetrieverTrainConfig, "train_retriever")))


def _add(subparsers, name: str, handler, config_cls, help_text: str, section: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help_text, description=f"{help_text} (config section: {section})")
    parser.add_argument("--config", help=f"YAML config file; its '{section}' section is read", default=None)
    add_dataclass_arguments(parser, config_cls)
    parser.set_defaults(handler=handler)
    return parser


def build_parser() -> argparse.ArgumentParser:
    from agent.rl.config import RLConfig
    from agent.rollouts import RolloutConfig
    from agent.warm_start import WarmStartConfig

    from .data.prepare import PrepareConfig
    from .demo import DemoConfig
    from .eval.retrieval import RetrievalEvalConfig
    from .index import IndexBuildConfig
    from .mining.job import MineJobConfig
    from .training.config import RetrieverTrainConfig

    parser = argparse.ArgumentParser(prog="agentic-retriever", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    data = commands.add_parser("data", help="prepare data").add_subparsers(dest="subcommand", required=True)
    _add(data, "prepare-defaults", _prepare, PrepareConfig, "write the embedded default corpus and FanOutQA splits", "prepare")
    index = commands.add_parser("index", help="build indexes").add_subparsers(dest="subcommand", required=True)
    _add(index, "build", _index_build, IndexBuildConfig, "build a dense or BM25 index (resumes an interrupted build)", "index")
    _add(commands, "search", _search, SearchConfig, "search an index from the shell", "search")
    _add(commands, "serve", _serve, ServeConfig, "serve an index over HTTP (Search-R1 /retrieve API)", "serve")
    evaluate = commands.add_parser("eval", help="evaluate").add_subparsers(dest="subcommand", required=True)
    _add(evaluate, "retrieval", _eval_retrieval, RetrievalEvalConfig, "Recall@k, MRR@k, nDCG@k of an index on a QA file", "eval_retrieval")
    agent = commands.add_parser("agent", help="the search agent").add_subparsers(dest="subcommand", required=True)
    _add(agent, "sft", _agent_sft, WarmStartConfig, "warm-start the agent on synthesised search trajectories", "agent_sft")
    _add(agent, "rollout", _agent_rollout, RolloutConfig, "run the agent over a QA file into trajectories", "agent_rollout")
    _add(agent, "eval", _agent_eval, AgentEvalConfig, "EM, F1, contains-EM, searches and evidence recall", "agent_eval")
    _add(agent, "train", _agent_train, RLConfig, "RL of the agent (PPO or GRPO/DAPO) against a fixed retriever",
         "agent_train")
    mine = _add(commands, "mine", _mine, MineJobConfig, "mine retriever training rows from agent trajectories", "mine")
    # `mine --...` mines; `mine audit RUN --qa FILE` audits a run (an optional sub-command of the same parser)
    mine_commands = mine.add_subparsers(dest="subcommand", required=False, metavar="{audit}")
    audit = _add(mine_commands, "audit", _mine_audit, MineAuditConfig,
                 "audit a mining run against evidence labels: audit.{json,md,png}", "mine_audit")
    audit.add_argument("run", nargs="?", default=argparse.SUPPRESS, metavar="RUN", help="mining run folder")
    _add(commands, "mine-merge", _mine_merge, MergeCommandConfig, "join the outputs of mining shards", "mine_merge")
    retriever = commands.add_parser("retriever", help="the retriever").add_subparsers(dest="subcommand", required=True)
    _add(retriever, "train", _retriever_train, RetrieverTrainConfig,
         "contrastive training on mined rows -> a sentence-transformers folder (torchrun for several devices)",
         "train_retriever")
    _add(commands, "demo", _demo, DemoConfig, "run the main job on the embedded default stack", "demo")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except (ValueError, FileNotFoundError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
