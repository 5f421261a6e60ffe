"""The miner: utility mining end to end, trajectories -> retriever_train.jsonl ("Agentic-R: Learning to Retrieve
for Agentic Search", section 4.1.1; docs/mining.md). This file is a little over 400 lines: the stages' order,
resume and cache keys are one piece of state, kept in `_Miner`; settings, shards and outputs live apart. `mine`
runs the stages, each a module of this package:

1. rounds (`rounds`): one per search call, index < ``round_index_limit``;
2. candidates (`candidates`): top ``num_candidates`` (20) from the current retriever R_{i-1};
3. sub-answers (`sub_answers`): one scorer call per trajectory (Figure 8);
4. local relevance (`local_relevance`): listwise LR (Figures 6/7, windows, one retry) or the pointwise
   likelihood scorer (a deviation, for small scorers);
5. global answer correctness (`gac`): the agent continued from each round with each candidate (Eqs. 2-3), or
   the answer-likelihood option, graded by a criterion (`gac.gac_value`);
6. selection (`selection`): candidates passing the GAC and LR thresholds, ranked by LR then retriever rank; 15
   sampled negatives that pass neither GAC nor LR and (with the false-negative filter) hold no gold answer, or,
   with ``negatives release``, the release's: from every candidate not tied with the best.

Its settings are `config.MiningConfig`; what it writes is in `outputs`; `shards` slices the trajectory file
and merges the shards' outputs. Mining reads the trajectories' questions and gold answers, never evidence
labels (a QA file's ``supporting_titles``): `tests/mining/test_mining_pipeline.py` mines rows whose evidence fields
are absent. The audit (`agentic_retriever.eval.mining_audit`, evaluation side) joins its ``rounds.jsonl`` with evidence labels.

Stages 2-5 keep their per-item results in `store.StageStore` files under ``<out>/stages/``, keyed by a hash of
each item's inputs and of the settings that change it. A run computes only what is missing: a killed run
resumes where it stopped, and changing a setting recomputes the stages it affects and no other (the LR
window: local relevance only; a selection setting: nothing). The outputs are rebuilt from the stores at the
end of every run. The stage files double as the audit trail: every raw scorer output (each listwise attempt,
each sub-answer generation) and every continuation's answer, further searches and finish reason are there,
with each item's share of the calls, tokens and seconds. The keys name models and the retriever by content,
not by name or path (`agentic_retriever.base.fingerprint`): the scorer and the agent by a hash of their config and
weights (`CountingLLM.fingerprint`), the candidate retriever by what the client says it searches
(`_retriever_identity`: a local index's manifest identity, a service's ``/health``). Weights retrained in
place or another index mined into the same folder are recomputed; the same weights or index under another
path are reused. Served models (an OpenAI-compatible server) and services that report no fingerprint are
keyed by name or URL, with a warning.

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.fingerprint import stable_hash
from agentic_retriever.base.llm.openai import OpenAILLM
from agentic_retriever.base.qa_metrics import contains_match
from .candidates import passage_from_record, passage_record, retrieve_candidates
from .config import MiningConfig
from .environment import Trajectory, trajectory_id
from .gac import GACRequest, answer_likelihood_gac, gac_value, rollout_gac
from .local_relevance import ListwiseScorer, PointwiseLikelihoodScorer, RelevanceRequest, RetrieverScores
from .outputs import MiningResult, round_record, run_info, training_row, write_outputs
from .plan import PlanConfig, llm_token_counter, plan_mining
from .prompts import passage_text
from .rounds import Round, extract_rounds, search_queries
from .selection import Candidate, select_passages
from .shards import read_shard, shard_dir
from .stats import STAGES, add_counters, count_gac, count_local_relevance, new_counters, summarize
from .store import StageStore, open_stores
from .sub_answers import SubAnswerGenerator, SubAnswerRequest
from .sub_questions import read_sub_questions, target_sub_questions
from .usage import CountingLLM, Usage

__all__ = ["mine"]

#: The store of an HTTP LLM's replies, kept as they arrive (`llm.openai`), beside the stages' stores.
REPLIES = "llm_replies"

log = logging.getLogger(__name__)

GACRoundFilter = Callable[[Round, list[dict]], bool]
"""Whether a round gets GAC, given the round and its candidate records (id, title, text)."""

#: Bumped when a stage's computation changes, so stored results of the old code are not reused. (Keying models
#: and retrievers by content changed no version: a content identity never equals the name or label that the
#: earlier keys held, so earlier records are never read under the new keys; where no content identity can be
#: had, the key holds the name or label as before, with the same meaning.)
STAGE_VERSIONS = {"candidates": 1, "sub_answers": 1, "local_relevance": 2, "gac": 3}


def _retriever_identity(client) -> Any:
    """What the candidates' cache keys name the retriever by: the client's ``identity()`` (its content), or None
    for a client that has none (the keys then fall back to the retriever's label)."""
    identity = getattr(client, "identity", None)
    if callable(identity):
        return identity()
    log.warning("the retrieval client %s has no identity(): candidates are keyed by mining.retriever_id or the "
                "trajectories' retriever label, so mining another retriever into the same folder reuses the "
                "first one's candidates", type(client).__name__)
    return None


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class _Miner:
    """One mining run over one shard: the stages in order, sharing stores, counters and LLM usage."""

    def __init__(self, config: MiningConfig, client: RetrievalClient | None, agent: CountingLLM | None,
                 scorer: CountingLLM | None, stores: dict[str, StageStore], retriever: Any = None,
                 gac_rounds: GACRoundFilter | None = None):
        self.config, self.client, self.agent, self.scorer, self.stores = config, client, agent, scorer, stores
        self.retriever = retriever  # `_retriever_identity(client)`
        self.gac_rounds = gac_rounds
        self.selection = config.resolved_selection()
        self.counters = new_counters()
        self.dropped: dict[str, str] = {}  # round id -> reason
        self.charged: set[tuple[str, str]] = set()  # (stage, key) whose cost is in the statistics
        self.sub_questions = (read_sub_questions(config.sub_questions) if config.gac_target == "sub_question"
                              else None)

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
        retriever = self.retriever if self.retriever is not None else (self.config.retriever_id or rnd.retriever)
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
                            self.candidates_key(rnd), self.agent.fingerprint, env, mode])

    # stages -------------------------------------------------------------------------------------------------

    def rounds(self, trajectories: Sequence[Trajectory]) -> list[Round]:
        config = self.config
        rollout_gac_on = self.selection.use_gac and config.gac_mode == "rollout"
        out, states = [], set()
        for trajectory in trajectories:
            if rollout_gac_on and trajectory.dialect != config.env.dialect:
                raise ValueError(f"trajectory {trajectory.id} was rolled out in dialect "
                                 f"{trajectory.dialect!r}, but GAC continues it with {config.env.dialect!r}")
            rounds, drops = extract_rounds(trajectory, config.round_index_limit,
                                           config.env.max_turns if rollout_gac_on else None)
            self.counters["rounds_in"] += len(rounds) + len(drops)
            for drop in drops:
                self._drop(drop.round_id, drop.reason)
            for rnd in rounds:  # another sample of the question made the same search after the same queries
                if rnd.search_state in states:
                    self._drop(rnd.id, "repeated_search")
                else:
                    states.add(rnd.search_state)
                    out.append(rnd)
        if self.sub_questions is not None:
            out, counts = target_sub_questions(out, self.sub_questions)
            self.counters["gac_target"] = counts
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
        wanted = {trajectory_id(r.question_id, r.sample) for r in rounds}
        items = []
        for trajectory in trajectories:
            if trajectory.id in wanted:
                request = SubAnswerRequest(trajectory.question, tuple(trajectory.golden_answers),
                                           trajectory.response_text, len(search_queries(trajectory)))
                items.append((self.sub_answers_key(trajectory, generator), (trajectory.id, request)))
        self._run_stage("sub_answers", items, self.config.scorer_batch_prompts,
                        lambda batch: generator.generate([request for _, request in batch]), self.scorer)
        answers: dict[str, list[str | None]] = {}
        for key, (trajectory, _) in items:
            answers[trajectory] = self.stores["sub_answers"].get(key)["answers"]
        return {r.id: answers[trajectory_id(r.question_id, r.sample)][r.round_index - 1] for r in rounds}

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
            return rounds, RetrieverScores()
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
                  and max(self.lr_values(rnd, record)) < self.selection.lr_threshold):
                self._drop(rnd.id, "lr_below_threshold")
            else:
                kept.append(rnd)
        return kept, scorer

    def gac(self, rounds: list[Round]) -> list[Round]:
        if not self.selection.use_gac:
            return rounds
        config = self.config
        if self.gac_rounds is not None:
            wanted = []
            for rnd in rounds:
                if self.gac_rounds(rnd, self.stores["candidates"].get(self.candidates_key(rnd))["passages"]):
                    wanted.append(rnd)
                else:
                    self._drop(rnd.id, "gac_not_requested")
            rounds = wanted

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
            if isinstance(scorer, RetrieverScores):
                lr = scorer.scores(candidates)
            elif scorer is not None:
                record = self._record("local_relevance", self.lr_key(rnd, sub_answers[rnd.id], scorer))
                count_local_relevance(self.counters, record)
                lr = self.lr_values(rnd, record) if record["scores"] is not None else None
            if self.selection.use_gac and rnd.id not in self.dropped:
                record = self._record("gac", self.gac_key(rnd))
                gac = self.gac_values(record)
                count_gac(self.counters, record, gac, threshold)
            answers = self.contains_answer(rnd)
            table = [Candidate(p["id"], lr[j] if lr is not None else None, gac[j] if gac is not None else None,
                               j + 1, answers[j]) for j, p in enumerate(candidates)]
            if rnd.id in self.dropped:  # by local relevance
                records.append(round_record(rnd, candidates, table, threshold, {}, self.dropped[rnd.id]))
                continue
            result = select_passages(table, self.selection, rnd.id)
            records.append(round_record(rnd, candidates, table, threshold, result.roles, result.drop_reason))
            if result.drop_reason is not None:
                self._drop(rnd.id, result.drop_reason)
                continue
            self.counters["rounds_mined"] += 1
            positives = str(len(result.examples))
            self.counters["positives_per_round"][positives] = self.counters["positives_per_round"].get(positives, 0) + 1
            for example in result.examples:
                rows.append(training_row(rnd, dataset, [example.positive, *example.negatives], threshold))
        self.counters["rows"] = len(rows)
        return rows, records

    def _sub_answer_stats(self, trajectories: Sequence[Trajectory], rounds: list[Round]) -> None:
        if not (self.config.needs_scorer_llm and self.config.use_sub_answers):
            return
        generator = SubAnswerGenerator(self.scorer, self.config.sub_answer_max_new_tokens)
        wanted = {trajectory_id(r.question_id, r.sample) for r in rounds}
        counts = self.counters["sub_answers"]
        for trajectory in trajectories:
            if trajectory.id not in wanted:
                continue
            record = self._record("sub_answers", self.sub_answers_key(trajectory, generator))
            counts["trajectories"] += 1
            counts["ok" if record["status"] == "ok" else "count_mismatch"] += 1
            counts["queries"] += len(record["answers"])
            counts["given"] += sum(a is not None for a in record["answers"])

    def lr_values(self, rnd: Round, record: dict) -> list[float]:
        """The LR of a round's candidates on the scale the threshold reads (`lr_scale`): the stored scores, or
        their round posterior. Selection and the skip of hopeless rounds both read these."""
        return self.round_posterior(rnd, record) if self.config.lr_scale == "round_posterior" else record["scores"]

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


