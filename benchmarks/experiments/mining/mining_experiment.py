"""Does mining point at useful passages? The CPU-scale Agentic-R experiment with its ablations (issue 12).

One command runs it, every step reusing its artifact when it is there (a rerun only redoes what changed):

    .venv/bin/python benchmarks/experiments/mining/mining_experiment.py \\
        --config benchmarks/experiments/mining/mining_experiment.yaml

Every setting of the config's `experiment` section also has a flag that overrides it (``--mining-questions 36``).

1. the warm-started default agent (the quickstart's, cached) rolls out on the in-corpus train leaves outside the
   held-out slice (`fanoutqa_leaf_train_mining_in_corpus.jsonl`, questions and gold answers only);
2. utility mining of those trajectories with the base MiniLM (`mine run`), the full method; its ablations re-select
   from the same stage stores (nothing is rescored): w/o GAC, w/o LR, the false-negative filter off;
3. `mine audit` of the full method (evaluation side: it reads the mining questions' evidence titles);
4. retriever training of each variant (InfoNCE; the full method also with the soft-label loss), every run
   choosing its checkpoint (base or an epoch) on the held-out train slice, with the training settings
   (learning rate x temperature) chosen on that slice for the full method first and used for all rows;
5. a reference row, labelled as a diagnostic upper bound and never shipped: the same rounds and the same
   training with each train leaf's evidence page as the positive;
6. every retriever re-indexes the corpus (Flat) and is evaluated on the leaf dev questions (evidence Recall@k,
   MRR@10, answer recall@k: a gold answer in the top k), bare and composed with the parent question, each
   against the base with paired-bootstrap 95% confidence intervals; the agent (its own queries) answers the
   multi-hop dev questions with the base and with the full method's retriever: evidence recall of its
   searches, answer recall over its retrieved passages, EM, F1.

On the multi-search agent (``mining_experiment_multisearch.yaml``, beside this script) the mining questions are
multi-hop, so every round has Q (the multi-hop question) different from q (one sub-query); ``experiment.ablations`` trims the
variants trained, and ``experiment.gac_targets`` first chooses GAC's target on held-out multi-hop questions, with
``gac_criteria`` and ``gac_thresholds`` its criterion and threshold (`choose_gac_target`; model selection: it reads
their evidence titles), then `rows_by_gac_setting` tables the rows each compared setting would mine (crossed with
``lr_thresholds``); ``mining_samples`` > 1 samples that many trajectories per mining question. A variant that
mines no row is reported and not trained; the settings search and the agent then use the first variant that mined
rows (`primary_variant`).
``experiment.unselected`` (a labelled diagnostic) also trains that variant (or ``unselected_variant``) without
checkpoint selection, for when the held-out selection keeps the base weights, and evaluates it like the others,
agent included.

Writes ``results.json``, ``results.md`` (the tables of benchmarks/RESULTS.md) and ``results.png`` into the work folder.
Evaluation labels: only steps 3, 4 (held-out slice) and 6 (dev) read evidence titles; the reference row reads
train evidence titles and is a diagnostic. Dev questions never enter training (the split is by top-level
question, deduplicated by the QA normaliser).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _common (an experiment runs as a script)
from _common import describe_device  # noqa: E402

from agent.rollouts import RolloutConfig, run_rollout_job  # noqa: E402
from agent.sft import WarmStartConfig, warm_start_agent  # noqa: E402
from agent.trajectory import read_trajectories  # noqa: E402
from agentic_retriever.app.config_loader import add_dataclass_arguments, build_config  # noqa: E402
from agentic_retriever.app.demo import Steps, keyed_rollout  # noqa: E402
from agentic_retriever.base.client import RetrievalConfig  # noqa: E402
from agentic_retriever.base.corpus import Corpus  # noqa: E402
from agentic_retriever.base.data.prepare import assert_disjoint, split_keys  # noqa: E402
from agentic_retriever.base.encoder import EncoderConfig  # noqa: E402
from agentic_retriever.base.qa_metrics import contains_match, qa_scores  # noqa: E402
from agentic_retriever.eval.bootstrap import compare_reports, paired_bootstrap  # noqa: E402
from agentic_retriever.eval.retrieval import (composition_questions, evaluate_retrieval,  # noqa: E402
                                              load_judged_questions)
from agentic_retriever.base.fingerprint import stable_hash  # noqa: E402
from agentic_retriever.base.jsonl import atomic_write, iter_jsonl, read_json, write_json, write_jsonl  # noqa: E402
from agentic_retriever.eval.mining_audit import audit_mining  # noqa: E402
from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index, open_index  # noqa: E402
from agentic_retriever.mining.gac import GAC_CRITERIA  # noqa: E402
from agentic_retriever.mining.job import MineJobConfig, run_mine_job  # noqa: E402
from agentic_retriever.mining.reselect import ABLATIONS, mine_ablations, reselect, slug  # noqa: E402
from agentic_retriever.mining.rounds import search_queries  # noqa: E402
from agentic_retriever.training.config import RetrieverTrainConfig  # noqa: E402
from agentic_retriever.training.settings_search import choose_training_settings  # noqa: E402
from agentic_retriever.training.trainer import train_retriever  # noqa: E402

LEAF_METRICS = ["answer_recall@1", "answer_recall@5", "answer_recall@20", "recall@1", "recall@5", "recall@20",
                "mrr@10"]
AGENT_METRICS = ["evidence_recall", "answer_recall", "em", "f1"]
AGENT_BEHAVIOUR = ["searches", "distinct_queries", "answered"]  # per question: searches, distinct queries, answered
SUMMARY_METRICS = ["recall@1", "mrr@10", "answer_recall@5"]  # each bare and composed, side by side
SPLIT_METRICS = ["recall@1", "mrr@10"]


@dataclass
class ExperimentConfig:
    """The `experiment` section: where things are and how big the run is."""

    workdir: str = "runs/mining_experiment"
    data: str = "runs/quickstart/data"
    base_index: str = "runs/quickstart/index/minilm-flat"
    mining_qa: str = "fanoutqa_leaf_train_mining_in_corpus.jsonl"
    mining_questions: int | None = None
    # trajectories per mining question: more than 1 samples them all at mining_temperature (more rounds of the same
    # questions); the held-out choice and every evaluation keep agent_rollout's one trajectory (greedy by default)
    mining_samples: int = 1
    mining_temperature: float = 0.7
    heldout_qa: str = "fanoutqa_leaf_train_heldout.jsonl"
    heldout_parents: str = "fanoutqa_multihop_train_heldout.jsonl"
    dev_qa: str = "fanoutqa_leaf_dev.jsonl"
    dev_parents: str = "fanoutqa_multihop_dev.jsonl"
    agent_eval_questions: int = 98
    settings_grid: dict = field(default_factory=lambda: {"learning_rate": [1e-5, 3e-5], "temperature": [0.01, 0.05]})
    bootstrap_samples: int = 10000
    ablations: list[str] = field(default_factory=lambda: list(ABLATIONS))  # the mining variants trained (full first)
    gac_targets: list[str] = field(default_factory=list)  # GAC targets to choose from (empty: mine_run's own)
    gac_target_questions: int = 16  # held-out multi-hop questions (heldout_parents) the choice is made on
    # GAC thresholds chosen with the target (empty: mine_run's own): the pair whose pass decision best finds the
    # evidence pages among the held-out rounds' candidates (F1) decides, not the AUC
    gac_thresholds: list[float] = field(default_factory=list)
    # GAC criteria chosen with the target (empty: mine_run's own); they grade the same stored log-probabilities
    gac_criteria: list[str] = field(default_factory=list)
    # LR thresholds the re-selection table (`rows_by_gac_setting`) crosses with every GAC setting (empty: mine_run's
    # own); one below mine_run's needs GAC on every round (mine_run.mining.skip_hopeless_gac false)
    lr_thresholds: list[float] = field(default_factory=list)
    reference: bool = True
    soft_label: bool = True
    # DIAGNOSTIC: a variant trained again without checkpoint selection (its last epoch) and evaluated like the
    # others, agent included: what its rows teach when the held-out selection keeps the base
    unselected: bool = False
    unselected_variant: str = ""  # which variant (one of `ablations`); empty: the primary one

    def __post_init__(self) -> None:
        if self.mining_samples < 1 or (self.mining_samples > 1 and self.mining_temperature <= 0):
            raise ValueError(f"experiment.mining_samples must be at least 1, and more than 1 needs mining_temperature "
                             f"> 0; got {self.mining_samples} at {self.mining_temperature}")
        if self.unselected_variant and self.unselected_variant not in self.ablations:
            raise ValueError(f"experiment.unselected_variant must be one of experiment.ablations ({self.ablations}); "
                             f"got {self.unselected_variant!r}")
        unknown = [name for name in self.ablations if name not in ABLATIONS]
        if unknown or "full" not in self.ablations:
            raise ValueError(f"experiment.ablations must include 'full' and name only {', '.join(ABLATIONS)}; "
                             f"got {self.ablations}")
        if self.gac_targets and self.gac_target_questions < 1:
            raise ValueError(f"experiment.gac_target_questions must be at least 1, got {self.gac_target_questions}")
        if (self.gac_thresholds or self.gac_criteria) and not self.gac_targets:
            raise ValueError("experiment.gac_thresholds and gac_criteria are chosen on held-out rounds with the "
                             "target: list experiment.gac_targets too")
        if self.lr_thresholds and not self.gac_thresholds:
            raise ValueError("experiment.lr_thresholds are crossed with experiment.gac_thresholds in the re-selection "
                             "table: list gac_thresholds too")
        unknown = [c for c in self.gac_criteria if c not in GAC_CRITERIA]
        if unknown:
            raise ValueError(f"experiment.gac_criteria: unknown {', '.join(unknown)} ({', '.join(GAC_CRITERIA)})")


def mining_rollout_config(rollout: RolloutConfig, config: ExperimentConfig) -> RolloutConfig:
    """The rollout settings of the mining questions: `rollout`'s with one trajectory per question, as the
    evaluation's, or with ``mining_samples`` > 1 that many per question sampled at ``mining_temperature``."""
    if config.mining_samples == 1:
        return dataclasses.replace(rollout, samples=1)
    return dataclasses.replace(rollout, samples=config.mining_samples,
                               env=dataclasses.replace(rollout.env, temperature=config.mining_temperature))


