"""Model selection on held-out training questions: keep the base encoder or the epoch that ranks evidence best.

A few hundred mined rows can make a strong base encoder worse (the CPU quickstart: all-MiniLM-L6-v2 at
leaf-question Recall@1 0.725 before training, lower after). So the trainer scores the base (step 0) and the
model after every epoch on a held-out slice of the *training* questions, keeps the best, and exports the base
weights unchanged when no epoch beats them. This reads evidence labels (the slice's ``supporting_titles``):
it is model selection on questions training never sees, and must never be the dev set the results are
reported on.

The score of an encoder is a fixed re-ranking task, so every candidate is judged on the same passages:

* the pool: the union, over the held-out questions, of the base index's top-``select_pool`` passages
  (retrieved once, with the index's own encoder over the full corpus; `build_heldout_pool`);
* each question ranks the whole pool by cosine similarity under the candidate encoder, and the ranking is
  judged by title (a passage is relevant when its title is in the row's ``supporting_titles``; ranks, MRR@k,
  Recall@k and nDCG@k as in `agentic_retriever.eval.retrieval`, a relevant title counting once);
* questions with no relevant passage in the pool cannot tell encoders apart and are left out (counted).

The held-out rows have no agent query: each is scored with the inputs of ``select_compose_with``, and their
mean decides. ``self`` composes like a training query with the question in both places (``Q [SEP] q`` with
Q = q = the question); ``none`` is the bare question, ``parent`` the question composed with its parent question
(as an agent working on the multi-hop question would send it). Select on the inputs you report: a checkpoint
chosen on ``Q [SEP] Q`` and reported on the bare question is chosen for another task than the one reported.

    pool = build_heldout_pool("heldout.jsonl", "index/minilm-flat", 50, query_input, passage_input,
                              compose_with=("none", "parent"), parent_qa="multihop_train_heldout.jsonl")
    score = evaluate_on_pool(model, pool, "mrr@10")
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..eval.ranking import measure_rankings
from ..eval.retrieval import composition_questions, keys_in_corpus, load_judged_questions
from agentic_retriever.base.jsonl import read_json, replace_folder, write_json
from .config import SELECT_METRIC_PATTERN

__all__ = ["HeldOutPool", "SelectionRecord", "build_heldout_pool", "evaluate_on_pool", "heldout_callback"]

log = logging.getLogger(__name__)

RECORD_FILE = "selection.json"


@dataclass(frozen=True)
class HeldOutPool:
    """The fixed re-ranking task: per judged question its query input and relevant titles; the pool's
    passage inputs (prefixed) and titles; and counts (questions, judged, skipped, pool passages)."""

    question_ids: list[str]
    queries: list[str]
    relevant: list[set[str]]
    passages: list[str]
    titles: list[str]
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """Hash of the task: a saved selection record of another task is not reused."""
        content = [self.queries, [sorted(r) for r in self.relevant], self.passages, self.titles]
        return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:16]


def build_heldout_pool(qa_path: str, index_dir: str, pool_size: int,
                       query_input: Callable[[str, str | None], str], passage_input: Callable[[str], str],
                       compose_with: Sequence[str] = ("self",), parent_qa: str | None = None) -> HeldOutPool:
    """Retrieve each held-out question's top-`pool_size` passages with the index (its own encoder and
    composition, the question as both query and original question) and return the union as the pool,
    with the questions that have a relevant title in it, once per input of `compose_with` (in that order).
    `query_input(query, question)` is the candidate encoders' input for a search (``question`` None: the bare
    query; `eval.retrieval.composition_questions` gives the question of each input, `parent_qa` the parents),
    `passage_input(contents)` their passage input."""
    from ..index import open_index

    questions = load_judged_questions(qa_path, relevance="title")
    if not questions:
        raise ValueError(f"no held-out question in {qa_path}")
    index = open_index(index_dir)
    texts = [q.question for q in questions]
    result = index.search(texts, pool_size, questions=texts)
    rows = np.unique(np.concatenate(result.rows)) if result.rows else np.zeros(0, dtype=np.int64)
    passages = index.corpus.passages_at(rows) if len(rows) else []
    in_corpus = keys_in_corpus(index.corpus, set().union(*(q.relevant for q in questions)), "title")
    pool_titles = {p.title for p in passages}
    judged = [(i, q.relevant & in_corpus) for i, q in enumerate(questions) if q.relevant & pool_titles]
    counts = {"questions": len(questions), "questions_judged": len(judged),
              "questions_skipped_no_relevant_in_pool": len(questions) - len(judged), "pool_passages": len(passages),
              "inputs": len(compose_with)}
    if not judged:
        raise ValueError(f"no held-out question of {qa_path} has a relevant passage among the top-{pool_size} of "
                         f"{index_dir}: the held-out score could not tell encoders apart")
    del index
    ids, queries, relevant = [], [], []
    for mode in compose_with:
        composed = composition_questions(questions, mode, parent_qa) or [None] * len(questions)
        for i, titles in judged:
            ids.append(questions[i].id)
            queries.append(query_input(questions[i].question, composed[i]))
            relevant.append(titles)
    return HeldOutPool(ids, queries, relevant, [passage_input(p.contents) for p in passages],
                       [p.title for p in passages], counts)


def evaluate_on_pool(model, pool: HeldOutPool, metric: str, batch_size: int = 64) -> float:
    """Mean `metric` over the pool's questions when `model` (anything with sentence-transformers'
    ``encode``) ranks the whole pool by cosine similarity; the model's train/eval mode is kept."""
    match = SELECT_METRIC_PATTERN.match(metric)
    if not match:
        raise ValueError(f"unknown selection metric {metric!r}; use mrr@k, recall@k or ndcg@k")
    k = int(match.group(2))
    was_training = getattr(model, "training", False)
    try:
        encode = dict(batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        queries = np.asarray(model.encode(pool.queries, **encode), dtype=np.float32)
        passages = np.asarray(model.encode(pool.passages, **encode), dtype=np.float32)
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    scores = queries @ passages.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    rankings = {str(i): [pool.titles[j] for j in ranked] for i, ranked in enumerate(top)}
    qrels = {str(i): dict.fromkeys(relevant, 1) for i, relevant in enumerate(pool.relevant)}
    values = measure_rankings(rankings, qrels, [metric])
    return float(np.mean([values[str(i)][metric] for i in range(len(top))]))


class SelectionRecord:
    """The held-out scores so far and the best checkpoint, persisted in ``FOLDER/selection.json`` with the
    best epoch's weights in ``FOLDER/selected-epoch-k/`` (a rerun after a kill keeps what was measured).

    ``per_checkpoint`` maps ``base`` and ``epoch-k`` to their scores, ``steps`` to the update they were
    taken at; ``best`` is the first checkpoint with the highest score (the base wins ties)."""

    def __init__(self, folder: str | Path, metric: str, pool: HeldOutPool):
        self.folder, self.metric, self.pool = Path(folder), metric, pool
        self.per_checkpoint: dict[str, float] = {}
        self.steps: dict[str, int] = {}
        self.best: str | None = None
        path = self.folder / RECORD_FILE
        if path.is_file():
            saved = read_json(path)
            if saved.get("metric") == metric and saved.get("pool_fingerprint") == pool.fingerprint:
                self.per_checkpoint, self.steps, self.best = saved["per_checkpoint"], saved["steps"], saved["best"]

    def weights_of(self, name: str) -> Path:
        return self.folder / f"selected-{name}"

    def add(self, name: str, score: float, step: int, model=None) -> bool:
        """Record `name`'s score; when it beats the best so far, save `model` as the new best (before the
        record names it, so a named best always has its weights). Return whether it is the new best."""
        better = self.best is None or score > self.per_checkpoint[self.best]
        if better and model is not None:
            tmp = self.folder / f".selected-{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            model.save(str(tmp), create_model_card=False)
            replace_folder(tmp, self.weights_of(name))
        self.per_checkpoint[name], self.steps[name] = score, step
        previous, self.best = self.best, (name if better else self.best)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / RECORD_FILE, {"metric": self.metric, "pool_fingerprint": self.pool.fingerprint,
                                               "per_checkpoint": self.per_checkpoint, "steps": self.steps,
                                               "best": self.best})
        if better and previous not in (None, "base", name):
            shutil.rmtree(self.weights_of(previous), ignore_errors=True)
        return better

    def history(self) -> list[dict]:
        """Log entries ``{"step", "heldout_<metric>"}`` for the training curves."""
        return [{"step": self.steps[name], f"heldout_{self.metric}": score}
                for name, score in sorted(self.per_checkpoint.items(), key=lambda item: self.steps[item[0]])]

    def summary(self, select_on: str, pool_size: int, compose_with: Sequence[str] = ("self",)) -> dict:
        """The manifest's ``selection`` field."""
        return {"metric": self.metric, "pool": pool_size, "select_on": select_on,
                "compose_with": list(compose_with), **self.pool.counts,
                "per_checkpoint": self.per_checkpoint, "kept": self.best}


