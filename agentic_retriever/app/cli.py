"""`agentic-retriever GROUP VERB`: one entry point, thin wiring over library functions.

The commands, their config sections and settings classes are listed once, in `agentic_retriever.app.commands`
(and in docs/cli.md). Every command takes ``--config FILE`` (it reads the section named after the command and
the shared ``workdir``, ``retrieval`` and ``agent`` settings), ``--workdir DIR``, and one flag per setting;
``agentic-retriever GROUP VERB --help`` lists them. The spellings of the previous release (``search``,
``serve``, ``mine``, ``mine-merge``, ``agent eval``, ``data prepare-defaults``) still work, with a
deprecation message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Callable

from .commands import COMMANDS, DEPRECATED_COMMANDS, Command
from .config_loader import (add_dataclass_arguments, build_config, has_section, load_config_file, moved_flags,
                            renamed_flags)


def _settings(command: Command, args: argparse.Namespace):
    return build_config(command.config_class(), command.section, args, args.config)


def _print_report(report: dict, out: str) -> None:
    from agentic_retriever.base.jsonl import write_json

    print(json.dumps(report, indent=2, default=str))
    if out:
        write_json(out, report)
        print(f"wrote {out}")


def _data_prepare(config) -> None:
    from agentic_retriever.base.data.prepare import prepare_defaults

    summary = prepare_defaults(config)
    print(json.dumps(summary, indent=2))
    print(f"leaf questions with their evidence page in the corpus: "
          f"{sum(summary['leaf_questions_with_evidence_in_corpus'].values())} of {sum(summary['leaf_questions'].values())} "
          f"(the others are skipped by retrieval evaluation); files in {config.out}")


def _data_qa(config) -> None:
    from agentic_retriever.base.data.qa_set import write_qa_set

    per_dataset = write_qa_set(config)
    print(", ".join(f"{name}: {count}" for name, count in per_dataset.items()))
    print(f"wrote {sum(per_dataset.values())} QA rows to {config.out}")


def _index_build(config) -> None:
    from agentic_retriever.index import build_index

    print(json.dumps(dataclasses.asdict(build_index(config)), indent=2))


def _open_index(retrieval, command: str, **overrides):
    from agentic_retriever.index import open_index

    if retrieval.url:
        raise ValueError(f"{command} opens the index in this process: give its folder (--index DIR), not a URL")
    if not retrieval.index:
        raise ValueError(f"{command}: give the index folder (--index DIR, or retrieval.index in the config file)")
    return open_index(retrieval.index, **overrides)


def _index_search(config) -> None:
    from agentic_retriever.retrieval import open_client

    hits = open_client(config.retrieval).retrieve(config.queries, config.k, config.questions or None)
    for query, passages in zip(config.queries, hits):
        if config.json:
            print(json.dumps({"query": query, "hits": [dataclasses.asdict(p) for p in passages]}, ensure_ascii=False))
            continue
        print(f"# {query}")
        for rank, p in enumerate(passages, start=1):
            print(f"{rank:>3}. [{p.score:.4f}] ({p.id}) {p.title}: {p.text[:160]}")


def _index_serve(config) -> None:
    from agentic_retriever.server import serve
    from agentic_retriever.server.gate import check_exposure, resolve_api_key

    check_exposure(config.host, resolve_api_key(config.api_key), config.unauthenticated_network)  # before the load
    index_gpu = config.gpu if config.gpu != "auto" else None
    index = _open_index(config.retrieval, "index serve", gpu=index_gpu, query_precision=config.query_precision)
    serve(index, index_gpu=index_gpu, host=config.host, port=config.port, batching=config.batching,
          max_batch_queries=config.max_batch_queries, max_wait_ms=config.max_wait_ms,
          max_queries_per_request=config.max_queries_per_request, max_query_chars=config.max_query_chars,
          request_timeout_s=config.request_timeout_s, admin_token=config.admin_token or None,
          max_request_bytes=config.max_request_bytes, max_batch_ms=config.max_batch_ms, access_log=config.access_log,
          max_passages_per_request=config.max_passages_per_request, api_key=config.api_key or None,
          unauthenticated_network=config.unauthenticated_network, index_roots=config.index_roots or None,
          query_precision=config.query_precision)


def _index_swap(config) -> None:
    import os

    from agentic_retriever.server import ADMIN_TOKEN_ENV, swap_index

    token = config.token or os.environ.get(ADMIN_TOKEN_ENV, "")
    if not token:
        raise ValueError(f"index swap: give the service's admin token (--token, or ${ADMIN_TOKEN_ENV})")
    answer = swap_index(config.url, config.index, token, config.timeout_s)
    new = answer.get("new", {})
    print(f"{config.url} now serves {new.get('index_dir') or config.index} (generation {answer.get('generation')}, "
          f"{new.get('index_size')} passages, loaded in {answer.get('load_s', 0):.1f} s)")


def _eval_retrieval(config) -> None:
    from agentic_retriever.eval.job import run_retrieval_eval

    run_retrieval_eval(config, lambda: _open_index(config.retrieval, "eval retrieval"))


def _eval_agent(config) -> None:
    from agent.evaluate import evaluate_agent

    _print_report(evaluate_agent(config), config.out)


def _eval_suite(config) -> None:
    from agent.evaluation_suite import run_suite, suite_table

    print(suite_table(run_suite(config)), end="")
    print(f"wrote suite.md, suite.json and trajectories.jsonl to {config.out}")


def _agent_sft(config) -> None:
    from agent.sft import warm_start_agent

    print(f"warm-started agent: {warm_start_agent(config)}")


def _agent_rollout(config) -> None:
    from agent.rollouts import run_rollout_job

    print(json.dumps(dataclasses.asdict(run_rollout_job(config)), indent=2))


def _agent_import(config) -> None:
    from agent.trajectory_import import import_summary, import_trajectories

    stats = import_trajectories(config)
    print(import_summary(stats))
    print(f"wrote {config.out} and {config.out}.import.json")


def _agent_train(config) -> None:
    from agent.rl import run_rl_job

    print(f"trained agent: {run_rl_job(config)}")


def _mine_run(config) -> None:
    from agentic_retriever.mining.job import plan_mine_job, run_mine_job
    from agentic_retriever.mining.plan import plan_table

    if config.plan.only:
        print(plan_table(plan_mine_job(config)), end="")
        return

    result = run_mine_job(config)
    print(json.dumps(result.stats, indent=2, default=str))
    print(f"wrote {result.rows_path} and {result.stats_path}")


def _mine_merge(config) -> None:
    from agentic_retriever.mining import merge_shards

    result = merge_shards(config.out, config.shards)
    print(f"wrote {result.rows_path} and {result.stats_path}")


def _mine_audit(config) -> None:
    from agentic_retriever.eval.mining_audit import audit_mining, render_markdown

    report = audit_mining(config.run, config.qa, config.out or None)
    print(render_markdown(report))
    print(f"wrote audit.json, audit.md and audit.png to {config.out or config.run}")


def _retriever_init(config) -> None:
    from agentic_retriever.base.decoder_embedder import build_decoder_embedder

    out = build_decoder_embedder(config)
    print(f"wrote the decoder embedder {out} (SentenceTransformer({str(out)!r}) loads it; train it with "
          f"retriever train --encoder.model {out})")


def _retriever_train(config) -> None:
    from agentic_retriever.training.trainer import train_retriever

    out = train_retriever(config)
    print(f"wrote the trained retriever to {out} (sentence-transformers folder; model card in {out / 'README.md'})")


def _retriever_export(config) -> None:
    from agentic_retriever.training.export import export_checkpoint

    out = export_checkpoint(config)
    print(f"wrote the drop-in encoder folder {out} (SentenceTransformer({str(out)!r}) loads it)")


def _demo(config, args: argparse.Namespace) -> None:
    from .commands import command
    from .demo import MainJob, run_demo

    def step(section: str):
        """A step's settings from its section of the same config file; None when the file has no such section."""
        if not has_section(args.config, section):
            return None
        return build_config(command(section).config_class(), section, argparse.Namespace(workdir=args.workdir),
                            args.config)

    run_demo(MainJob(config, step("agent_sft"), step("agent_rollout"), step("mine_run"), step("retriever_train")))