def rows_by_gac_setting(job: MineJobConfig, work: Path, config: ExperimentConfig) -> list[dict]:
    """What each GAC setting the held-out choice compared would mine from the mining rounds: the full run's stage
    stores re-selected with each criterion of its target (`gac_settings`), each of `gac_thresholds` and each of
    `lr_thresholds` (mine_run's own when empty); nothing is scored again (checked) and no evidence label is read.
    Per setting: rows and the rounds dropped, by reason."""
    own_lr = job.mining.selection.lr_threshold
    lr_thresholds = config.lr_thresholds or [own_lr]
    if job.mining.skip_hopeless_gac and min(lr_thresholds) < own_lr:
        raise ValueError(f"experiment.lr_thresholds go below mine_run's LR threshold {own_lr:g}, whose rounds below it "
                         "got no GAC: set mine_run.mining.skip_hopeless_gac false (GAC on every round)")
    table = []
    for name, (target, criterion) in gac_settings(config, job.mining.gac_criterion).items():
        if target != job.mining.gac_target:  # another target's GAC is not in the full run's stores
            continue
        for threshold in config.gac_thresholds:
            for lr_threshold in lr_thresholds:
                selection = dataclasses.replace(job.mining.selection, gac_threshold=threshold,
                                                lr_threshold=lr_threshold)
                mining = dataclasses.replace(job.mining, gac_criterion=criterion, plot=False, selection=selection)
                folder = f"{slug(criterion)}-{threshold:g}-lr-{lr_threshold:g}"
                result = reselect(job, work / "mining" / "full", work / "mining" / "gac_settings" / folder, mining,
                                  f"GAC setting {name}, {threshold:g}, LR {lr_threshold:g}")
                table.append({"target": target, "criterion": criterion, "threshold": threshold,
                              "lr_threshold": lr_threshold, "rows": result.stats["rows"],
                              "rounds": result.stats["rounds"]["in"], "dropped": result.stats["rounds"]["dropped"]})
    return table


