"""How the trainer scores a step's rollouts: the `BatchReward` protocol and its two kinds.

``score(results, rows) -> BatchScores`` takes the step's finished rollouts and their questions (parallel) and
returns a score and the reward's own logged components per rollout. The trainer builds one with
`prepare_reward` from what the configured reward needs (`RLConfig.uses_generator`) and never asks again:

* `ResponseReward` wraps a registered response reward (`agent.rewards`: a pure ``reward(response, golden)``),
  scoring each rollout on its own;
* `GainBeyondRagReward` is s3's reward ("s3: You Don't Need That Much Data to Train a Search Agent via RL",
  arXiv 2505.14146, section 3.2 Eq. 1; `agent.rewards.gbr`): a frozen generator answers every rollout's question
  from the documents its searcher selected (D_s3, `agent.env.Rollout.selection`) in ONE batched call, the
  span failures go to the judge in at most ONE batched call (Generation Accuracy, section 4.1 Eq. 3,
  `agent.rewards.generation`), and the accuracy is compared with the naive-RAG accuracy of the same question
  (the generator on the question's own top-3 passages, cached once per question: `agent.s3_rag_baseline`).

A gain is not a function of (response, golden): it needs the generator, so it has no verl wrapper in
`agent.rl.verl.reward` (verl's reward manager calls ``compute_score`` once per decoded response, with no handle
on our generator, judge or the rollout's selected documents). Which `BatchReward` scores a reward is its kind in
the one reward table (`agent.rewards.registry.REWARDS`), which the config validation reads too.

* `SubmoduleReward` scores a frozen generator's answer from every passage a QAgent rollout retrieved (Eq. 10 of
  "QAgent: A modular Search Agent with Interactive Query Understanding", arXiv 2510.08383, section 3.4;
  `agent.rewards.qagent`):
  the generator answers every rollout's question in ONE batched call with QAgent's prompt.

* `WhenToSearchReward` is the multi-stage reward of "Learning When to Search: Multi-Stage Reward Design for
  Efficient Agentic RAG with Reasoning Language Models" (section 3.3, Eqs. 6-12; `agent.rewards.when_to_search`):
  the answers of all rollouts go to the LLM judge in ONE batched call (exact match without a judge:
  `agent.rewards.answer_judge`) and the queries of every rollout with more than one retrieval to the query
  encoder in ONE call (by default the retriever's own encoder, `RLConfig.search_encoder`).

With ``stage2.reward`` set, `prepare_reward` builds one `BatchReward` per stage (the generator loaded once and
shared) and the trainer picks the step's by `agent.rl.reward_schedule.RewardSchedule`.

`prepare_reward` also runs s3's question filters once before training (section 4.1 "Datasets"): questions the
generator already answers with naive RAG are dropped (`RLConfig.keep_naive_rag_failures`; the naive-RAG
accuracies come from the cache, computed with the training retriever), and so are yes/no and true/false
questions, whose span check can accept a negated answer (`RLConfig.drop_yes_no`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.corpus import Passage
from agentic_retriever.base.encoder import Encoder
from agentic_retriever.base.fingerprint import llm_fingerprint
from agentic_retriever.base.llm import LLM, load_llm
from agentic_retriever.base.qa_metrics import contains_match
from agentic_retriever.base.qa_sources import QARow

from ..dialects.reflect import search_queries
from ..dialects.s3 import NAIVE_RAG_TOPK
from ..env import Rollout
from ..rewards import get_reward, reward_entry
from ..rewards.answer_judge import judge_answers
from ..rewards.gbr import gain_beyond_rag_paper
from ..rewards.generation import GeneratorPrompt, generate_answers, generation_accuracy
from ..rewards.qagent import QAGENT_GENERATOR
from ..s3_rag_baseline import NaiveRagCache, retriever_identity, training_filter_counts, training_rows
from .config import RLConfig

__all__ = ["BatchReward", "BatchScores", "GainBeyondRagReward", "PreparedReward", "QueryEncoder", "ResponseReward",
           "SubmoduleReward", "WhenToSearchReward", "prepare_reward", "query_encoder"]

log = logging.getLogger(__name__)


class BatchScores(NamedTuple):
    """The scores of a batch of rollouts and, per rollout, the reward's components to log (same keys for all)."""

    scores: list[float]
    components: list[dict[str, float]]


class BatchReward(Protocol):
    """Scores a step's rollouts together; `rows[i]` is the question of `results[i]`."""

    def score(self, results: Sequence[Rollout], rows: Sequence[QARow]) -> BatchScores: ...


