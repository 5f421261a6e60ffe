"""The six steps of one iteration of Algorithm 1 ("Agentic-R: Learning to Retrieve for Agentic Search", arXiv
2601.11888, section 4.2), each a call of the library function its command runs, with what the loop chains set:

1. `train_agent`: RL of Agent_i (PPO by default, as the paper) against the service, which serves Agentic-R_{i-1};
2. `roll_out`: Agent_i on the training questions Q, searching with Agentic-R_{i-1};
3. `mine_rows`: candidates from Agentic-R_{i-1}, local relevance from the scorer, answer correctness from Agent_i's
   continuations (section 4.1.1);
4. `train_retriever_step`: Agentic-R_i (section 4.1.2) from the base encoder or from Agentic-R_{i-1};
5. `build_index_step`: the corpus re-encoded with Agentic-R_i (the runner then swaps the service onto it);
6. `evaluate_iteration`: the iteration's row of the report (reads dev evidence labels; never training data).

Each returns the summary the manifest keeps and the report reads. Every one resumes inside its folder when run
again after a kill (the functions it calls resume), so the runner simply calls it again. Steps 2 to 5 are also the
demo's iteration (`agentic_retriever.app.demo`): the loop hands them its service, the demo its base index.

`ITERATION` is the one table of these steps, in order: each `IterationStep` names the step, says what its result
depends on (the parts of its manifest key) and runs it on an `Iteration` (the job, the service and the records of
the steps done before it). The runner runs the table, `STEPS` (its names) orders the manifest, the report's
columns, `loop plan`'s rows (`plan.PRICES`, by name) and ``--from-step``. A new step is a function here and a
row of the table; pricing it in ``loop plan`` is an entry of `plan.PRICES` (docs/architecture.md, "Where does my
change go").
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.jsonl import iter_jsonl, read_json
from agentic_retriever.base.qa_sources import qa_set_sha256
from agentic_retriever.base.sessions import command_words
from .config import LoopJob
from .manifest import StepRecord
from .placement import run_shards, shard_count
from .processes import concatenate, write_section

if TYPE_CHECKING:
    from .service import LoopService

__all__ = ["ITERATION", "STEPS", "Iteration", "IterationStep", "build_index_step", "changed_settings",
           "evaluate_iteration", "mine_rows", "roll_out", "train_agent", "train_retriever_step"]

log = logging.getLogger(__name__)

#: The mining statistics the report shows.
MINING_STATS = ("rounds", "rows", "gac", "local_relevance", "lr_scorer", "gac_mode")


def with_model(llm_config, model: str):
    return dataclasses.replace(llm_config, model=str(model))


def reward_curve(metrics_file: Path) -> list[float]:
    """Mean reward of every RL step in the trainer's ``metrics.jsonl``."""
    if not metrics_file.is_file():
        return []
    return [round(float(row["reward"]), 4) for _, row in iter_jsonl(metrics_file) if "reward" in row]


def train_agent(job: LoopJob, init_model: str, service_url: str, out: Path) -> dict[str, Any]:
    """Step 1 on the embedded trainer: `agent train` from `init_model` against the service; the policy folder."""
    from agent.rl import run_rl_job

    config = dataclasses.replace(job.agent_train, agent=with_model(job.agent_train.agent, init_model),
                                 retrieval=RetrievalConfig(url=service_url), out=str(out))
    policy = run_rl_job(config)
    return {"model": str(policy), "trainer": "embedded", "algorithm": config.algorithm, "steps": config.steps,
            "rewards": reward_curve(out / "metrics.jsonl")}


def train_agent_on_verl(job: LoopJob, init_model: str, service_url: str, out: Path) -> dict[str, Any]:
    """Step 1 on verl (`agent.rl.verl.run_verl_job`; docs/verl.md). With ``verl.stand_in`` the run is written and
    validated by verl itself, and the embedded trainer trains the step in its place (a dry run of a cluster config)."""
    from agent.rl.verl import run_verl_job

    return run_verl_job(job.loop.verl, job.agent_train, init_model, service_url, out,
                        stand_in=lambda folder: train_agent(job, init_model, service_url, folder))


def roll_out(job: LoopJob, agent_model: str, retrieval: RetrievalConfig, out: Path) -> dict[str, Any]:
    """Step 2: Agent_i on the mining questions (``loop.mining_qa``, all of them), searching with `retrieval`
    (Agentic-R_{i-1}: the loop's service, or an index folder)."""
    config = dataclasses.replace(job.rollout, qa=job.loop.mining_qa, out=str(out / "trajectories.jsonl"),
                                 retrieval=retrieval, limit=None, agent=with_model(job.rollout.agent, agent_model))
    questions, processes = _run_rollouts(job, config, out, "rollout")
    return {"trajectories": config.out, "questions": questions} | ({"processes": processes} if processes else {})


