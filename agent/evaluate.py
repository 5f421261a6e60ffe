"""Evaluate a trajectory file: answer quality, search behaviour and evidence recall.

* ``em``, ``f1``, ``contains_em``: `agentic_retriever.base.qa_metrics`, recomputed from each trajectory's answer and
  golden answers, averaged over trajectories;
* ``avg_searches``: searches whose passages the agent saw, per trajectory (the retrievals per question, RC of
  "Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with Reasoning Language Models");
* ``answered_without_search``: share of trajectories that finished with an answer and saw no search (any dialect;
  the share of questions the agent answered from its own knowledge);
* ``valid_format_rate``: share of trajectories that finished with an answer and had no invalid action
  (the environment's view of validity; the stricter tag state machine of the format reward is a reward);
* ``evidence_recall`` (when QA rows with ``supporting_titles`` are given): per trajectory, the share of its
  supporting titles among the titles retrieved anywhere in it, averaged over the trajectories that have any;
* ``finish_reasons``: count per finish reason.

With a judge and no generator (`evaluate_judged`; ``eval agent --judge.model M``), the agent's own answers are
judged as "Learning when to search" does (section 4.1, LLM as a Judge; `agent.rewards.answer_judge`, Appendix
B.4's YES/NO prompt, exact matches accepted without asking): ``judge_acc`` next to ``em``, and ``judge`` (the
judge's fingerprint, calls and malformed verdicts).

With a frozen generator (`evaluate_generation`; ``eval agent --generator.model M``), the report adds s3's answer
metrics ("s3: You Don't Need That Much Data to Train a Search Agent via RL", arXiv 2505.14146, section 3.2 Eq. 1
and section 4.1 Eq. 3), averaged over trajectories:

* ``gen_acc``: Generation Accuracy (span check OR judge; span check only without a judge) of the generator's
  answer from each trajectory's documents (`trajectory_documents`);
* ``naive_rag_gen_acc``: the same generator's accuracy from the top-``naive_rag_topk`` passages that
  ``retrieval`` returns for the question itself (`agent.s3_rag_baseline.NaiveRagCache`, cached on disk);
* ``gbr`` and ``gbr_paper``: Gain Beyond RAG per question, in the release's and the paper's variants
  (`agent.rewards.gbr`);
* ``documents_per_question``: documents given to the generator (``avg_searches`` is the searches per question);
* ``generation``: what produced them: generator and judge fingerprints, ``check`` ("span_or_judge" or
  "span_only"), judge calls and malformed verdicts on the trajectories' answers, the naive-RAG top-k and cache
  file, and ``documents_without_text`` (retrieved passages whose text no observation shows, left out).

QAgent ("QAgent: A modular Search Agent with Interactive Query Understanding", arXiv 2510.08383, section 4.1 and
Table 2) measures the agent as a submodule instead (`evaluate_submodule`): the frozen generator answers with
QAgent's prompt (`agent.rewards.qagent.QAGENT_GENERATOR`) from every passage a trajectory retrieved,
deduplicated, and the report adds, averaged over trajectories:

* ``submodule_contains_em`` and ``submodule_f1``: the paper's non-strict EM (the answer contains a gold) and
  token F1 of the generator's answer;
* ``documents_per_question`` and ``generation`` (generator fingerprint, ``protocol`` "qagent",
  ``documents_without_text``).

The end-to-end metrics are those of every report: ``contains_em`` is the paper's EM of the agent's own answer,
``em`` the strict one, ``f1``. Which measurement runs is ``generator_protocol``: ``auto`` (default) takes
"qagent" when every trajectory has the QAgent dialect and "s3" otherwise; naming one evaluates any dialect's
trajectories that way (Table 2 gives Search-R1's to the frozen generator too).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentic_retriever.base.client import RetrievalClient, RetrievalConfig
from agentic_retriever.base.corpus import Passage
from agentic_retriever.base.fingerprint import llm_fingerprint
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.llm.protocol import LLM
from agentic_retriever.base.qa_metrics import contains_match, f1_score, qa_scores
from agentic_retriever.base.qa_sources import QARow, as_qa_rows
from agentic_retriever.base.qa_sources import qa_set_name
from agentic_retriever.retrieval import open_client

from .dialects.s3 import NAIVE_RAG_TOPK
from .rewards.answer_judge import judge_answers
from .rewards.gbr import gain_beyond_rag, gain_beyond_rag_paper
from .rewards.generation import generate_answers, generation_accuracy
from .rewards.qagent import QAGENT_GENERATOR
from .s3_rag_baseline import NaiveRagCache, retriever_identity
from .trajectory import Trajectory, Turn, read_trajectories

__all__ = ["AgentEvalConfig", "GeneratorProtocol", "evaluate_agent", "evaluate_generation", "evaluate_judged",
           "evaluate_submodule", "evaluate_trajectories", "generator_protocol", "trajectory_documents"]

GeneratorProtocol = Literal["auto", "s3", "qagent"]


@dataclass
class AgentEvalConfig:
    """Settings of `agentic-retriever eval agent` (section ``eval_agent``)."""

    trajectories: str = field(default="", metadata={"help": "trajectory file written by agent rollout",
                                                    "derive": "{workdir}/agent/trajectories.jsonl"})
    qa: str = field(default="", metadata={"help": "QA rows with supporting_titles, for evidence recall (optional)"})
    out: str = field(default="", metadata={"help": "write the report as JSON here (optional)"})
    generator: LLMConfig = field(default_factory=functools.partial(LLMConfig, model=""), metadata={
        "help": "frozen generator for gen_acc, naive_rag_gen_acc and gbr (model empty: off)"})
    judge: LLMConfig = field(default_factory=functools.partial(LLMConfig, model=""), metadata={
        "help": "judge LLM of Generation Accuracy (model empty: span check only); without a generator, the judge "
                "of the agent's own answers (judge_acc)"})
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    naive_rag_topk: int = field(default=NAIVE_RAG_TOPK, metadata={
        "help": "passages of the naive-RAG baseline (with a generator); s3's first retrieval is the same 3"})
    cache: str = field(default="", metadata={"help": "folder of the naive-RAG accuracy cache",
                                             "derive": "{workdir}/agent/naive_rag"})
    generator_protocol: GeneratorProtocol = field(default="auto", metadata={
        "help": "with a generator: s3 (GenAcc, naive RAG, GBR), qagent (QAgent's prompt; contains-EM and F1 of the "
                "generator's answer) or auto (qagent for QAgent trajectories, else s3)"})


def evaluate_trajectories(path: str | os.PathLike,
                          qa_rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike | None = None
                          ) -> dict[str, Any]:
    """Mean metrics of the trajectories in `path` (see the module docstring; no generator)."""
    return _answer_report(_read(path), qa_rows)


def _read(path: str | os.PathLike) -> list[Trajectory]:
    trajectories = list(read_trajectories(path))
    if not trajectories:
        raise ValueError(f"{path} holds no trajectories")
    return trajectories


def _answer_report(trajectories: list[Trajectory],
                   qa_rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike | None) -> dict[str, Any]:
    n = len(trajectories)
    scores = [qa_scores(t.answer, t.golden_answers) for t in trajectories]
    report: dict[str, Any] = {
        "trajectories": n,
        "em": sum(s.em for s in scores) / n,
        "f1": sum(s.f1 for s in scores) / n,
        "contains_em": sum(s.contains_em for s in scores) / n,
        "avg_searches": sum(t.num_searches for t in trajectories) / n,
        "answered_without_search": sum(t.finish_reason == "answer" and t.num_searches == 0
                                       for t in trajectories) / n,
        "valid_format_rate": sum(t.finish_reason == "answer" and all(x.action != "invalid" for x in t.turns)
                                 for t in trajectories) / n,
        "finish_reasons": dict(Counter(t.finish_reason for t in trajectories)),
    }
    if qa_rows is not None:
        rows = as_qa_rows(qa_rows)
        report["by_dataset"] = _by_dataset(trajectories, scores, rows, qa_set_name(qa_rows)
                                           if isinstance(qa_rows, (str, os.PathLike)) else "all")
        evidence = {r.id: set(r.supporting_titles) for r in rows if r.supporting_titles}
        recalls = [len(evidence[t.question_id] & set(t.retrieved_titles)) / len(evidence[t.question_id])
                   for t in trajectories if t.question_id in evidence]
        report["evidence_recall"] = sum(recalls) / len(recalls) if recalls else None
        report["evidence_questions"] = len(recalls)
    return report


def _by_dataset(trajectories: list[Trajectory], scores: list, rows: list[QARow], default: str
                ) -> dict[str, dict[str, float]]:
    """EM, F1 and searches per trajectory, per dataset (a row's ``dataset``, else `default`: the QA set's name), as
    the paper's tables report them; a trajectory whose question is not in `rows` counts under `default`."""
    dataset_of = {r.id: r.dataset or default for r in rows}
    groups: dict[str, list] = {}
    for trajectory, score in zip(trajectories, scores):
        groups.setdefault(dataset_of.get(trajectory.question_id, default), []).append((score, trajectory.num_searches))
    return {name: {"questions": len(group), "em": sum(s.em for s, _ in group) / len(group),
                   "f1": sum(s.f1 for s, _ in group) / len(group), "searches": sum(n for _, n in group) / len(group)}
            for name, group in sorted(groups.items())}