def render_rows_by_gac_setting(table: list[dict]) -> list[str]:
    """`rows_by_gac_setting` as markdown lines."""
    reasons = sorted(set().union(*(row["dropped"] for row in table)))
    lines = ["Rows each GAC setting mines from the same mining rounds (re-selection, nothing rescored; reads no "
             "evidence label); rounds dropped by reason", "",
             "| GAC target | criterion | threshold | LR threshold | rows | rounds | " + " | ".join(reasons) + " |",
             "|---|---|---:|---:|---:|---:|" + "---:|" * len(reasons)]
    for row in table:
        lines.append(f"| {row['target']} | {row['criterion']} | {row['threshold']:g} | {row['lr_threshold']:g} | "
                     f"{row['rows']} | {row['rounds']} | "
                     + " | ".join(str(row["dropped"].get(reason, 0)) for reason in reasons) + " |")
    return lines


def rows_mined(path: Path) -> int:
    """The training rows a mining run wrote (its `retriever_train.jsonl`)."""
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def primary_variant(mined: dict[str, int]) -> str:
    """The variant the settings search and the agent's evaluation use, from each variant's count of mined rows
    (`rows_mined`): the full method, or where it mined no row (GAC passing on no round of a long list answer, say)
    the first ablation that mined some, in config order."""
    for name, count in mined.items():
        if count:
            return name
    raise ValueError(f"no variant mined a training row: {', '.join(mined)} (see their mining_stats.json)")


def unselected_name(primary: str) -> str:
    return f"{primary}, last epoch (diagnostic, not selected)"


def agent_systems(systems: dict[str, dict], primary: str) -> list[str]:
    """The retrievers the agent is evaluated with: the base, the primary variant (even when its selection kept the
    base weights: it still composes ``Q [SEP] q``, where the base ignores Q), and the unselected diagnostic."""
    diagnostics = {unselected_name(name) for name in systems}
    return ["base", primary] + [name for name in systems if name in diagnostics]


def gac_settings(config: ExperimentConfig, criterion: str) -> dict[str, tuple[str, str]]:
    """The (GAC target, criterion) pairs the held-out choice compares, by name: each of `gac_targets` with each of
    `gac_criteria` ("final, part_gain"), or with `criterion` (the mining config's) when none is listed (named by
    the target alone)."""
    if not config.gac_criteria:
        return {target: (target, criterion) for target in config.gac_targets}
    return {f"{target}, {c}": (target, c) for target in config.gac_targets for c in config.gac_criteria}


def pick_gac_target(audits: dict[str, dict]) -> str:
    """The GAC target whose scores rank the question's evidence pages highest among a round's candidates: the
    largest mean evidence AUC of the GAC signal in each target's `mine audit` (ties: the first target)."""
    aucs = {target: audit["auc"]["evidence"]["gac"]["mean"] for target, audit in audits.items()}
    missing = [target for target, auc in aucs.items() if auc is None]
    if missing or not aucs:
        raise ValueError(f"no GAC evidence AUC for target(s) {', '.join(missing) or '(none given)'}: no judged "
                         "round had an evidence page among its candidates")
    return max(aucs, key=lambda target: (aucs[target], -list(aucs).index(target)))


def gac_decisions(rounds_path: Path, evidence: dict[str, set[str]], thresholds: list[float]) -> list[dict]:
    """EVALUATION-SIDE (reads evidence titles): per threshold, how GAC's pass decision (gain >= threshold) finds the
    question's evidence pages among the candidates it scored in `rounds.jsonl`: passing candidates, the evidence
    pages among them, precision, recall and F1."""
    scored = [(candidate["gac"], candidate["title"] in evidence.get(record["question_id"], ()))
              for _, record in iter_jsonl(rounds_path) for candidate in record["candidates"]
              if candidate.get("gac") is not None]
    members = sum(member for _, member in scored)
    table = []
    for threshold in thresholds:
        passing = [member for gain, member in scored if gain >= threshold]
        hits = sum(passing)
        precision = hits / len(passing) if passing else 0.0
        recall = hits / members if members else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        table.append({"threshold": threshold, "candidates": len(scored), "evidence": members,
                      "passing": len(passing), "evidence_passing": hits, "precision": precision, "recall": recall,
                      "f1": f1})
    return table


def pick_gac_setting(decisions: dict[str, list[dict]]) -> tuple[str, float]:
    """The (target, threshold) whose GAC pass decision has the best evidence F1 (ties: the first target, then the
    first threshold listed)."""
    pairs = [(row["f1"], -t, -j, target, row["threshold"]) for t, (target, rows) in enumerate(decisions.items())
             for j, row in enumerate(rows)]
    if not pairs:
        raise ValueError("no GAC target and threshold to choose from")
    best = max(pairs)
    if best[0] == 0:
        raise ValueError("GAC passed no evidence page at any target and threshold on the held-out rounds: nothing to "
                         "choose by")
    return best[3], best[4]