def _loop(config, args: argparse.Namespace) -> None:
    from .commands import command
    from .loop import LoopJob, LoopManifest, run_loop, status_table

    if getattr(args, "_status_dir", None):
        print(status_table(LoopManifest.load(args._status_dir)))
        return

    def step(section: str, optional: bool = False, set_by_loop: tuple[str, ...] = ()):
        """A step's settings from its section of the same config file (defaults when it has none); None for an
        optional step the file leaves out."""
        if optional and not has_section(args.config, section):
            return None
        return build_config(command(section).config_class(), section, argparse.Namespace(workdir=args.workdir),
                            args.config, set_by_caller=set_by_loop)

    job = LoopJob(config, agent_train=step("agent_train"), rollout=step("agent_rollout", set_by_loop=("qa",)),
                  mine=step("mine_run"), train=step("retriever_train"), index=step("index_build", set_by_loop=("out",)),
                  warm_start=step("agent_sft", True),
                  prepare=step("data_prepare", True), config_file=args.config or "")
    if "algorithm" not in ((load_config_file(args.config) if args.config else {}).get("agent_train") or {}):
        job.agent_train.algorithm = "ppo"   # the loop's agent is trained with PPO, as the paper's, unless the file says
    if getattr(args, "_loop_verb", None) == "plan":
        from .loop.plan import plan_loop, plan_table

        overrides = {}
        for given in args._throughputs:
            key, sep, value = given.partition("=")
            if not sep:
                raise ValueError(f"--throughput {given!r}: write KEY=VALUE")
            overrides[key] = float(value)
        print(plan_table(plan_loop(job, args._gpus, args._gpu_type, args._gpus_per_node, args._questions,
                                   args._corpus_passages, overrides)), end="")
        return
    run_loop(job, args._from_iteration, args._from_step)


