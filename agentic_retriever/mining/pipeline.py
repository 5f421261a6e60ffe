"""Utility mining end to end: trajectories -> retriever_train.jsonl (agentic_r.txt section 4.1.1; ARCHITECTURE.md
"Data flow"). `mine` runs the stages, each a module of this package:

1. rounds (`rounds`): one per search call, index < ``round_index_limit``;
2. candidates (`candidates`): top ``num_candidates`` (20) from the current retriever R_{i-1};
3. sub-answers (`sub_answers`): one scorer call per trajectory (Figure 8);
4. local relevance (`scorers`): listwise LR (Figures 6/7, windows, one retry) or the pointwise likelihood
   scorer (a deviation, for small scorers);
5. global answer correctness (`gac`): the agent continued from each round with each candidate (Eqs. 2-3), or
   the answer-likelihood option, graded by a criterion (`gac.gac_value`);
6. selection (`selection`): candidates passing the GAC and LR thresholds, ranked by LR then retriever rank; 15
   sampled negatives that pass neither GAC nor LR and (with the false-negative filter) hold no gold answer.

Mining reads the trajectories' questions and gold answers, never evidence labels (a QA file's
``supporting_titles``): `tests/test_mining_pipeline.py` mines rows whose evidence fields are absent. Besides
the rows it writes ``rounds.jsonl``: per round its candidates with retriever rank and score, LR, graded GAC,
whether each passed GAC, contains a gold answer, and its role (positive, negative, excluded), which the
audit (`audit`, evaluation side) joins with evidence labels.

Stages 2-5 keep their per-item results in `store.StageStore` files under ``<out>/stages/``, keyed by a hash of
each item's inputs and of the settings that change it. A run computes only what is missing: a killed run
resumes where it stopped, and changing a setting recomputes the stages it affects and no other (the LR
window: local relevance only; a selection setting: nothing). The outputs (``retriever_train.jsonl``,
``mining_stats.json``, ``mining_stats.png``) are rebuilt from the stores at the end of every run and written
atomically, so they never hold duplicated or half-written rows. The stage files double as the audit trail:
every raw scorer output (each listwise attempt, each sub-answer generation) and every continuation's answer,
further searches and finish reason are there, with each item's share of the calls, tokens and seconds. Models are identified by their names (with
the settings): give a retrained model a new name or path, or the stores will serve the old one's results.

Sharding: ``shard=(i, n)`` mines the i-th of n contiguous slices of the trajectory file into
``<out>/shards/<i>-of-<n>/`` (separate stores, so shards run in parallel); `merge_shards` concatenates them
into ``<out>/`` in file order, which gives the same rows as one unsharded run (negative sampling is seeded
per round, not per run).

Cost control beyond the paper: rounds with fewer candidates than 1 + ``num_negatives`` are dropped before
scoring (``too_few_candidates``: selection would drop them); with ``skip_hopeless_gac`` rounds whose best
LR is below the threshold get no GAC rollouts (``lr_below_threshold``: no candidate could be a positive, so
the rows are the same; only the GAC statistics then cover the rounds that were rolled out); with
``selection.require_answer_in_positive`` rounds where no candidate contains a gold answer get neither LR nor
GAC (``no_answer_candidate``: they could give no positive).

    result = mine("runs/x/iter_1/trajectories.jsonl", client, agent_llm, scorer_llm, MiningConfig(),
                  "runs/x/iter_1/mining")
    result.rows_path, result.stats["rows"]
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from tqdm.auto import tqdm

from ..client import RetrievalClient
from ..jsonl import DataFormatError, iter_jsonl, read_json, write_json
from .candidates import passage_from_record, passage_record, retrieve_candidates
from ..eval.qa import contains_match
from .environment import EnvConfig, Trajectory
from .gac import DEFAULT_GAC_THRESHOLDS, GACRequest, answer_likelihood_gac, gac_value, rollout_gac
from .prompts import PROMPT_VERSION, passage_text
from .rounds import Round, extract_rounds, search_queries
from .scorers import ListwiseScorer, PointwiseLikelihoodScorer, RelevanceRequest
from .selection import Candidate, SelectionConfig, select_passages
from .stats import STAGES, add_counters, lr_bin, new_counters, plot_stats, summarize
from .store import StageStore, stable_hash
from .sub_answers import SubAnswerGenerator, SubAnswerRequest
from .usage import CountingLLM, Usage

__all__ = ["MiningConfig", "MiningResult", "merge_shards", "mine", "parse_shard", "shard_dir"]

log = logging.getLogger(__name__)

ROWS_FILE, STATS_FILE, PLOT_FILE = "retriever_train.jsonl", "mining_stats.json", "mining_stats.png"
ROUNDS_FILE = "rounds.jsonl"
#: Bumped when a stage's computation changes, so stored results of the old code are not reused.
STAGE_VERSIONS = {"candidates": 1, "sub_answers": 1, "local_relevance": 2, "gac": 2}


def _agentic_r_env() -> EnvConfig:
    return EnvConfig(max_turns=5)


@dataclass
class MiningConfig:
    """Settings of utility mining (defaults: the paper and its release; see the package modules for each)."""

    dataset: str = field(default="", metadata={"help": "the rows' 'dataset' field; empty: the trajectory file's name"})
    retriever_id: str = field(default="", metadata={
        "help": "identity of the candidate retriever R_{i-1} in the cache keys; empty: each trajectory's 'retriever'"})
    num_candidates: int = field(default=20, metadata={"help": "candidate passages per round (paper: 20)"})
    round_index_limit: int = field(default=5, metadata={"help": "rounds with 1-based index >= this are skipped"})
    retrieval_batch_rounds: int = field(default=1024, metadata={"help": "rounds per retrieval call"})
    use_sub_answers: bool = field(default=True, metadata={
        "help": "generate sub-answers (Figure 8) and score with Figure 6 where one exists"})
    sub_answer_max_new_tokens: int = field(default=256, metadata={"help": "tokens of a sub-answer generation"})
    lr_scorer: Literal["listwise", "pointwise", "retriever", "none"] = field(default="listwise", metadata={
        "help": "listwise: Figures 6/7 (paper); pointwise: likelihood scorer for small models (deviation); "
                "retriever: 100 x the retriever's cosine (a baseline); none: no LR (the 'w/o LR' ablation)"})
    lr_window: int = field(default=10, metadata={"help": "passages per listwise prompt (release 10; paper text 20)"})
    lr_retries: int = field(default=1, metadata={"help": "new tries of a listwise window that does not parse"})
    lr_retry_temperature: float = field(default=0.7, metadata={"help": "sampling temperature of a retry"})
    lr_max_new_tokens: int = field(default=128, metadata={"help": "tokens of one listwise answer"})
    pointwise_mode: Literal["judgement", "query_likelihood"] = field(default="judgement", metadata={
        "help": "pointwise LR: p(Yes) of a relevance judgement, or the query's likelihood given the passage"})
    lr_scale: Literal["absolute", "round_posterior"] = field(default="absolute", metadata={
        "help": "query_likelihood LR: 100 exp(mean log p(q|d)) (absolute), or 100 p(d | q) over the round's "
                "candidates with a uniform prior (round_posterior: calibrated, so a threshold means something)"})
    scorer_batch_prompts: int = field(default=512, metadata={"help": "scorer prompts per generate/score call"})
    gac_mode: Literal["rollout", "answer_likelihood"] = field(default="rollout", metadata={
        "help": "rollout: continue the agent, EM of its answer (paper); answer_likelihood: p(gold) (REPLUG-style)"})
    gac_metric: Literal["em", "contains"] = field(default="em", metadata={
        "help": "rollout GAC: exact match (paper) or contains-match on word boundaries"})
    answer_lead: str = field(default="<answer>", metadata={"help": "answer_likelihood: text before the gold"})
    gac_criterion: Literal["sequence", "per_token", "gain"] = field(default="gain", metadata={
        "help": "answer_likelihood: graded GAC = p(gold), its per-token geometric mean, or the per-token "
                "log-prob gain over no passage (see mining/gac.py)"})
    gac_batch_pairs: int = field(default=1024, metadata={"help": "(round, candidate) continuations per rollout call"})
    skip_hopeless_gac: bool = field(default=True, metadata={
        "help": "no GAC for rounds whose best LR is below the threshold (same rows, less compute)"})
    plot: bool = field(default=True, metadata={"help": "draw mining_stats.png"})
    progress: bool = field(default=True, metadata={"help": "progress bars"})
    env: EnvConfig = field(default_factory=_agentic_r_env)
    selection: SelectionConfig = field(default_factory=SelectionConfig)

    def validate(self) -> None:
        for name in ("num_candidates", "round_index_limit", "retrieval_batch_rounds", "sub_answer_max_new_tokens",
                     "lr_window", "lr_max_new_tokens", "scorer_batch_prompts", "gac_batch_pairs"):
            if getattr(self, name) < 1:
                raise ValueError(f"MiningConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.lr_retries < 0:
            raise ValueError(f"MiningConfig.lr_retries must be >= 0, got {self.lr_retries}")
        for name, choices in (("lr_scorer", ("listwise", "pointwise", "retriever", "none")),
                              ("gac_mode", ("rollout", "answer_likelihood")),
                              ("gac_criterion", ("sequence", "per_token", "gain")),
                              ("lr_scale", ("absolute", "round_posterior")),
                              ("gac_metric", ("em", "contains")), ("pointwise_mode", ("judgement", "query_likelihood"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"MiningConfig.{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        self.resolved_selection().validate()

    def resolved_selection(self) -> SelectionConfig:
        """The selection settings with the GAC threshold of the GAC criterion filled in, and LR off when
        ``lr_scorer`` is ``none``."""
        selection = self.selection
        if self.lr_scorer == "none":
            selection = replace(selection, use_lr=False)
        if selection.gac_threshold is None:
            criterion = "rollout" if self.gac_mode == "rollout" else self.gac_criterion
            selection = replace(selection, gac_threshold=DEFAULT_GAC_THRESHOLDS[criterion])
        return selection

    @property
    def needs_scorer_llm(self) -> bool:
        """Whether LR (or the sub-answers) needs the scorer LLM."""
        return self.resolved_selection().use_lr and self.lr_scorer in ("listwise", "pointwise")


@dataclass
class MiningResult:
    """Where a mining run (or a merge) wrote its outputs, and its statistics."""

    out_dir: Path
    rows_path: Path
    stats_path: Path
    plot_path: Path | None
    rows: int
    stats: dict


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (0-based i) as (i, n)."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"a shard is written i/n (e.g. 0/4), got {text!r}") from None
    _check_shard((i, n))
    return i, n


def _check_shard(shard: tuple[int, int]) -> tuple[int, int]:
    i, n = shard
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard}")
    return i, n


def shard_dir(out_dir: str | os.PathLike, shard: tuple[int, int]) -> Path:
    """Where shard (i, n) writes: ``out_dir`` itself for (0, 1), else ``out_dir/shards/<i>-of-<n>``."""
    i, n = _check_shard(shard)
    return Path(out_dir) if n == 1 else Path(out_dir) / "shards" / f"{i}-of-{n}"


def _read_shard(path: str | os.PathLike, shard: tuple[int, int]) -> tuple[list[Trajectory], int]:
    """The trajectories of contiguous slice i of n (non-blank lines), and the file's total."""
    i, n = shard
    with open(path, encoding="utf-8") as handle:
        total = sum(1 for line in handle if line.strip())
    start, stop = i * total // n, (i + 1) * total // n
    trajectories = [Trajectory.from_json(row, path, line) for line, row in iter_jsonl(path, start, stop)]
    seen: set[str] = set()
    for t in trajectories:
        if t.question_id in seen:
            raise DataFormatError(path, None, f"question id {t.question_id!r} appears twice", field="question_id")
        seen.add(t.question_id)
    return trajectories, total


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class _Miner:
    """One mining run over one shard: the stages in order, sharing stores, counters and LLM usage."""

    def __init__(self, config: MiningConfig, client: RetrievalClient | None, agent: CountingLLM | None,
                 scorer: CountingLLM | None, stores: dict[str, StageStore]):
        self.config, self.client, self.agent, self.scorer, self.stores = config, client, agent, scorer, stores
        self.selection = config.resolved_selection()
        self.counters = new_counters()
        self.dropped: dict[str, str] = {}  # round id -> reason
        self.charged: set[tuple[str, str]] = set()  # (stage, key) whose cost is in the statistics

    # plumbing -----------------------------------------------------------------------------------------------

    def _drop(self, round_id: str, reason: str) -> None:
        self.dropped[round_id] = reason
        self.counters["dropped"][reason] = self.counters["dropped"].get(reason, 0) + 1

    def _run_stage(self, stage: str, items: Sequence[tuple[str, Any]], chunk_size: int,
                   compute: Callable[[list[Any]], list[dict]], llm: CountingLLM | None) -> None:
        """Compute and store the records of the keys the stage's store lacks, `chunk_size` items per batch."""
        store, this = self.stores[stage], self.counters["this_run"][stage]
        unique = dict(items)
        todo = [(key, item) for key, item in unique.items() if key not in store]
        this["reused"] += len(unique) - len(todo)
        with tqdm(total=len(todo), desc=stage.replace("_", " "), unit=" item",
                  disable=not self.config.progress or not todo) as bar:
            for chunk in _chunks(todo, chunk_size):
                before = llm.usage.copy() if llm is not None else Usage()
                started = time.perf_counter()
                records = compute([item for _, item in chunk])
                seconds = time.perf_counter() - started
                # a stage without an LLM (candidates) makes one retrieval call per batch, one query per item
                used = llm.usage.minus(before) if llm is not None else Usage(calls=1, sequences=len(chunk))
                spent = {"calls": used.calls, "sequences": used.sequences, "prompt_tokens": used.prompt_tokens,
                         "completion_tokens": used.completion_tokens, "seconds": seconds}
                share = {k: v / len(chunk) for k, v in spent.items()}
                store.put((key, {**record, "_cost": share}) for (key, _), record in zip(chunk, records))
                add_counters(this, {"computed": len(chunk), **spent})
                bar.update(len(chunk))

    def _record(self, stage: str, key: str) -> dict:
        """A stored record; its cost is added to the statistics once per key."""
        record = self.stores[stage].get(key)
        if record is None:
            raise RuntimeError(f"stage {stage}: no stored result for key {key} (was the store changed meanwhile?)")
        if (stage, key) not in self.charged:
            self.charged.add((stage, key))
            add_counters(self.counters["cost"][stage], record.get("_cost", {}))
        return record

    # keys ---------------------------------------------------------------------------------------------------

    def candidates_key(self, rnd: Round) -> str:
        retriever = self.config.retriever_id or rnd.retriever
        return stable_hash(["candidates", STAGE_VERSIONS["candidates"], rnd.query, rnd.question, retriever,
                            self.config.num_candidates])

    def sub_answers_key(self, trajectory: Trajectory, generator: SubAnswerGenerator) -> str:
        return stable_hash(["sub_answers", STAGE_VERSIONS["sub_answers"], trajectory.question,
                            trajectory.golden_answers, trajectory.response_text, len(search_queries(trajectory)),
                            generator.settings()])

    def lr_key(self, rnd: Round, sub_answer: str | None, scorer) -> str:
        return stable_hash(["local_relevance", STAGE_VERSIONS["local_relevance"], rnd.query,
                            self.candidates_key(rnd), sub_answer, scorer.settings()])

    def gac_key(self, rnd: Round) -> str:
        config = self.config
        env = {k: v for k, v in asdict(config.env).items() if k != "store_token_ids"}
        mode = ([config.gac_mode, config.gac_metric] if config.gac_mode == "rollout"
                else [config.gac_mode, config.answer_lead])
        return stable_hash(["gac", STAGE_VERSIONS["gac"], rnd.fingerprint, rnd.question, rnd.golden_answers,
                            self.candidates_key(rnd), self.agent.name, env, mode])

    # stages -------------------------------------------------------------------------------------------------

    def rounds(self, trajectories: Sequence[Trajectory]) -> list[Round]:
        config = self.config
        rollout_gac_on = self.selection.use_gac and config.gac_mode == "rollout"
        out = []
        for trajectory in trajectories:
            if rollout_gac_on and trajectory.dialect != config.env.dialect:
                raise ValueError(f"trajectory {trajectory.question_id} was rolled out in dialect "
                                 f"{trajectory.dialect!r}, but GAC continues it with {config.env.dialect!r}")
            rounds, drops = extract_rounds(trajectory, config.round_index_limit,
                                           config.env.max_turns if rollout_gac_on else None)
            self.counters["rounds_in"] += len(rounds) + len(drops)
            for drop in drops:
                self._drop(drop.round_id, drop.reason)
            out.extend(rounds)
        return out

    def candidates(self, rounds: list[Round]) -> list[Round]:
        """Retrieve (or reuse) every round's candidates; the rounds with enough of them go on."""
        def compute(batch: list[Round]) -> list[dict]:
            hits = retrieve_candidates(self.client, batch, self.config.num_candidates)
            return [{"passages": [passage_record(p) for p in passages]} for passages in hits]

        self._run_stage("candidates", [(self.candidates_key(r), r) for r in rounds],
                        self.config.retrieval_batch_rounds, compute, None)
        needed = 1 + self.selection.num_negatives
        kept = []
        for rnd in rounds:
            record = self._record("candidates", self.candidates_key(rnd))
            if len(record["passages"]) < needed:
                self._drop(rnd.id, "too_few_candidates")
            elif self.selection.require_answer_in_positive and not any(self.contains_answer(rnd)):
                self._drop(rnd.id, "no_answer_candidate")
            else:
                kept.append(rnd)
        return kept

    def contains_answer(self, rnd: Round) -> list[bool]:
        """Per candidate: does it hold a gold answer (normalised, word-bounded; title and text)?"""
        passages = self.stores["candidates"].get(self.candidates_key(rnd))["passages"]
        return [bool(contains_match(f"{p['title']}\n{p['text']}", list(rnd.golden_answers))) for p in passages]

    def sub_answers(self, trajectories: Sequence[Trajectory], rounds: list[Round]) -> dict[str, str | None]:
        """Round id -> its sub-answer (None: "Not Sure", unparsable, or sub-answers off)."""
        if not (self.config.needs_scorer_llm and self.config.use_sub_answers):
            return {r.id: None for r in rounds}
        generator = SubAnswerGenerator(self.scorer, self.config.sub_answer_max_new_tokens)
        wanted = {r.question_id for r in rounds}
        items = []
        for trajectory in trajectories:
            if trajectory.question_id in wanted:
                request = SubAnswerRequest(trajectory.question, tuple(trajectory.golden_answers),
                                           trajectory.response_text, len(search_queries(trajectory)))
                items.append((self.sub_answers_key(trajectory, generator), (trajectory.question_id, request)))
        self._run_stage("sub_answers", items, self.config.scorer_batch_prompts,
                        lambda batch: generator.generate([request for _, request in batch]), self.scorer)
        answers: dict[str, list[str | None]] = {}
        for key, (question_id, _) in items:
            answers[question_id] = self.stores["sub_answers"].get(key)["answers"]
        return {r.id: answers[r.question_id][r.round_index - 1] for r in rounds}

    def _scorer(self):
        config = self.config
        if config.lr_scorer == "listwise":
            return ListwiseScorer(self.scorer, config.lr_window, config.lr_retries, config.lr_retry_temperature,
                                  config.lr_max_new_tokens)
        return PointwiseLikelihoodScorer(self.scorer, config.pointwise_mode)

    def local_relevance(self, rounds: list[Round], sub_answers: dict[str, str | None]) -> tuple[list[Round], Any]:
        """Score every round's candidates (or reuse the scores); the rounds with scores go on."""
        if not self.selection.use_lr:
            return rounds, None
        if self.config.lr_scorer == "retriever":
            return rounds, _RetrieverScores()
        scorer = self._scorer()
        k = self.config.num_candidates
        per_round = -(-k // self.config.lr_window) if scorer.kind == "listwise" else 2 * k
        chunk = max(1, self.config.scorer_batch_prompts // per_round)

        def compute(batch: list[Round]) -> list[dict]:
            requests = []
            for rnd in batch:
                passages = self.stores["candidates"].get(self.candidates_key(rnd))["passages"]
                requests.append(RelevanceRequest(rnd.query, tuple(passage_text(passage_from_record(p))
                                                                  for p in passages), sub_answers[rnd.id]))
            return scorer.score(requests)

        self._run_stage("local_relevance", [(self.lr_key(r, sub_answers[r.id], scorer), r) for r in rounds], chunk,
                        compute, self.scorer)
        kept = []
        for rnd in rounds:
            record = self.stores["local_relevance"].get(self.lr_key(rnd, sub_answers[rnd.id], scorer))
            if record["scores"] is None:
                self._drop(rnd.id, "lr_parse_failed")
            elif (self.selection.use_gac and self.config.skip_hopeless_gac
                  and max(record["scores"]) < self.selection.lr_threshold):
                self._drop(rnd.id, "lr_below_threshold")
            else:
                kept.append(rnd)
        return kept, scorer

    def gac(self, rounds: list[Round]) -> list[Round]:
        if not self.selection.use_gac:
            return rounds
        config = self.config

        def compute(batch: list[Round]) -> list[dict]:
            requests = [GACRequest(rnd, tuple(passage_from_record(p) for p in
                                              self.stores["candidates"].get(self.candidates_key(rnd))["passages"]))
                        for rnd in batch]
            if config.gac_mode == "rollout":
                return rollout_gac(requests, self.agent, self.client, config.env, config.gac_metric)
            return answer_likelihood_gac(requests, self.agent, config.env, config.answer_lead)

        chunk = max(1, config.gac_batch_pairs // config.num_candidates)
        self._run_stage("gac", [(self.gac_key(r), r) for r in rounds], chunk, compute, self.agent)
        return rounds

    # selection and outputs ------------------------------------------------------------------------------------

    def select(self, trajectories: Sequence[Trajectory], rounds: list[Round], sub_answers: dict[str, str | None],
               scorer, dataset: str) -> tuple[list[dict], list[dict]]:
        """(rows, round records) of the rounds that have candidates, in trajectory and round order; statistics of
        every stage."""
        self._sub_answer_stats(trajectories, rounds)
        rows, records = [], []
        threshold = self.selection.gac_threshold
        for rnd in rounds:
            candidates = self._record("candidates", self.candidates_key(rnd))["passages"]
            lr = gac = None
            if isinstance(scorer, _RetrieverScores):
                lr = scorer.scores(candidates)
            elif scorer is not None:
                record = self._record("local_relevance", self.lr_key(rnd, sub_answers[rnd.id], scorer))
                lr = self._lr_stats(record)
                if lr is not None and self.config.lr_scale == "round_posterior":
                    lr = self.round_posterior(rnd, record)
            if self.selection.use_gac and rnd.id not in self.dropped:
                gac = self._gac_stats(self._record("gac", self.gac_key(rnd)))
            answers = self.contains_answer(rnd)
            table = [Candidate(p["id"], lr[j] if lr is not None else None, gac[j] if gac is not None else None,
                               j + 1, answers[j]) for j, p in enumerate(candidates)]
            if rnd.id in self.dropped:  # by local relevance
                records.append(_round_record(rnd, candidates, table, threshold, {}, self.dropped[rnd.id]))
                continue
            result = select_passages(table, self.selection, rnd.id)
            records.append(_round_record(rnd, candidates, table, threshold, result.roles, result.drop_reason))
            if result.drop_reason is not None:
                self._drop(rnd.id, result.drop_reason)
                continue
            self.counters["rounds_mined"] += 1
            positives = str(len(result.examples))
            self.counters["positives_per_round"][positives] = self.counters["positives_per_round"].get(positives, 0) + 1
            for example in result.examples:
                rows.append(self._row(rnd, dataset, [example.positive, *example.negatives]))
        self.counters["rows"] = len(rows)
        return rows, records

    def _row(self, rnd: Round, dataset: str, passages: list[Candidate]) -> dict:
        """One training row in Agentic-R's released format (ARCHITECTURE.md "File formats"), plus each passage's
        graded GAC value (``gac``) for soft-label training."""
        threshold = self.selection.gac_threshold
        return {
            "dataset": dataset, "query_id": rnd.question_id, "question": rnd.question, "round_index": rnd.round_index,
            "history_queries": list(rnd.history_queries), "query_text": rnd.query,
            "passage_ids": [c.passage_id for c in passages],
            "scores": [{"em": None if c.gac is None else int(c.gac >= threshold),
                        "local_utility": None if c.lr is None else round(c.lr / 100, 4),
                        "gac": c.gac} for c in passages],
        }

    def _sub_answer_stats(self, trajectories: Sequence[Trajectory], rounds: list[Round]) -> None:
        if not (self.config.needs_scorer_llm and self.config.use_sub_answers):
            return
        generator = SubAnswerGenerator(self.scorer, self.config.sub_answer_max_new_tokens)
        wanted = {r.question_id for r in rounds}
        counts = self.counters["sub_answers"]
        for trajectory in trajectories:
            if trajectory.question_id not in wanted:
                continue
            record = self._record("sub_answers", self.sub_answers_key(trajectory, generator))
            counts["trajectories"] += 1
            counts["ok" if record["status"] == "ok" else "count_mismatch"] += 1
            counts["queries"] += len(record["answers"])
            counts["given"] += sum(a is not None for a in record["answers"])

    def _lr_stats(self, record: dict) -> list[float] | None:
        counts = self.counters["local_relevance"]
        counts["rounds"] += 1
        counts["with_sub_answer" if record["template"] == "with_sub_answer" else "without_sub_answer"] += 1
        for window in record.get("windows", []):
            counts["windows"] += 1
            if window["status"] != "ok":
                counts["windows_failed"] += 1
            elif len(window["outputs"]) == 1:
                counts["windows_first_try"] += 1
            else:
                counts["windows_after_retry"] += 1
        for score in record["scores"] or []:
            counts["histogram"][lr_bin(score)] += 1
        return record["scores"]

    def round_posterior(self, rnd: Round, record: dict) -> list[float]:
        """UPR's re-ranking as a calibrated LR: 100 x p(d | q) = 100 p(q | d) / sum over the round's candidates
        of p(q | d') (a uniform prior), from the stored mean token log-probabilities and the query's length."""
        if record.get("template") != "pointwise:query_likelihood":
            raise ValueError("lr_scale round_posterior needs the query_likelihood LR scorer")
        tokens = len(self.scorer.tokenizer.encode(rnd.query, add_special_tokens=False))
        totals = [mean * tokens for (mean,) in record["logprobs"]]
        top = max(totals)
        weights = [math.exp(t - top) for t in totals]
        return [round(100.0 * w / sum(weights), 4) for w in weights]

    def gac_values(self, record: dict) -> list[float]:
        """Graded GAC per candidate: the rollout's score, or the answer likelihood by the configured criterion."""
        return record["gac"] if self.config.gac_mode == "rollout" else gac_value(record, self.config.gac_criterion)

    def _gac_stats(self, record: dict) -> list[float]:
        counts, threshold = self.counters["gac"], self.selection.gac_threshold
        values = self.gac_values(record)
        correct = [value >= threshold for value in values]
        counts["rounds"] += 1
        counts["candidates"] += len(correct)
        counts["correct"] += sum(correct)
        counts["rounds_with_correct"] += int(any(correct))
        counts["further_searches"] += sum(record.get("further_searches", []))
        counts["no_answer"] += sum(a is None for a in record.get("answers", []))
        return values


class _RetrieverScores:
    """LR from the candidate retriever itself: 100 x its score, clamped to 0..100 (cosine for dense indexes).
    A baseline for the audit: it can only agree with the ranking mining starts from."""

    name = "retriever score"

    @staticmethod
    def scores(passages: list[dict]) -> list[float]:
        return [round(min(100.0, max(0.0, 100.0 * p["score"])), 2) for p in passages]


def _round_record(rnd: Round, passages: list[dict], table: list[Candidate], gac_threshold: float | None,
                  roles: dict[str, str], drop_reason: str | None) -> dict:
    """One line of ``rounds.jsonl``: the round's candidate table with each candidate's role."""
    return {
        "round_id": rnd.id, "question_id": rnd.question_id, "question": rnd.question,
        "round_index": rnd.round_index, "query": rnd.query,
        "status": "dropped" if drop_reason else "mined", "drop_reason": drop_reason,
        "candidates": [{"id": c.passage_id, "title": p["title"], "rank": c.rank, "score": round(p["score"], 6),
                        "lr": c.lr, "gac": c.gac,
                        "gac_pass": None if c.gac is None or gac_threshold is None else c.gac >= gac_threshold,
                        "contains_answer": c.contains_answer, "role": roles.get(c.passage_id)}
                       for c, p in zip(table, passages)],
    }


def _open_stores(folder: Path) -> dict[str, StageStore]:
    stores: dict[str, StageStore] = {}
    try:
        for stage in STAGES:
            stores[stage] = StageStore(folder / f"{stage}.jsonl")
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    return stores


def mine(trajectories_path: str | os.PathLike, client: RetrievalClient | None, agent_llm, scorer_llm,
         config: MiningConfig | None = None, out_dir: str | os.PathLike = "mining",
         shard: tuple[int, int] = (0, 1)) -> MiningResult:
    """Mine retriever training rows from agent trajectories (section 4.1.1); see the module docstring.

    `client` is the current retriever R_{i-1} (candidates, and the later searches of GAC rollouts);
    `agent_llm` the agent that produced the trajectories (GAC; unused with ``use_gac=False``); `scorer_llm` the
    sub-answer and LR model (unused with ``use_lr=False``; needs ``score`` for the pointwise scorer). Writes
    ``retriever_train.jsonl``, ``mining_stats.json`` and ``mining_stats.png`` to `shard_dir(out_dir, shard)`.
    """
    config = config or MiningConfig()
    config.validate()
    selection = config.resolved_selection()
    if client is None:
        raise ValueError("mining needs a retrieval client (the candidates come from the current retriever)")
    if selection.use_gac and agent_llm is None:
        raise ValueError("GAC needs the agent LLM (or turn it off: selection.use_gac=False, the 'w/o GAC' ablation)")
    if config.needs_scorer_llm and scorer_llm is None:
        raise ValueError(f"{config.lr_scorer} LR needs a scorer LLM (or use lr_scorer 'retriever', or 'none': "
                         "the 'w/o LR' ablation)")
    agent = CountingLLM(agent_llm) if agent_llm is not None else None
    scorer = CountingLLM(scorer_llm) if scorer_llm is not None else None
    if selection.use_lr and config.lr_scorer == "pointwise" and not scorer.can_score:
        raise ValueError(f"the pointwise LR scorer needs log-probabilities: {scorer.name} has no score()")
    if selection.use_gac and config.gac_mode == "answer_likelihood" and not agent.can_score:
        raise ValueError(f"answer-likelihood GAC needs log-probabilities: {agent.name} has no score()")
    started = time.perf_counter()
    work = shard_dir(out_dir, shard)
    trajectories, total = _read_shard(trajectories_path, shard)
    log.info("mining %d of %d trajectories from %s (shard %d/%d) into %s", len(trajectories), total,
             trajectories_path, shard[0], shard[1], work)
    stores = _open_stores(work / "stages")
    try:
        miner = _Miner(config, client, agent, scorer, stores)
        miner.counters["trajectories"] = len(trajectories)
        with_candidates = miner.candidates(miner.rounds(trajectories))
        sub_answers = miner.sub_answers(trajectories, with_candidates)
        scored, scorer_used = miner.local_relevance(with_candidates, sub_answers)
        miner.gac(scored)
        rows, round_records = miner.select(trajectories, with_candidates, sub_answers, scorer_used,
                                           config.dataset or Path(trajectories_path).stem)
    finally:
        for store in stores.values():
            store.close()
    info = _info(config, selection, scorer_used, agent, scorer, shard, total, time.perf_counter() - started)
    return _write_outputs(work, rows, round_records, summarize(miner.counters, info), config.plot)


def _info(config: MiningConfig, selection: SelectionConfig, scorer_used, agent, scorer, shard, total: int,
          seconds: float) -> dict:
    return {
        "prompt_version": PROMPT_VERSION,
        "lr_scorer": scorer_used.name if scorer_used is not None else None,
        "scorer_model": scorer.name if scorer is not None else None,
        "agent_model": agent.name if agent is not None else None,
        "gac_mode": (f"{config.gac_mode} ({config.gac_metric})" if config.gac_mode == "rollout"
                     else f"{config.gac_mode} ({config.gac_criterion})") if selection.use_gac else None,
        "selection": asdict(selection),
        "shard": list(shard),
        "trajectories_in_file": total,
        "wall_seconds": round(seconds, 3),
        "config": asdict(config),
    }


def _write_outputs(work: Path, rows: list[dict], round_records: list[dict], stats: dict, plot: bool) -> MiningResult:
    from ..jsonl import write_jsonl

    rows_path, stats_path = work / ROWS_FILE, work / STATS_FILE
    write_jsonl(rows_path, rows)
    write_jsonl(work / ROUNDS_FILE, round_records)
    write_json(stats_path, stats)
    plot_path = None
    if plot:
        plot_path = work / PLOT_FILE
        plot_stats(stats, plot_path)
    log.info("wrote %d rows to %s and statistics to %s", len(rows), rows_path, stats_path)
    return MiningResult(work, rows_path, stats_path, plot_path, len(rows), stats)


def _settings(value):
    """A config without the settings that do not change results (progress bars, plotting)."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in ("progress", "plot")}
    return value


def merge_shards(out_dir: str | os.PathLike, num_shards: int, plot: bool = True) -> MiningResult:
    """Join the outputs of shards 0..num_shards-1 of `out_dir` into `out_dir` (rows in file order, counters added).

    Every shard must have finished (its ``retriever_train.jsonl`` and ``mining_stats.json`` exist; a missing
    one is named in the error) with the same settings and models.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    folders = [shard_dir(out_dir, (i, num_shards)) for i in range(num_shards)]
    missing = [str(f) for f in folders if not (f / ROWS_FILE).exists() or not (f / STATS_FILE).exists()]
    if missing:
        raise FileNotFoundError(f"shards not finished (no {ROWS_FILE} / {STATS_FILE}): {', '.join(missing)}")
    rows, round_records, counters, first, seconds = [], [], new_counters(), None, 0.0
    for folder in folders:
        stats = read_json(folder / STATS_FILE)
        first = first or stats
        for name in ("config", "prompt_version", "scorer_model", "agent_model"):
            if _settings(stats.get(name)) != _settings(first.get(name)):
                raise ValueError(f"{folder} was mined with another {name} than {folders[0]}: not merging")
        rows.extend(row for _, row in iter_jsonl(folder / ROWS_FILE))
        if (folder / ROUNDS_FILE).is_file():
            round_records.extend(record for _, record in iter_jsonl(folder / ROUNDS_FILE))
        add_counters(counters, stats["counters"])
        seconds += stats.get("wall_seconds", 0.0)
    info = {k: v for k, v in first.items() if k in ("prompt_version", "lr_scorer", "scorer_model", "agent_model",
                                                      "gac_mode", "selection", "trajectories_in_file", "config")}
    info.update(shard=[0, num_shards], merged_shards=num_shards, wall_seconds=round(seconds, 3))
    return _write_outputs(Path(out_dir), rows, round_records, summarize(counters, info), plot)