def _run_rollouts(job: LoopJob, config, folder: Path, label: str) -> tuple[int, int]:
    """`agent rollout` with `config` in this process, or as ``--shard i/n`` processes (one per entry of
    ``loop.rollout_devices``, or placed by Ray: `placement`), each searching the service of ``config.retrieval.url``,
    joined into ``config.out`` in question order; the number of questions and of processes (0: this one)."""
    from agent.rollouts import run_rollout_job
    from agentic_retriever.base.qa_sources import read_qa_rows

    n = shard_count(job.loop, "rollout", folder, label)
    if not n:
        return run_rollout_job(config).questions, 0
    if not config.retrieval.url:
        raise ValueError("rollout shards search a retrieval service (each opening the index "
                         f"{config.retrieval.index} would hold its own copy); give the step a service URL")
    parts = [folder / "shards" / f"{label}.{i}-of-{n}.jsonl" for i in range(n)]
    settings = write_section(folder / f"{label}.agent_rollout.yaml", "agent_rollout", config)
    run_shards(job.loop, "rollout", [_cli("agent", "rollout", "--config", settings, "--shard", f"{i}/{n}", "--out",
                                          parts[i]) for i in range(n)], range(n), folder / "logs", label)
    concatenate(parts, Path(config.out))
    return len(read_qa_rows(config.qa)[: config.limit]), n


def _cli(*args: Any) -> list[str]:
    """This interpreter running one of the library's commands."""
    return [sys.executable, "-m", "agentic_retriever.app.cli", *map(str, args)]


def mine_rows(job: LoopJob, trajectories: str, agent_model: str, retrieval: RetrievalConfig, out: Path,
              reach: Callable[[str], str] | None = None) -> dict[str, Any]:
    """Step 3: utility mining of Agent_i's trajectories; candidates and later GAC turns from `retrieval` (the
    loop's service, or an index folder). In this process, or as `mine run --shard i/n` processes (one per entry of
    ``loop.mining_devices``, or placed by Ray: `placement`), each with its own agent engine, all searching the one
    service, merged into `out` as `mine merge` does; a finished shard is kept. `reach` (the runner's
    `StepServers.reachable`) points the scorer's URL at the node a step server runs on."""
    from agentic_retriever.mining.job import run_mine_job
    from agentic_retriever.mining.outputs import ROWS_FILE, STATS_FILE
    from agentic_retriever.mining.shards import merge_shards, shard_dir

    scorer = job.mine.scorer
    if reach is not None and scorer.base_url:  # a scorer server Ray placed on another node
        scorer = dataclasses.replace(scorer, base_url=reach(scorer.base_url))
    config = dataclasses.replace(job.mine, trajectories=trajectories, out=str(out), scorer=scorer,
                                 retrieval=retrieval, agent=with_model(job.mine.agent, agent_model))
    n = shard_count(job.loop, "mining", out)
    if not n:
        result = run_mine_job(config)
    else:
        settings = write_section(out / "mine_run.yaml", "mine_run", config)
        todo = [i for i in range(n) if not all((shard_dir(out, (i, n)) / name).is_file()
                                               for name in (ROWS_FILE, STATS_FILE))]
        if len(todo) < n:
            print(f"mining: {n - len(todo)} of {n} shards finished earlier", flush=True)
        run_shards(job.loop, "mining", [_cli("mine", "run", "--config", settings, "--shard", f"{i}/{n}")
                                        for i in todo], todo, out / "logs", "mining")
        result = merge_shards(out, n, plot=config.mining.plot)
    if not result.rows:
        raise RuntimeError(f"mining produced no training row (see {result.stats_path}); the retriever cannot be "
                           "trained. Mine more questions or relax mine_run.mining.selection (docs/mining.md), then "
                           "run again: it continues at this step")
    return {"rows_path": str(result.rows_path)} | {k: result.stats[k] for k in MINING_STATS if k in result.stats}