def _plan_of(config: MiningConfig, trajectories: Sequence[Trajectory], agent, scorer) -> dict:
    """The plan (`plan.plan_mining`) of this shard's trajectories, with this run's tokenizers: mining_stats.json
    holds it beside the measured ``cost``, so a plan can be checked against what its run spent."""
    scorer_tokens, scorer_name = llm_token_counter(scorer)
    agent_tokens, agent_name = llm_token_counter(agent)
    defaults = PlanConfig()
    sample = list(trajectories[:defaults.sample])
    return plan_mining(config, sample, len(trajectories), defaults, scorer_tokens, agent_tokens,
                       {"scorer": scorer_name, "agent": agent_name}) if sample else {}


def mine(trajectories_path: str | os.PathLike, client: RetrievalClient | None, agent_llm, scorer_llm,
         config: MiningConfig | None = None, out_dir: str | os.PathLike = "mining",
         shard: tuple[int, int] = (0, 1), gac_rounds: GACRoundFilter | None = None) -> MiningResult:
    """Mine retriever training rows from agent trajectories (section 4.1.1); see the module docstring.

    `client` is the current retriever R_{i-1} (candidates, and the later searches of GAC rollouts);
    `agent_llm` the agent that produced the trajectories (GAC; unused with ``use_gac=False``); `scorer_llm` the
    sub-answer and LR model (unused with ``use_lr=False``; needs ``score`` for the pointwise scorer). Writes
    ``retriever_train.jsonl``, ``mining_stats.json`` and ``mining_stats.png`` to `shard_dir(out_dir, shard)`.

    `gac_rounds(round, candidate records)`, when given, picks the rounds that get GAC; the others are dropped
    (``gac_not_requested``). Model selection uses it to score GAC only on rounds an audit can judge.
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
    trajectories, total = read_shard(trajectories_path, shard)
    log.info("mining %d of %d trajectories from %s (shard %d/%d) into %s", len(trajectories), total,
             trajectories_path, shard[0], shard[1], work)
    retriever = _retriever_identity(client)
    stores = open_stores(work / "stages", (*STAGES, REPLIES))
    http_llms = [llm for llm in (agent_llm, scorer_llm) if isinstance(llm, OpenAILLM)]
    for llm in http_llms:  # each reply kept as it arrives: a failed call loses only the requests in flight
        llm.reply_store = stores[REPLIES]
    try:
        miner = _Miner(config, client, agent, scorer, stores, retriever, gac_rounds)
        miner.counters["trajectories"] = len(trajectories)
        with_candidates = miner.candidates(miner.rounds(trajectories))
        sub_answers = miner.sub_answers(trajectories, with_candidates)
        scored, scorer_used = miner.local_relevance(with_candidates, sub_answers)
        miner.gac(scored)
        rows, round_records = miner.select(trajectories, with_candidates, sub_answers, scorer_used,
                                           config.dataset or Path(trajectories_path).stem)
    finally:
        for llm in http_llms:
            llm.reply_store = None
        for store in stores.values():
            store.close()
    info = run_info(config, selection, scorer_used, agent, scorer, shard, total, time.perf_counter() - started,
                    retriever)
    info["plan"] = _plan_of(config, trajectories, agent, scorer)
    return write_outputs(work, rows, round_records, summarize(miner.counters, info), config.plot)