def choose_gac_target(job: MineJobConfig, rollout: RolloutConfig, config: ExperimentConfig, data: Path,
                      work: Path) -> tuple[str, str, float | None, dict]:
    """MODEL SELECTION (reads the held-out questions' evidence titles; those questions are never trained on): the
    agent rolls out on the first `gac_target_questions` held-out multi-hop questions, their rounds are mined with
    each (target, criterion) pair of `gac_settings`, and the pair whose GAC ranks evidence pages highest
    (`pick_gac_target`) is chosen, or with `gac_thresholds` the pair and threshold whose pass decision finds them
    best (`pick_gac_setting`); returns (target, criterion, threshold or None, report), the report also written to
    ``gac_target_choice/choice.{json,md}``.
    GAC is scored on every round with an evidence page among its candidates (whatever its LR) and on no other:
    the others cannot move the AUC, and GAC costs 11 s per multi-search round on 2 CPU cores (21 sequences). A
    criterion grades the stored log-probabilities, so a second criterion of a target costs no scoring.
    The choice is a deviation from the paper, whose GAC target is always the final answer (docs/mining.md)."""
    folder = work / "gac_target_choice"
    qa = data / config.heldout_parents
    evidence = {row["id"]: set(row.get("supporting_titles") or []) for _, row in iter_jsonl(qa)}

    def judged(rnd, candidates: list[dict]) -> bool:  # GAC only where the audit can rank an evidence page
        return any(c["title"] in evidence.get(rnd.question_id, ()) for c in candidates)

    rollout = dataclasses.replace(rollout, qa=str(qa), limit=config.gac_target_questions, retrieval=job.retrieval,
                                  samples=1, agent=dataclasses.replace(rollout.agent, model=job.agent.model))
    rollout = keyed_rollout(rollout, folder, "trajectories_heldout")
    run_rollout_job(rollout)
    settings = gac_settings(config, job.mining.gac_criterion)
    outs = {name: folder / Path(*name.split(", ")) for name in settings}
    audits, first = {}, outs[next(iter(settings))] / "stages"
    for name, (target, criterion) in settings.items():
        out = outs[name]
        if out / "stages" != first and not (out / "stages").is_dir():  # candidates and LR do not depend on the
            shutil.copytree(first, out / "stages")                       # target: only GAC is scored again
        run_mine_job(dataclasses.replace(job, trajectories=rollout.out, out=str(out), mining=dataclasses.replace(
            job.mining, gac_target=target, gac_criterion=criterion, skip_hopeless_gac=False)), gac_rounds=judged)
        audits[name] = audit_mining(out, qa)
    report = {"questions": config.gac_target_questions,
              "targets": {name: {"evidence_auc": audit["auc"]["evidence"]["gac"],
                                 "answer_auc": audit["auc"]["answer"]["gac"], "rounds": audit["rounds"]}
                          for name, audit in audits.items()}}
    threshold = None
    if config.gac_thresholds:
        decisions = {name: gac_decisions(outs[name] / "rounds.jsonl", evidence, config.gac_thresholds)
                     for name in settings}
        chosen, threshold = pick_gac_setting(decisions)
        for name, rows in decisions.items():
            report["targets"][name]["decisions"] = rows
    else:
        chosen = pick_gac_target(audits)
    target, criterion = settings[chosen]
    report |= {"chosen": chosen, "target": target, "criterion": criterion, "threshold": threshold}
    write_json(folder / "choice.json", report)  # readable before the long steps that follow it end
    text = "\n".join(render_gac_choice(report)) + "\n"
    with atomic_write(folder / "choice.md") as f:
        f.write(text)
    print(text)
    return target, criterion, threshold, report


def reference_rows(mining_dir: Path, qa_path: Path, corpus: Corpus, out: Path, num_negatives: int,
                   seed: int = 0) -> Path:
    """DIAGNOSTIC (reads train evidence titles; never shipped): every mined round with its evidence page as the
    positive and negatives sampled from its candidates that are neither evidence nor contain a gold answer."""
    evidence = {row["id"]: set(row.get("supporting_titles") or []) for _, row in iter_jsonl(qa_path)}
    title_to_id: dict[str, str] = {}
    for title, passage_id in zip(corpus.titles.to_pylist(), corpus.id_column.to_pylist()):
        title_to_id.setdefault(title, passage_id)  # the first passage of a title
    rows = []
    for _, record in iter_jsonl(mining_dir / "rounds.jsonl"):
        titles = evidence.get(record["question_id"], set())
        ids = [title_to_id[t] for t in sorted(titles) if t in title_to_id]
        if not ids:
            continue
        pool = [c["id"] for c in record["candidates"] if c["title"] not in titles and not c["contains_answer"]]
        if len(pool) < num_negatives:
            continue
        rng = random.Random(int(stable_hash([seed, record["round_id"]]), 16))
        rows.append({"dataset": "reference-evidence", "query_id": record["question_id"], "question": record["question"],
                     "round_index": record["round_index"], "history_queries": [], "query_text": record["query"],
                     "passage_ids": [ids[0], *rng.sample(pool, num_negatives)],
                     "scores": [{"em": int(i == 0), "local_utility": None, "gac": None} for i in range(num_negatives + 1)]})
    write_jsonl(out, rows)
    return out


def rows_from_seen_questions(rows_path: Path, mining_qa: Path, warm_start_rows: list[dict]) -> dict:
    """How many mined rows come from a question the agent's warm start read: the same question (id or normalised
    text) or a leaf of the same top-level question (`prepare.split_keys`). Reads questions only."""
    mining = {row["id"]: row for _, row in iter_jsonl(mining_qa)}
    seen = split_keys(warm_start_rows)
    rows = [row for _, row in iter_jsonl(rows_path)]
    from_seen = sum(bool(split_keys([mining.get(row["query_id"]) or {"id": row["query_id"],
                                                                    "question": row["question"]}]) & seen)
                    for row in rows)
    return {"rows": len(rows), "from_questions_the_agent_saw": from_seen}


