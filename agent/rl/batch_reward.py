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
  (the generator on the question's own top-3 passages, cached once per question: `agent.naive_rag`).

A gain is not a function of (response, golden): it needs the generator, so it has no verl wrapper in
`agent.rewards.verl` (verl's reward manager calls ``compute_score`` once per decoded response, with no handle
on our generator, judge or the rollout's selected documents) and lives in its own registry
(`agent.rewards.gbr.GAINS`) that the config validation and `prepare_reward` read next to `agent.rewards.REWARDS`.

`prepare_reward` also runs s3's question filters once before training (section 4.1 "Datasets"): questions the
generator already answers with naive RAG are dropped (`RLConfig.keep_naive_rag_failures`; the naive-RAG
accuracies come from the cache, computed with the training retriever), and so are yes/no and true/false
questions, whose span check can accept a negated answer (`RLConfig.drop_yes_no`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from agentic_retriever.client import RetrievalClient
from agentic_retriever.fingerprint import llm_fingerprint
from agentic_retriever.llm import LLM, load_llm

from ..env import Rollout
from ..naive_rag import NaiveRagCache, retriever_identity, training_filter_counts, training_rows
from ..qa_data import QARow
from ..rewards import get_reward
from ..rewards.gbr import gain_beyond_rag_paper, get_gain
from ..rewards.generation import generation_accuracy
from .config import RLConfig

__all__ = ["BatchReward", "BatchScores", "GainBeyondRagReward", "PreparedReward", "ResponseReward", "prepare_reward"]

log = logging.getLogger(__name__)


class BatchScores(NamedTuple):
    """The scores of a batch of rollouts and, per rollout, the reward's components to log (same keys for all)."""

    scores: list[float]
    components: list[dict[str, float]]


class BatchReward(Protocol):
    """Scores a step's rollouts together; `rows[i]` is the question of `results[i]`."""

    def score(self, results: Sequence[Rollout], rows: Sequence[QARow]) -> BatchScores: ...


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
    (question id -> naive-RAG accuracy, `agent.naive_rag.NaiveRagCache.accuracies` bound to the retriever and the
    same generator and judge). The score is ``gain(acc_s3, acc_rag)``: the release's (Acc_s3 - Acc_RAG) + Acc_s3
    for ``s3_gbr``, Eq. 1's Acc_s3 - Acc_RAG for ``s3_gbr_paper``.

    Components: ``gen_acc`` (Acc_s3), ``naive_rag_acc`` (Acc_RAG), ``gbr`` (Eq. 1's gain, whatever the variant)
    and, with a judge, ``judge_asked`` (1 where the span check failed).

        reward = GainBeyondRagReward(get_gain("s3_gbr"), generator, judge, lambda rows: cache.accuracies(
            rows, client, generator, judge))
        scores, components = reward.score(rollouts, rows)
    """

    def __init__(self, gain: Callable[[float, float], float], generator: LLM, judge: LLM | None,
                 naive_rag: Callable[[Sequence[QARow]], dict[str, float]]):
        self.gain, self.generator, self.judge, self.naive_rag = gain, generator, judge, naive_rag

    def score(self, results: Sequence[Rollout], rows: Sequence[QARow]) -> BatchScores:
        if len(results) != len(rows):
            raise ValueError(f"rows must be parallel to the rollouts: got {len(rows)} for {len(results)}")
        if not results:
            return BatchScores([], [])
        if any(result.selection is None for result in results):
            raise ValueError("Gain Beyond RAG scores the documents a searcher selected; these rollouts select none "
                             "(run them with env.dialect s3)")
        documents = [result.selection.documents for result in results]
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


class PreparedReward(NamedTuple):
    """What `prepare_reward` hands the trainer: the reward, the questions to train on and, for rewards that
    filter them, the counts (``questions``, ``dropped_yes_no``, ``dropped_naive_rag_solved``, ``kept``:
    `agent.naive_rag.training_filter_counts`)."""

    reward: BatchReward
    rows: list[QARow]
    question_filters: dict[str, int]


def prepare_reward(config: RLConfig, client: RetrievalClient, rows: Sequence[QARow],
                   reward_fn: Callable[..., float] | None = None, generator: LLM | None = None) -> PreparedReward:
    """The `BatchReward` the configured reward needs, and the training questions.

    `reward_fn` (a response reward) replaces the configured one. A gain (`RLConfig.uses_generator`) loads the
    frozen generator and judge once (`load_llm`: their own objects, never the trained policy; `generator`, an
    already loaded `LLM`, is used instead of loading ``config.generator``), opens the naive-RAG
    cache (keyed by the retriever's, generator's and judge's content identities; the retrieval client must have an
    ``identity()``, as index folders and services do) and runs the question filters (`agent.naive_rag.training_rows`),
    logging what each dropped; filters that leave no question raise ValueError with the counts.
    """
    if generator is not None and (reward_fn is not None or not config.uses_generator):
        raise ValueError(f"a generator was given but the reward ({'reward_fn' if reward_fn else config.reward}) "
                         "does not use one; give a gain over naive RAG (reward s3_gbr or s3_gbr_paper)")
    if reward_fn is not None:
        return PreparedReward(ResponseReward(reward_fn), list(rows), {})
    if not config.uses_generator:
        return PreparedReward(ResponseReward(get_reward(config.reward, **config.reward_options)), list(rows), {})
    gain = get_gain(config.reward, **config.reward_options)
    generator = generator if generator is not None else load_llm(config.generator)
    judge = load_llm(config.judge) if config.judge.model else None
    cache = NaiveRagCache(config.naive_rag_cache, retriever_identity(client), llm_fingerprint(generator),
                          llm_fingerprint(judge) if judge is not None else None, topk=3)

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