#: What each command does with its settings, by section.
HANDLERS: dict[str, Callable] = {
    "data_prepare": _data_prepare, "data_qa": _data_qa, "index_build": _index_build, "index_search": _index_search,
    "index_serve": _index_serve, "index_swap": _index_swap, "eval_retrieval": _eval_retrieval, "eval_agent": _eval_agent, "eval_suite": _eval_suite,
    "agent_sft": _agent_sft, "agent_rollout": _agent_rollout, "agent_import": _agent_import, "agent_train": _agent_train, "mine_run": _mine_run,
    "mine_merge": _mine_merge, "mine_audit": _mine_audit, "retriever_train": _retriever_train,
    "retriever_init": _retriever_init, "retriever_export": _retriever_export, "demo": _demo, "loop": _loop,
}


def _add(subparsers, command: Command) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(command.verb, help=command.help,
                                   description=f"{command.help} (config section: {command.section})")
    parser.add_argument("--config", default=None,
                        help=f"YAML config file; its '{command.section}' section and the shared workdir, retrieval "
                             "and agent settings are read")
    parser.add_argument("--workdir", default=None, help="run folder that default paths derive from "
                                                        "(default: the config file's workdir, else runs/quickstart)")
    add_dataclass_arguments(parser, command.config_class())
    parser.set_defaults(command_spec=command)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentic-retriever", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    top = parser.add_subparsers(dest="command", required=True, metavar="GROUP")
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in COMMANDS:
        if not command.group:
            sub = _add(top, command)
            if command.section == "loop":
                _add_loop_options(sub)
            continue
        if command.group not in groups:
            verbs = [c.verb for c in COMMANDS if c.group == command.group]
            groups[command.group] = top.add_parser(
                command.group, help=" | ".join(verbs)).add_subparsers(dest="verb", required=True, metavar="VERB")
        sub = _add(groups[command.group], command)
        if command.section == "mine_audit":
            sub.add_argument("run", nargs="?", default=argparse.SUPPRESS, metavar="RUN", help="mining run folder")
    return parser


