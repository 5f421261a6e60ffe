"""The main job (`make demo`): one Agentic-R iteration on the embedded default stack
("Agentic-R: Learning to Retrieve for Agentic Search", Algorithm 1, retriever half), then base vs trained retriever on
the FanOutQA dev questions.

Steps, each reusing its artifact when it is already there (so a second run only re-evaluates):

1. prepare the default corpus and FanOutQA splits;
2. index the corpus with the base MiniLM (Flat and HNSW, plus BM25 as a reference);
3. the warm-started default agent (`agent sft`, cached by its inputs);
4. agent rollouts on the train questions set aside for mining, with the base retriever;
5. utility mining of those trajectories (`mine run`);
6. contrastive training of the retriever on the mined rows (`retriever train`);
7. a Flat index of the corpus with the trained encoder;
8. evaluation of both retrievers: retrieval on the leaf dev questions (evidence Recall@k, MRR, answer
   recall@k: a gold answer in the top k), the trained encoder also with its composition (``Q [SEP] q``, Q the
   parent question), each against the base with paired-bootstrap 95% confidence intervals; evidence recall on
   the multi-hop dev questions; the agent (EM, F1, searches per question) on the leaf dev questions.

Steps 4-7 are the co-training loop's own steps (`agentic_retriever.app.loop.steps`: `roll_out`, `mine_rows`,
`train_retriever_step`, `build_index_step`), given the base index to search in this process where the loop gives
its service: one iteration is written once. Retriever training keeps the base weights when no epoch beats them on
the held-out train slice (`training.checkpoint_selection`); the report then says "kept: base".

Each step takes its settings from its own command's section of the config file (``agent_sft``,
``agent_rollout``, ``mine_run``, ``retriever_train``), with the shared ``workdir``, ``retrieval`` and ``agent``
settings; the demo sets what chains the steps (the rollouts' questions and output, the warm-started agent of
the rollouts and of mining, the training rows). The ``demo`` section holds the sizes of the run. The report
(``report.md``, ``report.json``, ``report.png``) goes into the work folder and the table is printed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.data.prepare import PrepareConfig, prepare_defaults
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.base.fingerprint import stable_hash
from agentic_retriever.base.jsonl import write_json
from agentic_retriever.base.machine import CPU_CLASSES, cpu_class, cpu_model, usable_cores
from agentic_retriever.base.memory_release import release_freed_memory
from agentic_retriever.eval.bootstrap import compare_reports
from agentic_retriever.eval.report import plot_metrics, render_table
from agentic_retriever.eval.retrieval import composition_questions, evaluate_retrieval, load_judged_questions
from agentic_retriever.index import BM25Params, DenseParams, IndexBuildConfig, build_index, open_index

log = logging.getLogger(__name__)


@dataclass
class DemoConfig:
    """Settings of `agentic-retriever demo` (section ``demo``)."""

    workdir: str = field(default="", metadata={"help": "folder for every artifact of the run", "derive": "{workdir}"})
    dev_fraction: float = field(default=0.3, metadata={"help": "share of FanOutQA top-level questions in dev"})
    mining_fraction: float = field(default=0.5, metadata={
        "help": "share of train questions (outside the held-out slice) for mining"})
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    dense_types: list[str] = field(default_factory=lambda: ["flat", "hnsw"], metadata={"help": "base dense indexes"})
    dense: DenseParams = field(default_factory=DenseParams)
    with_bm25: bool = field(default=True, metadata={"help": "also build and evaluate BM25"})
    bm25: BM25Params = field(default_factory=BM25Params)
    ks: list[int] = field(default_factory=lambda: [1, 5, 20], metadata={"help": "Recall@k cut-offs"})
    mrr_k: int = field(default=10, metadata={"help": "MRR cut-off"})
    ndcg_k: int = field(default=10, metadata={"help": "nDCG cut-off"})
    agent_eval_questions: int = field(default=64, metadata={
        "help": "leaf dev questions (in corpus) the agent answers with each retriever; 0: skip the agent"})


@dataclass
class MainJob:
    """The demo's settings plus the sections of the steps it runs (None: that step is left out)."""

    demo: DemoConfig
    warm_start: Any = None      # agent.sft.WarmStartConfig (section agent_sft)
    rollout: Any = None         # agent.rollouts.RolloutConfig (section agent_rollout)
    mine: Any = None            # mining.job.MineJobConfig (section mine_run)
    train: Any = None           # training.config.RetrieverTrainConfig (section retriever_train)


#: `make demo`'s wall time in minutes, set-up included, on a 2-core machine of each CPU class
#: (`agentic_retriever.base.machine`), and the CPU it was measured on (benchmarks/RESULTS.md, "The demo and the tests
#: per machine class").
DEMO_MINUTES = {"amx": (18.1, "Intel Xeon with AMX"), "avx512_bf16": (20.1, "AMD EPYC Zen 4"),
                "fp32": (47.1, "AMD EPYC with AVX2 alone")}