def trajectory_documents(trajectory: Trajectory) -> tuple[list[Passage], int]:
    """The documents a frozen generator gets for a trajectory, and how many retrieved passages had no text.

    A trajectory with a ``selection`` (s3's D_s3, "s3: You Don't Need That Much Data to Train a Search Agent via
    RL", arXiv 2505.14146, section 3.1) gives its selected documents. Any other gives every passage it retrieved,
    deduplicated by id, first occurrence first. A trajectory stores only the ids and titles of its passages; their
    texts are read back from the observations' ``Doc {i}(Title: "{title}") {text}`` lines (the format of the
    Search-R1 and s3 dialects), i.e. the text the agent was shown: a passage cut short by
    `EnvConfig.observation_max_tokens` keeps its shown part, and one cut off entirely (or shown only in the
    prompt) is left out and counted.
    """
    if trajectory.selection is not None:
        return list(trajectory.selection.documents), 0
    documents: dict[str, Passage] = {}
    missing = 0
    for turn in trajectory.turns:
        ids = [pid for hits in turn.retrieved for pid in hits.ids]
        titles = [title for hits in turn.retrieved for title in hits.titles]
        for pid, title, text in zip(ids, titles, _shown_texts(turn, titles)):
            if text is None:
                missing += 1
            elif pid not in documents:
                documents[pid] = Passage(pid, title, text)
    return list(documents.values()), missing