def positive_titles(rows_path: Path, corpus: Corpus) -> set[str]:
    """The pages of a training file's positives (first passage id of each row)."""
    ids = sorted({row["passage_ids"][0] for _, row in iter_jsonl(rows_path)})
    return {passage.title for passage in corpus.get(ids)} if ids else set()


def _subset(report: dict, ids: set[str]) -> dict:
    return {**report, "per_question": [q for q in report["per_question"] if q["id"] in ids]}


def gain_by_training_positives(base: dict, trained: dict, dev_qa: Path, positives: set[str], metrics: list[str],
                               num_samples: int) -> dict:
    """EVALUATION (reads dev evidence titles): trained minus base, separately for the dev questions whose evidence
    page is among the training positives and for the others (a gain on pages trained on may be memorised)."""
    evidence = {row["id"]: set(row.get("supporting_titles") or []) for _, row in iter_jsonl(dev_qa)}
    ids = {q["id"] for q in base["none"]["per_question"]}
    groups = {"evidence page trained on": {i for i in ids if evidence.get(i, set()) & positives}}
    groups["evidence page not trained on"] = ids - groups["evidence page trained on"]
    out = {}
    for group, members in groups.items():
        out[group] = {"questions": len(members)}
        if members:
            out[group] |= {mode: compare_reports(_subset(base[mode], members), _subset(trained[mode], members),
                                                 metrics, num_samples=num_samples) for mode in ("none", "parent")}
    return out


def leaf_reports(index_dir: str, config: ExperimentConfig, data: Path, cache: Path) -> dict[str, dict]:
    """Leaf dev retrieval of one index, bare and composed with the parent question (cached by index manifest)."""
    key = stable_hash([(Path(index_dir) / "manifest.json").read_text(), config.dev_qa, config.dev_parents])[:16]
    path = cache / f"leaf_{key}.json"
    if path.is_file():
        return read_json(path)
    questions = load_judged_questions(str(data / config.dev_qa))
    index = open_index(index_dir)
    reports = {mode: evaluate_retrieval(index, questions, (1, 5, 20), 10, 10, search_questions=composition_questions(
        questions, mode, str(data / config.dev_parents))) for mode in ("none", "parent")}
    write_json(path, reports)
    return reports


def agent_report(index_dir: str, agent_model: str, rollout: RolloutConfig, config: ExperimentConfig, data: Path,
                 work: Path) -> dict:
    """The agent on the multi-hop dev questions with this retriever: per question evidence recall of its searches,
    answer recall over its retrieved passages, EM, F1."""
    qa = data / config.dev_parents
    rollout = dataclasses.replace(rollout, qa=str(qa), retrieval=RetrievalConfig(index=index_dir),
                                  limit=config.agent_eval_questions, samples=1,
                                  agent=dataclasses.replace(rollout.agent, model=agent_model))
    rollout = keyed_rollout(rollout, work / "agent", "multihop_dev")
    run_rollout_job(rollout)
    evidence = {row["id"]: set(row["supporting_titles"]) for _, row in iter_jsonl(qa)}
    per_question = []
    for t in read_trajectories(rollout.out):
        titles = evidence.get(t.question_id) or set()
        observed = "\n".join(turn.observation or "" for turn in t.turns)
        scores = qa_scores(t.answer, t.golden_answers)
        per_question.append({"id": t.question_id,
                             "evidence_recall": len(titles & set(t.retrieved_titles)) / len(titles) if titles else None,
                             "answer_recall": contains_match(observed, t.golden_answers), "em": scores.em,
                             "f1": scores.f1, "searches": t.num_searches,
                             "distinct_queries": len({q.strip().lower() for _, q in search_queries(t)}),
                             "answered": float(t.finish_reason == "answer")})
    means = {m: _mean([q[m] for q in per_question]) for m in [*AGENT_METRICS, *AGENT_BEHAVIOUR]}
    return {"metrics": means, "questions": len(per_question), "per_question": per_question}


def compare_agents(base: dict, other: dict, samples: int) -> dict:
    """Per agent metric (`agent_report`), `other` minus `base` over the questions both have a value for (paired
    bootstrap)."""
    a = {q["id"]: q for q in base["per_question"]}
    b = {q["id"]: q for q in other["per_question"]}
    out = {}
    for metric in AGENT_METRICS:
        ids = [i for i in sorted(a.keys() & b.keys()) if a[i][metric] is not None and b[i][metric] is not None]
        out[metric] = paired_bootstrap([a[i][metric] for i in ids], [b[i][metric] for i in ids], num_samples=samples)
    return out


def _audit_summary(audit: dict) -> dict:
    """The audit's headline: where evidence went, positives' classes, AUCs, false negatives."""
    return {"evidence": audit["evidence"], "answer": audit["answer"], "auc": audit["auc"],
            "false_negatives": audit["false_negatives"], "positives": audit["positives"]}


def _without_per_question(report: dict, key: str = "per_question") -> dict:
    return {k: v for k, v in report.items() if k != key}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _ci_cell(comparison: dict | None, value: float) -> str:
    if not comparison:
        return f"{value:.3f}"
    return f"{value:.3f} ({comparison['diff']:+.3f} [{comparison['ci_low']:+.3f}, {comparison['ci_high']:+.3f}])"


def _diff_cell(comparison: dict | None) -> str:
    if not comparison:
        return "-"
    return f"{comparison['diff']:+.3f} [{comparison['ci_low']:+.3f}, {comparison['ci_high']:+.3f}]"