def heldout_callback(model, pool: HeldOutPool, record: SelectionRecord, batch_size: int = 64):
    """A `TrainerCallback` that scores `model` on the pool after every epoch and records it as ``epoch-k`` (k the
    epoch count, fractional when max_steps stops mid-epoch). Every process scores (the same weights: none waits
    at its next gradient exchange while the main one evaluates); the main process alone records and saves."""
    from transformers import TrainerCallback

    def score(state) -> None:
        name = f"epoch-{round(state.epoch, 3):g}"
        value = evaluate_on_pool(model, pool, record.metric, batch_size)
        if not state.is_world_process_zero:
            return
        better = record.add(name, value, state.global_step, model)
        log.info("held-out %s after %s (update %d): %.4f%s", record.metric, name, state.global_step, value,
                 " (best so far)" if better else f" (best: {record.best})")

    class _HeldOutSelection(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            # a run killed between an epoch's last checkpoint and its evaluation resumes from that
            # checkpoint, i.e. from the epoch's final weights: score them now
            epoch = round(state.epoch or 0.0, 3)
            if state.global_step > 0 and epoch == int(epoch) and f"epoch-{epoch:g}" not in record.per_checkpoint:
                score(state)

        def on_epoch_end(self, args, state, control, **kwargs):
            score(state)

    return _HeldOutSelection()