def train_retriever_step(job: LoopJob, rows: str, init_encoder: str, out: Path) -> dict[str, Any]:
    """Step 4: contrastive training of Agentic-R_i from `init_encoder` on the mined rows."""
    from agentic_retriever.training.trainer import train_retriever

    config = dataclasses.replace(job.train, data=rows, corpus=job.index.corpus, out=str(out / "model"),
                                 encoder=dataclasses.replace(job.train.encoder, model=str(init_encoder)))
    trained = _launch_retriever_training(job, config) if job.loop.retriever_launcher else train_retriever(config)
    selection = read_json(trained / "train_manifest.json").get("selection") or {}
    return {"model": str(trained), "init": str(init_encoder), "kept": selection.get("kept"), "selection": selection}


def _launch_retriever_training(job: LoopJob, config) -> Path:
    """`retriever train` under the configured launcher (torchrun, deepspeed, or a plain interpreter): the settings
    of the config file's ``retriever_train`` section, with the paths the loop chains given as flags."""
    if not job.config_file:
        raise ValueError("loop.retriever_launcher runs `retriever train --config FILE` in new processes: start the "
                         "loop from a config file (agentic-retriever loop --config FILE)")
    command = [*command_words(job.loop.retriever_launcher), "-m", "agentic_retriever.app.cli", "retriever", "train",
               "--config", job.config_file, "--data", config.data, "--corpus", config.corpus, "--out", config.out,
               "--encoder.model", config.encoder.model]
    print(f"retriever training: {shlex.join(command)}", flush=True)
    finished = subprocess.run(command, check=False)
    if finished.returncode != 0:
        raise RuntimeError(f"retriever training exited with status {finished.returncode}: {shlex.join(command)}")
    return Path(config.out)


def build_index_step(job: LoopJob, encoder_model: str, out: Path) -> dict[str, Any]:
    """Step 5: the corpus encoded with Agentic-R_i into a new index folder (the base index's settings)."""
    from agentic_retriever.index import build_index

    encoder = job.index.encoder.for_model(encoder_model)
    manifest = build_index(dataclasses.replace(job.index, out=str(out), backend="dense", encoder=encoder))
    return {"index": str(out), "passages": manifest.rows, "composition": manifest.composition}


def _judged(path: str):
    """The rows of a dev QA file, judged by their evidence labels when the file carries them (FanOutQA's
    ``supporting_titles``) and by answer recall alone when it does not (FlashRAG's and Search-R1's QA rows)."""
    from agentic_retriever.eval.retrieval import has_evidence_labels, load_judged_questions

    relevance = "auto" if has_evidence_labels(path) else "answers"
    return load_judged_questions(path, relevance), relevance


def _retrieval(job: LoopJob, index_dir: str) -> dict[str, Any]:
    """Leaf-question metrics (composed, when the encoder composes ``Q [SEP] q`` as the agent searches with it, with
    the parent question where a row names one and with its own question otherwise) and multi-hop recall of one
    index: evidence metrics on labelled rows, answer recall on rows without labels."""
    from agentic_retriever.eval.retrieval import composition_questions, evaluate_retrieval
    from agentic_retriever.index import open_index

    settings = job.loop.eval
    index = open_index(index_dir, gpu=job.loop.service.open_gpu)  # placed as the service places its own
    leaf, leaf_by = _judged(settings.leaf_qa)
    composed = (composition_questions(leaf, "parent_or_self", settings.multihop_qa)
                if index.composition != "query" else None)
    leaf_report = evaluate_retrieval(index, leaf, settings.ks, settings.mrr_k, settings.ndcg_k,
                                     search_questions=composed)
    multihop_rows, multihop_by = _judged(settings.multihop_qa)
    multihop = evaluate_retrieval(index, multihop_rows, settings.ks, settings.mrr_k, settings.ndcg_k)
    return {"leaf": leaf_report["metrics"], "leaf_questions": leaf_report["questions_evaluated"],
            "leaf_judged_by": "evidence" if leaf_by == "auto" else "answers",
            "composed_with_parent": composed is not None and any(q.parent_id is not None for q in leaf),
            "multihop": multihop["metrics"], "multihop_questions": multihop["questions_evaluated"],
            "multihop_judged_by": "evidence" if multihop_by == "auto" else "answers"}


def _agent(job: LoopJob, agent_model: str, retrieval: RetrievalConfig, out: Path) -> dict[str, Any]:
    from agent.evaluate import evaluate_trajectories

    config = dataclasses.replace(job.rollout, qa=job.loop.eval.agent_qa, out=str(out), retrieval=retrieval,
                                 limit=job.loop.eval.agent_questions, agent=with_model(job.rollout.agent, agent_model))
    _run_rollouts(job, config, out.parent, out.stem)
    metrics = evaluate_trajectories(out, job.loop.eval.agent_qa)
    return {"em": metrics["em"], "f1": metrics["f1"], "searches": metrics["avg_searches"],
            "questions": metrics["trajectories"], "by_dataset": metrics["by_dataset"]}