def machine_note(job: MainJob, cores: int | None = None) -> str:
    """What the demo is about to compute on and how long that took before: this CPU, its class, the precision of
    the encoder and the agent, and the class's time in RESULTS (on a GPU: none measured)."""
    import torch

    precisions = f"encoder {job.demo.encoder.precision}" + (
        f", agent {job.rollout.agent.precision}" if job.rollout is not None else "")
    if torch.cuda.is_available():
        return (f"machine: {torch.cuda.get_device_name(0)}; {precisions}. The demo's times are measured on CPUs "
                "only (benchmarks/RESULTS.md, \"The demo and the tests per machine class\").")
    kind = cpu_class()
    minutes, measured_on = DEMO_MINUTES[kind]
    cores = cores or usable_cores()
    return (f"machine: {cpu_model()}, {cores} cores, CPU class {kind} ({CPU_CLASSES[kind]}); {precisions}. This "
            f"class took {minutes:.0f} min with set-up on a 2-core {measured_on} (benchmarks/RESULTS.md, \"The demo "
            f"and the tests per machine class\")" + (f"; {cores} cores here" if cores != 2 else "") + ".")


def encoder_short_name(model: str) -> str:
    return "minilm" if model == "default" else Path(model.rstrip("/")).name


def keyed_rollout(rollout: Any, folder: Path, stem: str) -> Any:
    """`rollout` (`agent.rollouts.RolloutConfig`) writing to ``{folder}/{stem}_{key}.jsonl``, the key hashing what
    makes its trajectories: the agent, the retriever (an index by its manifest, a service by its URL), the env, the
    number of questions (`limit`) and the samples per question. A rerun reuses the file; any change rolls out into a
    new one, since mining and evaluation read a whole file (a smaller run must not find a bigger one's trajectories)."""
    index = rollout.retrieval.index
    retriever = (Path(index) / "manifest.json").read_text() if index else rollout.retrieval.url
    key = stable_hash([rollout.agent.model, retriever, dataclasses.asdict(rollout.env), rollout.limit,
                       rollout.samples])[:12]
    return dataclasses.replace(rollout, out=str(Path(folder) / f"{stem}_{key}.jsonl"))


class Steps:
    """Timed steps with a line each on the console (numbered out of `total` when it is given); `seconds` keeps
    each step's wall time."""

    def __init__(self, total: int | None = None):
        self.total, self.done, self.seconds = total, 0, {}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        self.done += 1
        label = f"[{self.done}/{self.total}]" if self.total else f"[{self.done}]"
        print(f"\n{label} {name}", flush=True)
        started = time.perf_counter()
        try:
            result = fn()
        finally:
            release_freed_memory()  # what the step freed, back to the system before the next step allocates
        self.seconds[name] = round(time.perf_counter() - started, 1)
        print(f"{label} {name}: done in {self.seconds[name]:.0f} s", flush=True)
        return result


def _dense_build(config: DemoConfig, corpus: str, out: Path, encoder: EncoderConfig, kind: str) -> IndexBuildConfig:
    return IndexBuildConfig(corpus=corpus, out=str(out), backend="dense", encoder=encoder,
                            dense=dataclasses.replace(config.dense, type=kind, keep_embeddings=True,
                                                      embeddings_dir=str(out.parent.parent / "embeddings")))


#: Leaf-question metrics in the demo's table and compared with the base.
TABLE_METRICS = ("recall@1", "recall@5", "recall@20", "mrr@10", "answer_recall@1", "answer_recall@5")


def _retrieval_reports(config: DemoConfig, indexes: dict[str, str], qa: Path, parents: Path | None = None
                       ) -> dict[str, dict]:
    """Each index on `qa`; with `parents`, indexes whose encoder composes ``Q [SEP] q`` are also evaluated with
    the parent question as Q (under the name ``NAME (Q [SEP] q)``)."""
    questions = load_judged_questions(str(qa))
    reports = {}
    for name, path in indexes.items():
        index = open_index(path)
        reports[name] = evaluate_retrieval(index, questions, config.ks, config.mrr_k, config.ndcg_k)
        if parents is not None and index.composition != "query":
            reports[f"{name} (Q [SEP] q)"] = evaluate_retrieval(
                index, questions, config.ks, config.mrr_k, config.ndcg_k,
                search_questions=composition_questions(questions, "parent", str(parents)))
    return reports