def _add_loop_options(parser: argparse.ArgumentParser) -> None:
    """`loop`'s own options (how to run it, not settings) and its `loop status DIR` form."""
    from .loop import STEPS

    parser.add_argument("--from-iteration", dest="_from_iteration", type=int, default=None, metavar="I",
                        help="force a redo from this iteration's --from-step onwards (new artifact folders)")
    parser.add_argument("--from-step", dest="_from_step", choices=STEPS, default=None,
                        help="the step of --from-iteration to redo from")
    verbs = parser.add_subparsers(dest="_loop_verb", metavar="{status DIR, plan}")
    verbs.add_parser("status", help="print a loop folder's record (loop.json) as a table").add_argument(
        "_status_dir", metavar="DIR", help="the loop folder (loop.out, e.g. runs/quickstart/loop)")
    plan = verbs.add_parser("plan", help="print the hours and GPU-hours of each step of an iteration, before a run "
                                         "(docs/loop.md, \"The plan of an iteration\")")
    plan.add_argument("--gpus", dest="_gpus", type=int, required=True, help="GPUs of the cluster")
    plan.add_argument("--gpu-type", dest="_gpu_type", default="H100", help="the GPUs' type (throughputs: A100, H100)")
    plan.add_argument("--gpus-per-node", dest="_gpus_per_node", type=int, default=8,
                      help="GPUs a node (retriever training and encoding run on the loop's node)")
    plan.add_argument("--questions", dest="_questions", type=int, default=0,
                      help="mining questions, when loop.mining_qa is not here yet")
    plan.add_argument("--corpus-passages", dest="_corpus_passages", type=int, default=0,
                      help="passages of the corpus, when index_build.corpus is not here yet")
    plan.add_argument("--throughput", dest="_throughputs", action="append", default=[], metavar="KEY=VALUE",
                      help="replace a per-GPU throughput of the table (repeatable)")


def _deprecated(old: str, new: str) -> None:
    print(f"note: '{old}' is deprecated; use '{new}'", file=sys.stderr)


def modernize(argv: list[str]) -> list[str]:
    """`argv` with a command or flag of the previous release replaced by its new spelling (and a deprecation
    message): ``mine --trajectories T`` -> ``mine run --trajectories T``; ``agent rollout --llm.model M`` ->
    ``agent rollout --agent.model M``."""
    for old, new in DEPRECATED_COMMANDS.items():
        rest = argv[len(old):]
        if tuple(argv[:len(old)]) != old or (old == ("mine",) and rest and not rest[0].startswith("-")):
            continue  # (`mine run|merge|audit ...` is already the new spelling)
        _deprecated(f"agentic-retriever {' '.join(old)}", f"agentic-retriever {' '.join(new)}")
        argv = [*new, *rest]
        break
    spec = next((c for c in COMMANDS if argv[:len(c.name.split())] == c.name.split()), None)
    if spec is None:
        return argv
    renamed, moved = renamed_flags(spec.config_class()), moved_flags(spec.config_class())
    modern = []
    for token in argv:
        flag, sep, value = token.partition("=")
        if flag in moved:
            raise SystemExit(f"agentic-retriever {spec.name}: {flag} is no longer set here: {moved[flag]}")
        head, dot, tail = flag.partition(".")
        new = renamed.get(flag) or (renamed[head] + dot + tail if dot and head in renamed else None)
        if flag.startswith("--") and new:
            _deprecated(flag, new)
            token = new + sep + value
        modern.append(token)
    return modern


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)
    from agentic_retriever.base.client import RetrievalServiceError
    from .loop.processes import LoopSignal

    args = build_parser().parse_args(modernize(list(sys.argv[1:] if argv is None else argv)))
    command: Command = args.command_spec
    try:
        config = _settings(command, args)
        handler = HANDLERS[command.section]
        handler(config, args) if command.section in ("demo", "loop") else handler(config)
    except (ValueError, OSError, KeyError, RetrievalServiceError) as error:  # bad input, missing or refused files,
        # network failures, a service's refusal
        print(f"error: {error}", file=sys.stderr)
        return 2
    except LoopSignal as stopped:  # the loop stopped every process it started; exit as the signal would have
        print(f"{command.name}: {stopped}; every process it started was stopped", file=sys.stderr)
        return stopped.exit_status
    return 0


if __name__ == "__main__":
    sys.exit(main())