def evaluate_iteration(job: LoopJob, previous_index: str, index: str, agent_model: str, out: Path,
                       serve: Callable[[str], str] | None = None) -> dict[str, Any]:
    """Step 6: both retrievers on the dev questions, and Agent_i with each: EM and F1 over all questions and per
    dataset (a row's ``dataset``, else the file's name), as the paper reports (reads dev evidence labels where the
    rows carry them, and golden answers). `serve` (the runner's) moves the loop's service onto an index and returns
    its URL, which the agent then searches (as its rollout processes must); without it the agent opens the index."""
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"retrieval": {"previous": _retrieval(job, previous_index), "new": _retrieval(job, index)}}
    if job.loop.eval.agent_questions:
        def retrieval(index_dir: str) -> RetrievalConfig:
            return RetrievalConfig(url=serve(index_dir)) if serve else RetrievalConfig(index=index_dir)

        report["agent"] = {"previous": _agent(job, agent_model, retrieval(previous_index),
                                              out / "agent_previous_retriever.jsonl"),
                           "new": _agent(job, agent_model, retrieval(index), out / "agent_new_retriever.jsonl")}
    return report


# ------------------------------------------------------------------------------------------------- the table
#: Settings that never change a step's result (left out of its key): display, logging and cache locations.
_NO_EFFECT = ("progress", "report_to", "naive_rag_cache", "corpus_cache")


def changed_settings(config: Any, drop: tuple[str, ...] = ()) -> dict:
    """The settings of `config` that differ from its class's defaults, as a nested dict, without the (dotted)
    fields in `drop` (what the loop sets) and those in `_NO_EFFECT`: what a step's key holds of its section. Only
    non-default values enter a key, so a setting a later release adds with a default does not make a finished loop
    recompute."""
    data = _non_default(config)
    for dotted in (*drop, *_NO_EFFECT):
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node.get(part, {})
        node.pop(leaf, None)
    return data


def _non_default(config: Any, defaults: Any = None) -> dict:
    """The fields of `config` that differ from `defaults` (the class's defaults), nested dataclasses compared
    with the defaults their parent gives them."""
    defaults = type(config)() if defaults is None else defaults
    out = {}
    for f in dataclasses.fields(config):
        value, default = getattr(config, f.name), getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            nested = _non_default(value, default) if type(value) is type(default) else dataclasses.asdict(value)
            if nested:
                out[f.name] = nested
        elif value != default:
            out[f.name] = value
    return out


@dataclass
class Iteration:
    """Iteration `number` as its steps see it: the job, the loop's retrieval service (on Agentic-R_{i-1} while the
    agent trains, rolls out and is mined), `record(iteration, step)` (a finished step's record; raises when it is
    not done), the loop's corpus (its sha256), `reach` (the runner's `StepServers.reachable`) and the records of
    this iteration's steps so far."""

    job: LoopJob
    number: int
    service: LoopService
    record: Callable[[int, str], StepRecord]
    corpus_sha256: str
    reach: Callable[[str], str] | None = None
    done: dict[str, StepRecord] = field(default_factory=dict)

    @property
    def previous_index(self) -> str:
        """Agentic-R_{i-1}'s index folder (the base index in iteration 1)."""
        i = self.number - 1
        return str(Path(self.job.loop.base_index)) if i == 0 else self.record(i, "index").summary["index"]

    @property
    def previous_retriever(self) -> str:
        """Agentic-R_{i-1}'s identity, which keys every step that searches it."""
        i = self.number - 1
        return self.record(0, "base_index").identity if i == 0 else self.record(i, "index").identity

    @property
    def initial_agent(self) -> StepRecord:
        """The agent iteration i starts from: the initial agent, or Agent_{i-1} (``loop.agent_init``)."""
        if self.number == 1 or self.job.loop.agent_init == "initial":
            return self.record(0, "initial_agent")
        return self.record(self.number - 1, "agent")

    @property
    def initial_encoder(self) -> tuple[str, str]:
        """(model, identity) Agentic-R_i trains from: the base encoder, or Agentic-R_{i-1} (``loop.retriever_init``)."""
        if self.number == 1 or self.job.loop.retriever_init == "initial":
            return self.job.train.encoder.model, self.job.train.encoder.model
        previous = self.record(self.number - 1, "retriever")
        return previous.summary["model"], previous.identity

    @property
    def agent_model(self) -> str:
        return self.done["agent"].summary["model"]