def run_demo(job: MainJob | DemoConfig) -> dict:
    """Run the main job; return the report (also written to the work folder)."""
    job = job if isinstance(job, MainJob) else MainJob(job)
    config = job.demo
    if not config.workdir:
        raise ValueError("demo: give the work folder (workdir)")
    full = all(part is not None for part in (job.warm_start, job.rollout, job.mine, job.train))
    print(machine_note(job), flush=True)
    steps = Steps(8 if full else 2)
    work, data = Path(config.workdir), Path(config.workdir) / "data"
    corpus = str(data / "corpus.jsonl")

    summary = steps.run("prepare the default corpus and FanOutQA splits", lambda: prepare_defaults(
        PrepareConfig(out=str(data), dev_fraction=config.dev_fraction, mining_fraction=config.mining_fraction)))
    print(f"{summary['corpus_passages']} passages; leaf questions with their evidence page in the corpus: "
          f"{sum(summary['leaf_questions_with_evidence_in_corpus'].values())} "
          f"(dev {summary['leaf_questions_with_evidence_in_corpus']['dev']}); set aside for mining: "
          f"{summary['leaf_questions_for_mining']}")
    base_name = encoder_short_name(config.encoder.model)
    indexes = {f"{base_name}-{kind}": str(work / "index" / f"{base_name}-{kind}") for kind in config.dense_types}

    def build_base() -> None:
        for kind in config.dense_types:
            build_index(_dense_build(config, corpus, work / "index" / f"{base_name}-{kind}", config.encoder, kind))
        if config.with_bm25:
            build_index(IndexBuildConfig(corpus=corpus, out=str(work / "index" / "bm25"), backend="bm25",
                                         bm25=config.bm25))
            indexes["bm25"] = str(work / "index" / "bm25")

    steps.run("index the corpus with the base encoder", build_base)
    report: dict[str, Any] = {"prepare": summary}
    if full:
        trained_index = _agentic_r_iteration(job, steps, work, corpus, report)
        indexes[f"agentic-r-{base_name}-flat"] = trained_index
    report |= _evaluate(job, steps, work, data, indexes, report.get("agent_model"),
                        report.get("training", {}).get("selection"))
    report["step_seconds"] = steps.seconds
    write_json(work / "report.json", report)
    return report


def _agentic_r_iteration(job: MainJob, steps: Steps, work: Path, corpus: str, report: dict) -> str:
    """Steps 3-7, the retriever half of one iteration of Algorithm 1 by the loop's own steps
    (`agentic_retriever.app.loop.steps`): Agent_1 is the warm-started agent (no RL here); its rollouts on the mining
    questions and their mining search the base index in this process; then Agentic-R_1 from the base encoder and
    its Flat index. Returns the trained index folder."""
    from agent.sft import warm_start_agent

    from .loop import steps as iteration
    from .loop.config import LoopConfig, LoopJob

    config = job.demo
    trained_index = work / "index" / f"agentic-r-{encoder_short_name(config.encoder.model)}-flat"
    loop_job = LoopJob(LoopConfig(out=str(work), mining_qa=str(work / "data" / "fanoutqa_leaf_train_mining.jsonl")),
                       agent_train=None, rollout=job.rollout, mine=job.mine, train=job.train,
                       index=_dense_build(config, corpus, trained_index, config.encoder, "flat"))
    base = job.rollout.retrieval  # the base index (the shared ``retrieval`` setting), searched in this process
    agent = str(steps.run("warm-start the default agent (cached after the first run)",
                          lambda: warm_start_agent(job.warm_start)))
    rollout = keyed_rollout(dataclasses.replace(job.rollout, qa=loop_job.loop.mining_qa, limit=None, retrieval=base,
                                                agent=dataclasses.replace(job.rollout.agent, model=agent)),
                            work / "agent", "trajectories_train_mining")
    report["rollouts"] = steps.run("agent rollouts on the mining questions", lambda: iteration.roll_out(
        loop_job, agent, base, Path(rollout.out).with_suffix("")))
    report["mining"] = steps.run("utility mining (candidates, local relevance, answer correctness, selection)",
                                 lambda: iteration.mine_rows(loop_job, report["rollouts"]["trajectories"], agent, base,
                                                             work / "mining"))
    report["training"] = steps.run("contrastive training of the retriever", lambda: iteration.train_retriever_step(
        loop_job, report["mining"]["rows_path"], job.train.encoder.model, work / "retriever"))
    steps.run("index the corpus with the trained encoder",
              lambda: iteration.build_index_step(loop_job, report["training"]["model"], trained_index))
    report["agent_model"] = agent
    return str(trained_index)


_INPUT_NAMES = {"none": "the bare question", "parent": "composed with its parent question",
                "self": "the question composed with itself (Q [SEP] Q)"}