def _selected_documents(results: Sequence[Rollout], rows: Sequence[QARow], what: str,
                        dialect: str) -> list[list[Passage]]:
    """Every rollout's ``selection.documents``, after checking `rows` are parallel and every rollout has a
    selection (`what` and `dialect` word the error: what the reward scores, the dialect that records it)."""
    if len(results) != len(rows):
        raise ValueError(f"rows must be parallel to the rollouts: got {len(rows)} for {len(results)}")
    if any(result.selection is None for result in results):
        raise ValueError(f"{what}; these rollouts carry none (run them with env.dialect {dialect})")
    return [result.selection.documents for result in results]


class ResponseReward:
    """A response reward ``reward(response, golden) -> float`` (`agent.rewards`) as a `BatchReward`: each rollout
    scored on its own, no components of its own (the collector logs EM and the format terms)."""

    def __init__(self, reward: Callable[..., float]):
        self.reward = reward

    def score(self, results: Sequence[Rollout], rows: Sequence[QARow]) -> BatchScores:
        scores = [float(self.reward(result, row.golden_answers)) for result, row in zip(results, rows, strict=True)]
        return BatchScores(scores, [{} for _ in scores])


class GainBeyondRagReward:
    """s3's Gain Beyond RAG over a batch of searcher rollouts (arXiv 2505.14146, section 3.2, Eq. 1).

    For every rollout, Acc_s3 = GenAcc(G(Q, D_s3), A): `generator` answers with the Figure 12 prompt from the
    rollout's selected documents, all rollouts in one call; the span check decides, and `judge` (Figure 13; None:
    span check only) is asked about the span failures, all in one call. Acc_RAG comes from `naive_rag`
    (question id -> naive-RAG accuracy, `agent.s3_rag_baseline.NaiveRagCache.accuracies` bound to the retriever and the
    same generator and judge). The score is ``gain(acc_s3, acc_rag)``: the release's (Acc_s3 - Acc_RAG) + Acc_s3
    for ``s3_gbr``, Eq. 1's Acc_s3 - Acc_RAG for ``s3_gbr_paper``.

    Components: ``gen_acc`` (Acc_s3), ``naive_rag_acc`` (Acc_RAG), ``gbr`` (Eq. 1's gain, whatever the variant)
    and, with a judge, ``judge_asked`` (1 where the span check failed).

        reward = GainBeyondRagReward(get_reward("s3_gbr"), generator, judge, lambda rows: cache.accuracies(
            rows, client, generator, judge))
        scores, components = reward.score(rollouts, rows)
    """

    def __init__(self, gain: Callable[[float, float], float], generator: LLM, judge: LLM | None,
                 naive_rag: Callable[[Sequence[QARow]], dict[str, float]]):
        self.gain, self.generator, self.judge, self.naive_rag = gain, generator, judge, naive_rag

    def score(self, results: Sequence[Rollout], rows: Sequence[QARow]) -> BatchScores:
        documents = _selected_documents(results, rows, "Gain Beyond RAG scores the documents a searcher selected",
                                        "s3")
        if not results:
            return BatchScores([], [])
        items = generation_accuracy([row.question for row in rows], documents,
                                    [list(row.golden_answers) for row in rows], generator=self.generator,
                                    judge=self.judge).items
        naive = self.naive_rag(rows)
        scores, components = [], []
        for item, row in zip(items, rows, strict=True):
            acc_s3, acc_rag = item.accuracy, naive[row.id]
            scores.append(float(self.gain(acc_s3, acc_rag)))
            parts = {"gen_acc": acc_s3, "naive_rag_acc": acc_rag, "gbr": gain_beyond_rag_paper(acc_s3, acc_rag)}
            if self.judge is not None:
                parts["judge_asked"] = float(item.how != "span")
            components.append(parts)
        return BatchScores(scores, components)


class SubmoduleReward:
    """A reward of a frozen generator's answer from every passage a rollout retrieved, over a batch of rollouts
    (QAgent's stage 2, "QAgent: A modular Search Agent with Interactive Query Understanding", arXiv 2510.08383,
    section 3.4, Eqs. 8-10).

    K = the rollout's `agent.env.Rollout.selection` (the QAgent dialect: every retrieved passage, deduplicated by
    id, first seen first); `generator` answers every rollout's question from its K with `prompt` (QAgent's
    release prompt) in ONE call; the score is ``reward(answer, rollout, golden)`` (`agent.rewards.qagent`,
    ``qagent_stage2``: EM_contains(answer) + 0.5 x Hit). Component: ``submodule_contains_em`` (EM_contains of the
    generator's answer).

        reward = SubmoduleReward(get_reward("qagent_stage2"), generator)
        scores, components = reward.score(rollouts, rows)
    """

    def __init__(self, reward: Callable[..., float], generator: LLM, prompt: GeneratorPrompt = QAGENT_GENERATOR):
        self.reward, self.generator, self.prompt = reward, generator, prompt

    def score(self, results: Sequence[Rollout], rows: Sequence[QARow]) -> BatchScores:
        documents = _selected_documents(results, rows, "a submodule reward scores the passages a rollout retrieved "
                                        "(Rollout.selection)", "qagent")
        if not results:
            return BatchScores([], [])
        answers = generate_answers(self.generator, [row.question for row in rows], documents, prompt=self.prompt)
        scores, components = [], []
        for answer, result, row in zip(answers, results, rows, strict=True):
            golden = list(row.golden_answers)
            scores.append(float(self.reward(answer, result, golden)))
            components.append({"submodule_contains_em": contains_match(answer, golden)})
        return BatchScores(scores, components)