@dataclass(frozen=True)
class IterationStep:
    """One row of `ITERATION`: the step's name, `inputs` (what its result depends on: the parts of its manifest
    key, so a change there reruns it and every step after it) and `run` (the step on an artifact folder; returns
    the summary the manifest keeps)."""

    name: str
    inputs: Callable[[Iteration], dict]
    run: Callable[[Iteration, Path], dict]


def _agent_inputs(it: Iteration) -> dict:
    job = it.job
    return {"rl": changed_settings(job.agent_train, ("agent.model", "retrieval", "out")),
            "qa": qa_set_sha256(job.agent_train.qa), "init": it.initial_agent.identity,
            "retriever": it.previous_retriever, "trainer": job.loop.agent_trainer,
            "verl": changed_settings(job.loop.verl) if job.loop.agent_trainer == "verl" else None}


def _agent_run(it: Iteration, out: Path) -> dict:
    train = train_agent if it.job.loop.agent_trainer == "embedded" else train_agent_on_verl
    return train(it.job, it.initial_agent.summary["model"], it.service.url, out)


def _trajectories_inputs(it: Iteration) -> dict:
    return {"rollout": changed_settings(it.job.rollout, ("qa", "out", "retrieval", "agent.model", "limit")),
            "qa": qa_set_sha256(it.job.loop.mining_qa), "agent": it.done["agent"].identity,
            "retriever": it.previous_retriever}


def _trajectories_run(it: Iteration, out: Path) -> dict:
    return roll_out(it.job, it.agent_model, RetrievalConfig(url=it.service.url), out)


def _mining_inputs(it: Iteration) -> dict:
    return {"mine": changed_settings(it.job.mine, ("trajectories", "out", "retrieval", "agent.model")),
            "trajectories": it.done["trajectories"].identity, "agent": it.done["agent"].identity,
            "retriever": it.previous_retriever}


def _mining_run(it: Iteration, out: Path) -> dict:
    return mine_rows(it.job, it.done["trajectories"].summary["trajectories"], it.agent_model,
                     RetrievalConfig(url=it.service.url), out, reach=it.reach)


def _retriever_inputs(it: Iteration) -> dict:
    return {"train": changed_settings(it.job.train, ("data", "out", "corpus", "encoder.model")),
            "rows": it.done["mining"].identity, "init": it.initial_encoder[1], "corpus": it.corpus_sha256,
            "launcher": it.job.loop.retriever_launcher}


def _retriever_run(it: Iteration, out: Path) -> dict:
    return train_retriever_step(it.job, it.done["mining"].summary["rows_path"], it.initial_encoder[0], out)


def _index_inputs(it: Iteration) -> dict:
    return {"index": changed_settings(it.job.index, ("out", "encoder.model")),
            "encoder": it.done["retriever"].identity, "corpus": it.corpus_sha256}


def _index_run(it: Iteration, out: Path) -> dict:
    return build_index_step(it.job, it.done["retriever"].summary["model"], out)


def _evaluate_inputs(it: Iteration) -> dict:
    loop = it.job.loop
    return {"eval": changed_settings(loop.eval),
            "rollout": changed_settings(it.job.rollout, ("qa", "out", "retrieval", "agent.model")),
            "files": [qa_set_sha256(p) for p in (loop.eval.leaf_qa, loop.eval.multihop_qa, loop.eval.agent_qa)],
            "agent": it.done["agent"].identity, "previous": it.previous_retriever, "new": it.done["index"].identity}


def _evaluate_run(it: Iteration, out: Path) -> dict:
    new = it.done["index"].summary["index"]
    it.service.serve(new)
    return evaluate_iteration(it.job, it.previous_index, new, it.agent_model, out, serve=it.service.url_for)


#: One iteration of Algorithm 1, in order; the runner runs it, `STEPS` names it.
ITERATION = (
    IterationStep("agent", _agent_inputs, _agent_run),
    IterationStep("trajectories", _trajectories_inputs, _trajectories_run),
    IterationStep("mining", _mining_inputs, _mining_run),
    IterationStep("retriever", _retriever_inputs, _retriever_run),
    IterationStep("index", _index_inputs, _index_run),
    IterationStep("evaluate", _evaluate_inputs, _evaluate_run),
)
#: The steps of one iteration of Algorithm 1, in order (the manifest's, the report's and `loop plan`'s).
STEPS = tuple(step.name for step in ITERATION)