def selection_note(selection: dict | None) -> str:
    """The report's sentence on model selection: what was kept, on which inputs and by which scores."""
    if not selection or not selection.get("kept"):
        return ""
    inputs = " and ".join(_INPUT_NAMES[mode] for mode in selection.get("compose_with", ["self"]))
    scores = ", ".join(f"{name} {score:.3f}" for name, score in selection.get("per_checkpoint", {}).items())
    how = f"held-out {selection.get('metric', 'score')} on {inputs}" + (", the mean deciding" if " and " in inputs else "")
    if selection["kept"] == "base":
        return (f"\nModel selection on the held-out train slice ({how}: {scores}) kept the BASE weights: no training "
                "epoch beat them, so the trained row's bare-question figures are the base's (only its composed row "
                "differs).\n")
    return f"\nModel selection on the held-out train slice ({how}: {scores}) kept {selection['kept']}.\n"


def _evaluate(job: MainJob, steps: Steps, work: Path, data: Path, indexes: dict[str, str],
              agent_model: str | None, selection: dict | None = None) -> dict:
    config = job.demo
    full = agent_model is not None

    def evaluate() -> dict:
        leaf = _retrieval_reports(config, indexes, data / "fanoutqa_leaf_dev.jsonl", data / "fanoutqa_multihop_dev.jsonl")
        multihop = _retrieval_reports(config, indexes, data / "fanoutqa_multihop_dev.jsonl")
        agent = _agent_reports(job, work, data, indexes, agent_model) if full and config.agent_eval_questions else {}
        return {"leaf": leaf, "multihop": multihop, "agent": agent}

    results = steps.run("evaluate the retrievers (and the agent with each)" if full else "evaluate the retrievers",
                        evaluate)
    base = next(iter(indexes))
    table_rows: dict[str, dict[str, float]] = {}
    for name, report in results["leaf"].items():
        row = {m: report["metrics"][m] for m in TABLE_METRICS if m in report["metrics"]}
        index_name = name.removesuffix(" (Q [SEP] q)")
        if index_name == name:
            row |= {f"multihop_{k}": v for k, v in results["multihop"][name]["metrics"].items() if k == "recall@20"}
            row |= {f"agent_{k}": v for k, v in results["agent"].get(name, {}).items()}
        table_rows[name] = row
    comparisons = {name: compare_reports(results["leaf"][base], report, TABLE_METRICS)
                   for name, report in results["leaf"].items() if name != base and name.startswith("agentic-r")}
    table = render_table(table_rows)
    differences = "\n".join(
        f"- {name} minus {base}: " + "; ".join(f"{m} {c['diff']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"
                                               for m, c in comparison.items())
        for name, comparison in comparisons.items())
    counts = (f"{results['leaf'][base]['questions_evaluated']} leaf dev questions, "
              f"{results['multihop'][base]['questions_evaluated']} multi-hop dev questions"
              + (f", agent on {config.agent_eval_questions} leaf dev questions" if results["agent"] else ""))
    text = f"FanOutQA dev ({counts}), default corpus\n\n{table}\n"
    if differences:
        text += f"\nTrained minus base, paired bootstrap 95% CI:\n{differences}\n"
    text += selection_note(selection)
    (work / "report.md").write_text(text)
    plot_metrics(table_rows, work / "report.png", title=f"FanOutQA dev ({counts})")
    print(f"\n{text}\nwrote {work / 'report.md'}, {work / 'report.png'}, {work / 'report.json'}")
    return {"table": table_rows, "questions": counts, "vs_base": comparisons,
            "retrieval_per_index": {n: {k: v for k, v in r.items() if k != "per_question"}
                                    for n, r in results["leaf"].items()}}


def _agent_reports(job: MainJob, work: Path, data: Path, indexes: dict[str, str], agent_model: str) -> dict[str, dict]:
    """EM, F1 and searches per question of the warm-started agent with each Flat retriever (base and trained;
    HNSW approximates the base Flat, and BM25 is a reference for retrieval only). Trajectory files
    are named by a hash of the agent, the index manifest and the env (`keyed_rollout`), so a retrained
    retriever is rolled out anew."""
    from agent.evaluate import evaluate_trajectories
    from agent.rollouts import run_rollout_job

    qa = data / "fanoutqa_leaf_dev_in_corpus.jsonl"
    reports = {}
    for name, index in indexes.items():
        if not name.endswith("-flat"):
            continue
        rollout = dataclasses.replace(job.rollout, qa=str(qa), retrieval=RetrievalConfig(index=index),
                                      limit=job.demo.agent_eval_questions,
                                      agent=dataclasses.replace(job.rollout.agent, model=agent_model))
        rollout = keyed_rollout(rollout, work / "agent", f"trajectories_dev_{name}")
        run_rollout_job(rollout)
        metrics = evaluate_trajectories(rollout.out, str(qa))
        reports[name] = {"em": metrics["em"], "f1": metrics["f1"], "searches": metrics["avg_searches"]}
    return reports