def render_gac_choice(choice: dict) -> list[str]:
    """The GAC-target choice (`choose_gac_target`) as markdown lines: AUCs per target, then, when the threshold was
    chosen too, each pair's pass decision."""
    by_f1 = choice.get("threshold") is not None
    if by_f1:
        decided = f"with its threshold by the evidence F1 of GAC's pass decision: **{choice['chosen']}, " \
                  f"{choice['threshold']:g}**"
    else:
        decided = f"by the evidence AUC of GAC within a round: **{choice['chosen']}**"
    lines = [f"GAC target, chosen on {choice['questions']} held-out multi-hop questions {decided} (reads their "
             "evidence titles)", "", "| GAC target | evidence AUC (rounds) | answer AUC (rounds) |", "|---|---:|---:|"]
    for target, record in choice["targets"].items():
        cells = ["-" if auc["mean"] is None else f"{auc['mean']:.3f} ({auc['rounds']})"
                 for auc in (record["evidence_auc"], record["answer_auc"])]
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    if by_f1:
        lines += ["", "| GAC target | threshold | passing candidates | evidence among them | precision | recall "
                  "| F1 |", "|---|---:|---:|---:|---:|---:|---:|"]
        for target, record in choice["targets"].items():
            for row in record["decisions"]:
                lines.append(f"| {target} | {row['threshold']:g} | {row['passing']} / {row['candidates']} | "
                             f"{row['evidence_passing']} / {row['evidence']} | {row['precision']:.2f} | "
                             f"{row['recall']:.2f} | {row['f1']:.2f} |")
    return lines