def _shown_texts(turn: Turn, titles: list[str]) -> list[str | None]:
    """The text of each passage in the turn's observation (None when its line is not there), parallel to `titles`."""
    observation, texts, position = turn.observation, [], 0
    for number, title in enumerate(titles, start=1):
        header = f'Doc {number}(Title: "{title}") '
        found = observation.find(header, position)
        if found < 0:
            texts.extend([None] * (len(titles) - len(texts)))
            break
        start = found + len(header)
        ends = [end for end in (observation.find(f"\nDoc {number + 1}(", start),
                                observation.find("</information>", start)) if end >= 0]
        position = min(ends, default=len(observation))
        texts.append(observation[start:position].strip())
    return texts


def evaluate_generation(path: str | os.PathLike, generator: LLM, judge: LLM | None, client: RetrievalClient,
                        cache: NaiveRagCache, qa_rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike | None
                        = None, batch_size: int = 64) -> dict[str, Any]:
    """`evaluate_trajectories` plus s3's generator metrics (see the module docstring): the generator answers from
    each trajectory's documents, `batch_size` trajectories per call; the naive-RAG baseline comes from `cache`
    (computed with `client` for the questions it lacks)."""
    trajectories = _read(path)
    report = _answer_report(trajectories, qa_rows)
    found = [trajectory_documents(t) for t in trajectories]
    items = []
    for start in range(0, len(trajectories), batch_size):
        batch = trajectories[start:start + batch_size]
        documents = [docs for docs, _ in found[start:start + batch_size]]
        items += generation_accuracy([t.question for t in batch], documents, [t.golden_answers for t in batch],
                                     generator=generator, judge=judge).items
    rows = [QARow(t.question_id, t.question, tuple(t.golden_answers)) for t in trajectories]
    naive = cache.accuracies(rows, client, generator, judge, batch_size)
    acc_s3 = [item.accuracy for item in items]
    acc_rag = [naive[t.question_id] for t in trajectories]
    n = len(trajectories)
    report.update({
        "gen_acc": sum(acc_s3) / n,
        "naive_rag_gen_acc": sum(acc_rag) / n,
        "gbr": sum(map(gain_beyond_rag, acc_s3, acc_rag)) / n,
        "gbr_paper": sum(map(gain_beyond_rag_paper, acc_s3, acc_rag)) / n,
        "documents_per_question": sum(len(docs) for docs, _ in found) / n,
        "generation": {
            "generator": cache.generator_identity, "judge": cache.judge_identity,
            "check": "span_only" if judge is None else "span_or_judge",
            "judge_calls": sum(item.judge_answer is not None for item in items),
            "judge_malformed": sum(item.judge_malformed for item in items),
            "naive_rag_topk": cache.topk, "naive_rag_cache": str(cache.path),
            "documents_without_text": sum(missing for _, missing in found),
        },
    })
    return report