class QueryEncoder(Protocol):
    """What `WhenToSearchReward` embeds queries with (`agentic_retriever.base.encoder.Encoder`)."""

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray: ...


class WhenToSearchReward:
    """The multi-stage reward of "Learning When to Search" (section 3.3, Eq. 12) over a batch of reflect rollouts.

    Correctness: `judge` (Appendix B.4's YES/NO prompt; None: exact match) reads every rollout's answer in ONE call
    (`agent.rewards.answer_judge.judge_answers`). The queries of every rollout with RC > 1 (its ``<search>``
    blocks, `agent.dialects.reflect.search_queries`) are embedded by `encoder` in ONE call for r_search's
    avg_sim. The score is ``reward(correct, rollout, embeddings).total`` (`agent.rewards.when_to_search`).

    Components: the three terms ``r_answer``, ``r_search``, ``r_format``, ``answer_correct``, and
    ``correct_by_judge`` (1 when the judge decided correctness, 0 when exact match did: the run's metrics name the
    method); with a judge also ``judge_asked`` and ``judge_malformed`` (per rollout, 1 or 0).

        reward = WhenToSearchReward(get_reward("when_to_search_stage1"), encoder, judge=None)
        scores, components = reward.score(rollouts, rows)
    """

    def __init__(self, reward: Callable[..., object], encoder: QueryEncoder, judge: LLM | None):
        self.reward, self.encoder, self.judge = reward, encoder, judge

    def score(self, results: Sequence[Rollout], rows: Sequence[QARow]) -> BatchScores:
        if len(results) != len(rows):
            raise ValueError(f"rows must be parallel to the rollouts: got {len(rows)} for {len(results)}")
        if not results:
            return BatchScores([], [])
        verdicts = judge_answers([result.answer for result in results], [list(row.golden_answers) for row in rows],
                                 self.judge)
        queries = [search_queries(result.response_text) if result.num_searches > 1 else [] for result in results]
        flat = [query for listed in queries for query in listed]
        embedded = np.asarray(self.encoder.encode_queries(flat)) if flat else None
        scores, components, start = [], [], 0
        for index, (result, listed) in enumerate(zip(results, queries)):
            embeddings = embedded[start:start + len(listed)] if listed else None
            start += len(listed)
            terms = self.reward(verdicts.correct[index], result, embeddings)
            scores.append(float(terms.total))
            parts = {"r_answer": terms.answer, "r_search": terms.search, "r_format": terms.format,
                     "answer_correct": float(verdicts.correct[index]),
                     "correct_by_judge": float(verdicts.method == "judge")}
            if self.judge is not None:
                parts["judge_asked"] = float(verdicts.asked[index])
            components.append(parts)
        if self.judge is not None and verdicts.judge_malformed:
            log.warning("the judge gave %d malformed verdicts out of %d (counted as wrong)", verdicts.judge_malformed,
                        sum(verdicts.asked))
        return BatchScores(scores, components)


def query_encoder(config: RLConfig, client: RetrievalClient) -> QueryEncoder:
    """The encoder of r_search's query embeddings: ``config.search_encoder`` when it names a model, else the
    encoder of the retriever in use (an index folder opened in this process; `LocalRetrievalClient.encoder`)."""
    if config.search_encoder.model:
        return Encoder(config.search_encoder)
    encoder = getattr(client, "encoder", None)
    if encoder is None:
        raise ValueError(f"the when-to-search reward embeds the search queries with the retriever's encoder, but "
                         f"the retriever in use ({type(client).__name__}: a retrieval service or an index without "
                         "an encoder, e.g. BM25) has none this process can call: set search_encoder.model "
                         "(--search_encoder.model; the paper: Qwen/Qwen3-Embedding-0.6B)")
    return encoder


class PreparedReward(NamedTuple):
    """What `prepare_reward` hands the trainer: the reward (of stage 1 when there are two), the questions to train
    on, for rewards that filter them the counts (``questions``, ``dropped_yes_no``, ``dropped_naive_rag_solved``,
    ``kept``: `agent.s3_rag_baseline.training_filter_counts`), and the reward of stage 2 (None: one stage)."""

    reward: BatchReward
    rows: list[QARow]
    question_filters: dict[str, int]
    stage2: BatchReward | None = None