def render(results: dict) -> str:
    """Markdown tables: the summary (bare and composed side by side), the mined labels (audit), leaf dev retrieval
    (bare, composed), the gain by whether the dev evidence page was a training positive, then the agent."""
    lines = [f"Summary: leaf dev questions ({results['leaf_questions']}), bare question | composed with the parent "
             "question; each cell: value (trained minus base [95% CI])", "",
             "| retriever | kept | rows (from questions the agent saw) | "
             + " | ".join(f"{m} bare | {m} composed" for m in SUMMARY_METRICS) + " |",
             "|---|---|---|" + "---:|" * (2 * len(SUMMARY_METRICS))]
    for name, system in results["systems"].items():
        seen = system.get("seen")
        cells = [_ci_cell(system.get("vs_base", {}).get(mode, {}).get(m), system["leaf"][mode]["metrics"][m])
                 for m in SUMMARY_METRICS for mode in ("none", "parent")]
        lines.append(f"| {name} | {system.get('kept', '-')} | "
                     + (f"{seen['rows']} ({seen['from_questions_the_agent_saw']})" if seen else "-") + " | "
                     + " | ".join(cells) + " |")
    lines += ["", "Mined labels (audit of the mining rounds; reads their evidence titles)", "",
             "| rows from | rows | positive is the evidence page | evidence sampled as negative | "
             "negatives holding a gold answer | evidence AUC of LR / GAC / retriever |", "|---|---:|---:|---:|---:|---|"]
    for name, audit in results["audits"].items():
        ev, fn, auc = audit["evidence"], audit["false_negatives"]["by_candidate"], audit["auc"]["evidence"]
        aucs = " / ".join("-" if auc[s]["absent"] else f"{auc[s]['mean']:.2f}" for s in ("lr", "gac", "retriever"))
        examples = results["systems"][name]["rows"]["examples"] if name in results["systems"] else 0
        lines.append(f"| {name} | {examples} | {ev['positive_is_member']} / "
                     f"{ev['mined_rounds_with_member']} | {ev['member_as_negative']} | {fn['answer']} / "
                     f"{fn['negatives']} | {aucs} |")
    if results.get("no_rows"):
        lines += ["", f"Mined no training row, so not trained: {', '.join(results['no_rows'])} (mining_stats.json "
                  f"says which filter dropped each round); the settings search and the agent use "
                  f"**{results['primary']}**"]
    lines.append("")
    for mode, title in (("none", "bare leaf question"), ("parent", "composed with the parent question")):
        lines += [f"Leaf dev questions ({results['leaf_questions']}), {title}; each cell: value (trained minus base "
                  "[95% CI])", "", "| retriever | kept | " + " | ".join(LEAF_METRICS) + " |",
                  "|---|---|" + "---:|" * len(LEAF_METRICS)]
        for name, system in results["systems"].items():
            metrics = system["leaf"][mode]["metrics"]
            comparisons = system.get("vs_base", {}).get(mode, {})
            cells = [_ci_cell(comparisons.get(m), metrics[m]) for m in LEAF_METRICS]
            lines.append(f"| {name} | {system.get('kept', '-')} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Gain by whether the dev question's evidence page is among the training positives (reads dev evidence "
              "titles); trained minus base [95% CI]", "",
              "| retriever | dev questions | " + " | ".join(f"{m} bare | {m} composed" for m in SPLIT_METRICS) + " |",
              "|---|---|" + "---:|" * (2 * len(SPLIT_METRICS))]
    for name, system in results["systems"].items():
        for group, split in (system.get("by_training_positives") or {}).items():
            cells = [_diff_cell(split.get(mode, {}).get(m)) for m in SPLIT_METRICS for mode in ("none", "parent")]
            lines.append(f"| {name} | {group}: {split['questions']} | " + " | ".join(cells) + " |")
    lines.append("")
    agents = {n: s["agent"] for n, s in results["systems"].items() if s.get("agent")}
    if agents:
        first = next(iter(agents.values()))
        lines += [f"Agent on the multi-hop dev questions ({first['questions']}), its own queries; value (minus base "
                  "[95% CI])", "", "| retriever | " + " | ".join(AGENT_METRICS)
                  + " | searches/q | distinct queries/q | answered |", "|---|" + "---:|" * (len(AGENT_METRICS) + 3)]
        for name, report in agents.items():
            comparisons = results["systems"][name].get("agent_vs_base", {})
            cells = [_ci_cell(comparisons.get(m), report["metrics"][m]) for m in AGENT_METRICS]
            behaviour = [f"{report['metrics'].get(m, float('nan')):.2f}" for m in AGENT_BEHAVIOUR]
            lines.append(f"| {name} | " + " | ".join(cells + behaviour) + " |")
    if results.get("gac_target_choice"):
        lines += ["", *render_gac_choice(results["gac_target_choice"])]
    if results.get("rows_by_gac_setting"):
        lines += ["", *render_rows_by_gac_setting(results["rows_by_gac_setting"])]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in results["systems"] if n != "base"]
    metrics = ["answer_recall@5", "mrr@10", "recall@1"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 0.5 * len(names) + 2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for y, name in enumerate(names):
            c = results["systems"][name]["vs_base"]["parent"][metric]
            ax.errorbar(c["diff"], y, xerr=[[c["diff"] - c["ci_low"]], [c["ci_high"] - c["diff"]]], fmt="o", capsize=4)
        ax.axvline(0, color="grey", lw=1)
        ax.set_yticks(range(len(names)), names)
        ax.set_title(f"{metric}: trained minus base (95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _as_parent(row: dict) -> dict:
    """A multi-hop row (it lists its ``leaf_ids``) is the parent of its own leaves, for `split_keys`."""
    return {**row, "parent_id": row["id"]} if "leaf_ids" in row else row


def warm_start_rows(warm: WarmStartConfig) -> list[dict]:
    """The QA rows the agent's warm start reads: its `qa` less `exclude_qa` (by id), and its multi-hop questions
    (`multihop_qa`, each the parent of its own leaves)."""
    excluded = {row["id"] for _, row in iter_jsonl(warm.exclude_qa)} if warm.exclude_qa else set()
    rows = [row for _, row in iter_jsonl(warm.qa) if row["id"] not in excluded]
    if warm.multihop_qa:
        rows += [_as_parent(row) for _, row in iter_jsonl(warm.multihop_qa)]
    return rows


def check_splits(config: ExperimentConfig, data: Path, warm_rows: list[dict]) -> None:
    """Refuse to run when two of the selection slice, the mining questions, the warm start's questions and the dev
    set share a question (ids, parents, normalised questions: `assert_disjoint`)."""
    rows = {name: [_as_parent(row) for _, row in iter_jsonl(data / name)]
            for name in (config.heldout_qa, config.mining_qa, config.dev_qa)}
    rows["the warm start's questions"] = warm_rows
    names = list(rows)
    for i, left in enumerate(names):
        for right in names[i + 1:]:
            assert_disjoint(rows[left], rows[right], left, right)


def parse_arguments(argv: list[str] | None = None) -> tuple[argparse.Namespace, ExperimentConfig]:
    """``--config FILE`` and one flag per `experiment` setting (``--mining-questions 36``), which overrides the
    file's; the other sections come from the file alone."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="benchmarks/experiments/mining/mining_experiment.yaml")
    add_dataclass_arguments(parser, ExperimentConfig)
    args = parser.parse_args(argv)
    return args, build_config(ExperimentConfig, "experiment", args, args.config, ("experiment",))


def main() -> None:
    args, config = parse_arguments()
    warm = build_config(WarmStartConfig, "agent_sft", None, args.config, ("experiment",))
    rollout = build_config(RolloutConfig, "agent_rollout", None, args.config, ("experiment",))
    mine = build_config(MineJobConfig, "mine_run", None, args.config, ("experiment",))
    train = build_config(RetrieverTrainConfig, "retriever_train", None, args.config, ("experiment",))
    work, data = Path(config.workdir), Path(config.data)
    warm_rows = warm_start_rows(warm)
    check_splits(config, data, warm_rows)
    cache = work / "eval"
    cache.mkdir(parents=True, exist_ok=True)
    steps = Steps()
    corpus_path = str(data / "corpus.jsonl")

    agent_model = str(steps.run("warm-started agent", lambda: warm_start_agent(warm)))
    mining_rollout = dataclasses.replace(mining_rollout_config(rollout, config), qa=str(data / config.mining_qa),
                                         retrieval=RetrievalConfig(index=config.base_index),
                                         limit=config.mining_questions,
                                         agent=dataclasses.replace(rollout.agent, model=agent_model))
    mining_rollout = keyed_rollout(mining_rollout, work, "trajectories_mining")
    steps.run("agent rollouts on the mining questions", lambda: run_rollout_job(mining_rollout))
    job = dataclasses.replace(mine, trajectories=mining_rollout.out, retrieval=RetrievalConfig(index=config.base_index),
                              agent=dataclasses.replace(mine.agent, model=agent_model))
    gac_target_choice = None
    if config.gac_targets:
        target, criterion, threshold, gac_target_choice = steps.run(
            "GAC target chosen on held-out questions (reads their evidence titles)",
            lambda: choose_gac_target(job, rollout, config, data, work))
        selection = job.mining.selection if threshold is None else dataclasses.replace(
            job.mining.selection, gac_threshold=threshold)
        job = dataclasses.replace(job, mining=dataclasses.replace(job.mining, gac_target=target,
                                                                  gac_criterion=criterion, selection=selection))
    rows = steps.run("mining and its ablations", lambda: mine_ablations(job, work / "mining", config.ablations))
    gac_settings_rows = steps.run("rows each GAC setting mines (re-selection)", lambda: rows_by_gac_setting(
        job, work, config)) if config.gac_thresholds else None
    audits = steps.run("mining audits (read the mining questions' evidence titles)", lambda: {
        name: audit_mining(Path(path).parent, data / config.mining_qa) for name, path in rows.items()})
    corpus = Corpus.open(corpus_path)
    if config.reference:
        rows["reference: evidence positives (diagnostic)"] = steps.run("reference rows", lambda: reference_rows(
            work / "mining" / "full", data / config.mining_qa, corpus, work / "mining" / "reference_rows.jsonl",
            job.mining.selection.num_negatives))

    train = dataclasses.replace(train, corpus=corpus_path, select_on=str(data / config.heldout_qa),
                                select_parents=str(data / config.heldout_parents), select_index=config.base_index)
    mined = {name: rows_mined(path) for name, path in rows.items()}
    primary = primary_variant(mined)
    no_rows = [name for name, count in mined.items() if not count]  # reported, not trained
    if no_rows:
        print(f"mined no training row, not trained: {', '.join(no_rows)}; the settings search and the agent's "
              f"evaluation use {primary!r}")
    best, search = steps.run(f"training settings on the held-out slice ({primary})", lambda: choose_training_settings(
        dataclasses.replace(train, data=str(rows[primary]), out=str(work / "retriever" / "settings")),
        config.settings_grid))
    chosen = {k: getattr(best, k) for k in config.settings_grid}
    trainings = {name: dataclasses.replace(best, data=str(path), out=str(work / "retriever" / slug(name)))
                 for name, path in rows.items() if name != primary and name not in no_rows}
    trainings = {primary: best, **trainings}  # the primary variant's run is the settings search's best
    diagnostic = config.unselected_variant or primary
    if config.unselected and diagnostic in no_rows:
        print(f"the unselected diagnostic is not trained: {diagnostic!r} mined no row")
    elif config.unselected:
        trainings[unselected_name(diagnostic)] = dataclasses.replace(
            best, data=str(rows[diagnostic]), select_on="", select_parents="",
            out=str(work / "retriever" / slug(unselected_name(diagnostic))))
    if config.soft_label and "full" not in no_rows:
        trainings["full, soft-label loss"] = dataclasses.replace(best, data=str(rows["full"]), loss="soft_label",
                                                                 out=str(work / "retriever" / "full-soft-label"))
    # the base at the trained encoders' max length is the comparator; the quickstart index (the model's own
    # max length, 256) is shown beside it
    base_index = work / "index" / "base"
    steps.run("index: base", lambda: build_index(IndexBuildConfig(
        corpus=corpus_path, out=str(base_index), backend="dense",
        encoder=EncoderConfig(model=train.encoder.model, max_length=train.encoder.max_length),
        dense=DenseParams(type="flat"))))
    systems: dict[str, dict] = {"base": {"index": str(base_index), "kept": "base"},
                                "base, max length 256 (quickstart index)": {"index": config.base_index, "kept": "base"}}
    # identical rows, loss and selection train the same model: reuse it
    trained_by_rows: dict[tuple[str, str, str], str] = {}
    for name, settings in trainings.items():
        key = (Path(settings.data).read_text(), settings.loss, settings.select_on)
        same = trained_by_rows.get(key)
        if same is not None:
            systems[name] = {**systems[same], "same_rows_as": same}
            continue
        trained_by_rows[key] = name
        model = steps.run(f"train: {name}", lambda: train_retriever(settings))
        manifest = read_json(Path(model) / "train_manifest.json")
        out = work / "index" / slug(name)
        steps.run(f"index: {name}", lambda: build_index(IndexBuildConfig(
            corpus=corpus_path, out=str(out), backend="dense", encoder=EncoderConfig(model=str(model)),
            dense=DenseParams(type="flat"))))
        kept = (manifest.get("selection") or {}).get("kept") or "last epoch"
        systems[name] = {"index": str(out), "model": str(model), "kept": kept, "rows": manifest["data"],
                         "updates": manifest["updates"]}

    for name, system in systems.items():
        system["leaf"] = steps.run(f"evaluate: {name}", lambda: leaf_reports(system["index"], config, data, cache))
    base = systems["base"]
    for name, system in systems.items():
        if name != "base":
            system["vs_base"] = {mode: compare_reports(base["leaf"][mode], system["leaf"][mode], LEAF_METRICS,
                                                       num_samples=config.bootstrap_samples)
                                 for mode in ("none", "parent")}
    for name, settings in trainings.items():  # evaluation side: reads the dev questions' evidence titles
        systems[name]["seen"] = rows_from_seen_questions(Path(settings.data), data / config.mining_qa, warm_rows)
        systems[name]["by_training_positives"] = gain_by_training_positives(
            base["leaf"], systems[name]["leaf"], data / config.dev_qa, positive_titles(Path(settings.data), corpus),
            SPLIT_METRICS, config.bootstrap_samples)
    if config.agent_eval_questions:
        for name in agent_systems(systems, primary):
            systems[name]["agent"] = steps.run(f"agent on multi-hop dev: {name}", lambda: agent_report(
                systems[name]["index"], agent_model, rollout, config, data, work))
            if name != "base":
                systems[name]["agent_vs_base"] = compare_agents(base["agent"], systems[name]["agent"],
                                                                config.bootstrap_samples)
    for system in systems.values():  # per-question records stay in the eval/ and agent/ folders
        system["leaf"] = {mode: _without_per_question(report) for mode, report in system["leaf"].items()}
        if system.get("agent"):
            system["agent"] = _without_per_question(system["agent"])
    results: dict = {
        "leaf_questions": base["leaf"]["none"]["questions_evaluated"], "chosen_settings": chosen,
        "settings_search": search, "gac_target_choice": gac_target_choice, "rows_by_gac_setting": gac_settings_rows,
        "primary": primary, "no_rows": no_rows,
        "audits": {n: _audit_summary(a) for n, a in audits.items()}, "systems": systems,
        "mining_rounds": {n: read_json(Path(p).parent / "mining_stats.json")["rounds"] for n, p in rows.items()
                          if (Path(p).parent / "mining_stats.json").is_file()},
        "step_seconds": steps.seconds, "device": describe_device(),
    }
    write_json(work / "results.json", results)
    table = render(results)
    with atomic_write(work / "results.md") as f:
        f.write(table)
    plot(results, work / "results.png")
    print("\n" + table + f"\nwrote {work / 'results.json'}, {work / 'results.md'}, {work / 'results.png'}")


if __name__ == "__main__":
    main()