def evaluate_judged(path: str | os.PathLike, judge: LLM,
                    qa_rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike | None = None,
                    batch_size: int = 64) -> dict[str, Any]:
    """`evaluate_trajectories` plus ``judge_acc``: `judge` decides whether each trajectory's own answer is correct
    (`agent.rewards.answer_judge.judge_answers`, `batch_size` answers per call; see the module docstring)."""
    trajectories = _read(path)
    report = _answer_report(trajectories, qa_rows)
    correct, calls, malformed = [], 0, 0
    for start in range(0, len(trajectories), batch_size):
        batch = trajectories[start:start + batch_size]
        verdicts = judge_answers([t.answer for t in batch], [t.golden_answers for t in batch], judge)
        correct += verdicts.correct
        calls, malformed = calls + sum(verdicts.asked), malformed + verdicts.judge_malformed
    report.update({"judge_acc": sum(correct) / len(trajectories),
                   "judge": {"judge": llm_fingerprint(judge), "judge_calls": calls, "judge_malformed": malformed}})
    return report


def evaluate_submodule(path: str | os.PathLike, generator: LLM,
                       qa_rows: Sequence[QARow | dict[str, Any]] | str | os.PathLike | None = None,
                       batch_size: int = 64) -> dict[str, Any]:
    """`evaluate_trajectories` plus QAgent's submodule metrics (see the module docstring): the generator answers
    with QAgent's prompt from each trajectory's documents (`trajectory_documents`), `batch_size` per call."""
    trajectories = _read(path)
    report = _answer_report(trajectories, qa_rows)
    found = [trajectory_documents(t) for t in trajectories]
    answers: list[str] = []
    for start in range(0, len(trajectories), batch_size):
        batch = trajectories[start:start + batch_size]
        answers += generate_answers(generator, [t.question for t in batch],
                                    [docs for docs, _ in found[start:start + batch_size]], prompt=QAGENT_GENERATOR)
    n = len(trajectories)
    report.update({
        "submodule_contains_em": sum(contains_match(a, t.golden_answers) for a, t in zip(answers, trajectories)) / n,
        "submodule_f1": sum(f1_score(a, t.golden_answers) for a, t in zip(answers, trajectories)) / n,
        "documents_per_question": sum(len(docs) for docs, _ in found) / n,
        "generation": {"generator": llm_fingerprint(generator), "protocol": "qagent",
                       "documents_without_text": sum(missing for _, missing in found)},
    })
    return report


def generator_protocol(setting: GeneratorProtocol, path: str | os.PathLike) -> str:
    """The measurement `evaluate_agent` runs with a generator: `setting`, or for ``auto`` "qagent" when every
    trajectory in `path` has the QAgent dialect, else "s3"."""
    if setting != "auto":
        return setting
    return "qagent" if all(t.dialect == "qagent" for t in _read(path)) else "s3"


def evaluate_agent(config: AgentEvalConfig) -> dict[str, Any]:
    """`agentic-retriever eval agent`: `evaluate_trajectories`; with ``judge.model`` alone `evaluate_judged` (the
    judge reads the agent's own answers); with ``generator.model`` set, load the generator and, for the s3 protocol
    (`generator_protocol`), the judge when ``judge.model`` is set, open ``retrieval`` and run
    `evaluate_generation`; for the qagent protocol run `evaluate_submodule` (no retriever, no judge)."""
    from agentic_retriever.base.llm import load_llm

    if not config.generator.model:
        if config.judge.model:
            with load_llm(config.judge) as judge:
                return evaluate_judged(config.trajectories, judge, config.qa or None)
        return evaluate_trajectories(config.trajectories, config.qa or None)

    if generator_protocol(config.generator_protocol, config.trajectories) == "qagent":
        if config.judge.model:
            raise ValueError("eval agent: the qagent protocol scores contains-EM and F1, it asks no judge; unset "
                             "judge.model")
        with load_llm(config.generator) as generator:
            return evaluate_submodule(config.trajectories, generator, config.qa or None)
    with open_client(config.retrieval) as client, contextlib.ExitStack() as engines:
        generator = engines.enter_context(load_llm(config.generator))
        judge = engines.enter_context(load_llm(config.judge)) if config.judge.model else None
        cache = NaiveRagCache(config.cache, retriever_identity(client), llm_fingerprint(generator),
                              llm_fingerprint(judge) if judge is not None else None, config.naive_rag_topk)
        return evaluate_generation(config.trajectories, generator, judge, client, cache, config.qa or None)