def prepare_reward(config: RLConfig, client: RetrievalClient, rows: Sequence[QARow],
                   reward_fn: Callable[..., float] | None = None, generator: LLM | None = None) -> PreparedReward:
    """The `BatchReward` of each configured stage, and the training questions.

    `reward_fn` (a response reward) replaces the configured one (a run of one stage only). A reward that needs the
    frozen generator (`RLConfig.uses_generator`) loads it once (`load_llm`: its own object, never the trained
    policy; `generator`, an already loaded `LLM`, is used instead of loading ``config.generator``), and both stages
    share it. A gain also loads the judge, opens the naive-RAG cache (keyed by the retriever's, generator's and
    judge's content identities; the retrieval client must have an ``identity()``, as index folders and services
    do) and runs the question filters (`agent.s3_rag_baseline.training_rows`), logging what each dropped; filters that
    leave no question raise ValueError with the counts. A when-to-search reward (`RLConfig.uses_query_encoder`)
    gets the query encoder (`query_encoder`) and the judge (``config.judge``; none: exact match), both shared by
    the two stages, and logs which decides correctness.
    """
    if generator is not None and (reward_fn is not None or not config.uses_generator):
        raise ValueError(f"a generator was given but the reward ({'reward_fn' if reward_fn else config.reward}) "
                         "does not use one; give a reward that reads a frozen generator (s3_gbr, s3_gbr_paper or "
                         "qagent_stage2)")
    if reward_fn is not None:
        if config.stage2.reward:
            raise ValueError(f"reward_fn replaces the configured reward of a one-stage run; this config has a "
                             f"stage 2 ({config.stage2.reward}): unset stage2.reward or give no reward_fn")
        return PreparedReward(ResponseReward(reward_fn), list(rows), {})
    stages = [(reward_entry(name).kind, get_reward(name, **options)) for name, options in
              ((config.reward, config.reward_options), (config.stage2.reward, config.stage2.reward_options)) if name]
    if config.uses_generator and generator is None:  # after the options are checked, before any use
        generator = load_llm(config.generator)
    if stages[0][0] == "gain":  # one stage (`RLConfig.validate`)
        return _gain_reward(config, client, rows, stages[0][1], generator)
    encoder = judge = None
    if config.uses_query_encoder:
        encoder = query_encoder(config, client)
        judge = load_llm(config.judge) if config.judge.model else None
        log.info("when-to-search answer correctness: %s", f"LLM judge {config.judge.model}" if judge is not None
                 else "exact match (no judge.model configured)")
    by_kind = {"response": ResponseReward, "submodule": lambda fn: SubmoduleReward(fn, generator),
               "when_to_search": lambda fn: WhenToSearchReward(fn, encoder, judge)}
    rewards = [by_kind[kind](fn) for kind, fn in stages]
    return PreparedReward(rewards[0], list(rows), {}, rewards[1] if len(rewards) > 1 else None)


def _gain_reward(config: RLConfig, client: RetrievalClient, rows: Sequence[QARow],
                 gain: Callable[[float, float], float], generator: LLM) -> PreparedReward:
    """s3's Gain Beyond RAG (one stage: `RLConfig.validate` refuses a gain in a two-stage run) and its filters."""
    judge = load_llm(config.judge) if config.judge.model else None
    cache = NaiveRagCache(config.naive_rag_cache, retriever_identity(client), llm_fingerprint(generator),
                          llm_fingerprint(judge) if judge is not None else None, topk=NAIVE_RAG_TOPK)

    def naive_rag(questions: Sequence[QARow]) -> dict[str, float]:
        return cache.accuracies(questions, client, generator, judge)

    switches = {"drop_yes_no": config.drop_yes_no, "drop_naive_rag_solved": config.keep_naive_rag_failures}
    naive = None
    if config.keep_naive_rag_failures:  # computed for the questions the yes/no filter keeps
        naive = naive_rag(training_rows(rows, None, drop_yes_no=config.drop_yes_no, drop_naive_rag_solved=False))
    kept, counts = training_rows(rows, naive, **switches), training_filter_counts(rows, naive, **switches)
    log.info("s3 training questions: %s", ", ".join(f"{name} {count}" for name, count in counts.items()))
    if not kept:
        raise ValueError(f"the s3 question filters left no training question ({counts}); turn off "
                         "keep_naive_rag_failures or drop_yes_no, or give more questions")
    return PreparedReward(GainBeyondRagReward(gain, generator, judge, naive_rag), kept, counts)
