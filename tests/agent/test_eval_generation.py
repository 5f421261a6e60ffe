"""`eval agent` with a frozen generator: s3's Generation Accuracy of the trajectories' documents, the naive-RAG
baseline and Gain Beyond RAG ("s3: You Don't Need That Much Data to Train a Search Agent via RL", arXiv
2505.14146, Eq. 1 and Eq. 3), on s3 and Search-R1 trajectories; without a generator the report is unchanged."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from agent.dialects.base import SelectedDocuments
from agent.evaluate import (
    AgentEvalConfig,
    evaluate_agent,
    evaluate_generation,
    evaluate_trajectories,
    trajectory_documents,
)
from agent.s3_rag_baseline import NaiveRagCache
from agent.trajectory import TrajectoryWriter
from agentic_retriever.app.config_loader import build_config
from agentic_retriever.base.corpus import Passage, ScoredPassage
from tests.agent.test_s3_rag_baseline import AnsweringLLM, QuestionClient
from tests.fakes import answer_turn, make_trajectory, search_turn


def hit(pid: str, text: str) -> ScoredPassage:
    return ScoredPassage(pid, f"Title {pid}", text, 0.5)


def s3_trajectory():
    """s3: its selection D_s3 answers (Acc_s3 1); naive RAG does not (Acc_RAG 0): GBR 2, paper 1."""
    trajectory = make_trajectory("q1", "capital of France", ["Paris"], [
        search_turn("france", [hit("1", "France facts"), hit("2", "ANSWER=Paris is the capital")])])
    selection = SelectedDocuments([Passage("2", "Title 2", "ANSWER=Paris is the capital"),
                                   Passage("9", "Title 9", "more")], {"ignored_ids": 0})
    return dataclasses.replace(trajectory, dialect="s3", answer=None, selection=selection)


def search_r1_trajectories():
    """q2: the answer is in a passage of the second search; one passage repeats (Acc 1, naive 1: GBR 1, paper 0).
    q3: nothing answers (Acc 0, naive 0: GBR 0, paper 0)."""
    answered = make_trajectory("q2", "colour of the sky", ["blue"], [
        search_turn("sky", [hit("3", "the sky"), hit("4", "clouds")]),
        search_turn("sky colour", [hit("4", "clouds"), hit("5", "ANSWER=blue sky")]),
        answer_turn("blue")], answer="blue")
    unanswered = make_trajectory("q3", "tallest mountain", ["Everest"], [
        search_turn("mountain", [hit("6", "hills")]), answer_turn("K2")], answer="K2")
    return [answered, unanswered]


NAIVE_ANSWERS = {"capital of France": "Lyon", "colour of the sky": "blue"}


@pytest.fixture
def trajectory_file(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write([s3_trajectory(), *search_r1_trajectories()])
    return path


def test_generator_metrics_of_s3_and_search_r1_trajectories_are_the_hand_computed_ones(tmp_path, trajectory_file):
    generator, client = AnsweringLLM(), QuestionClient(NAIVE_ANSWERS)
    cache = NaiveRagCache(tmp_path / "cache", "retriever-a", "generator-a", None)
    report = evaluate_generation(trajectory_file, generator, None, client, cache)

    assert report["gen_acc"] == pytest.approx(2 / 3)
    assert report["naive_rag_gen_acc"] == pytest.approx(1 / 3)
    assert report["gbr"] == pytest.approx((2 + 1 + 0) / 3)
    assert report["gbr_paper"] == pytest.approx((1 + 0 + 0) / 3)
    assert report["documents_per_question"] == pytest.approx((2 + 3 + 1) / 3)
    assert report["generation"] == {
        "generator": "generator-a", "judge": None, "check": "span_only", "judge_calls": 0, "judge_malformed": 0,
        "naive_rag_topk": 3, "naive_rag_cache": str(cache.path), "documents_without_text": 0}
    assert {k: report[k] for k in evaluate_trajectories(trajectory_file)} == evaluate_trajectories(trajectory_file)

    trajectory_prompts, naive_prompts = generator.calls
    assert "Doc 1 (Title: Title 2)\nANSWER=Paris is the capital\n\nDoc 2 (Title: Title 9)\nmore" in \
        trajectory_prompts[0]
    assert "Doc 1 (Title: Title 3)\nthe sky\n\nDoc 2 (Title: Title 4)\nclouds\n\nDoc 3 (Title: Title 5)\n" \
           "ANSWER=blue sky\n\n" in trajectory_prompts[1]
    assert client.calls == [(["capital of France", "colour of the sky", "tallest mountain"], 3)]
    assert len(naive_prompts) == 3

    again = AnsweringLLM()
    assert evaluate_generation(trajectory_file, again, None, QuestionClient({}), cache) == report
    assert len(again.calls) == 1, "the naive-RAG accuracies come from the cache"


def test_a_judge_is_reported_and_asked_only_for_span_failures(tmp_path, trajectory_file):
    judge = AnsweringLLM("judge", verdict="yes")
    cache = NaiveRagCache(tmp_path / "cache", "retriever-a", "generator-a", "judge-a")
    report = evaluate_generation(trajectory_file, AnsweringLLM(), judge, QuestionClient(NAIVE_ANSWERS), cache)
    assert report["gen_acc"] == 1.0 and report["naive_rag_gen_acc"] == 1.0
    assert report["gbr"] == 1.0 and report["gbr_paper"] == 0.0
    assert report["generation"]["check"] == "span_or_judge" and report["generation"]["judge_calls"] == 1
    assert [len(call) for call in judge.calls] == [1, 2]  # trajectories (q3), then naive RAG (q1, q3)


def test_search_r1_documents_are_read_back_from_cut_observations():
    (answered, _) = search_r1_trajectories()
    cut = answered.turns[1]
    cut.observation = cut.observation[:cut.observation.index("ANSWER=") + len("ANS")]  # the observation budget
    documents, missing = trajectory_documents(answered)
    assert documents == [Passage("3", "Title 3", "the sky"), Passage("4", "Title 4", "clouds"),
                         Passage("5", "Title 5", "ANS")]
    assert missing == 0
    cut.observation = cut.observation[:cut.observation.index("Doc 2(")]
    assert trajectory_documents(answered) == ([Passage("3", "Title 3", "the sky"), Passage("4", "Title 4", "clouds")],
                                              1)


def test_without_a_generator_the_report_is_unchanged(trajectory_file):
    flags = argparse.Namespace(workdir="w", trajectories=str(trajectory_file))
    config = build_config(AgentEvalConfig, "eval_agent", flags)
    assert (config.generator.model, config.judge.model, config.cache) == ("", "", "w/agent/naive_rag")
    report = evaluate_agent(config)
    assert report == evaluate_trajectories(trajectory_file)
    assert "gen_acc" not in report and "generation" not in report



def test_a_judge_without_a_generator_judges_the_agents_own_answers(trajectory_file, monkeypatch):
    from tests.agent.rewards.test_when_to_search_rewards import ScriptedJudge

    flags = argparse.Namespace(workdir="w", trajectories=str(trajectory_file))
    config = build_config(AgentEvalConfig, "eval_agent", flags)
    config.judge.model = "judge"
    plain = evaluate_trajectories(trajectory_file)
    judge = ScriptedJudge(["YES"] * plain["trajectories"])
    monkeypatch.setattr("agentic_retriever.base.llm.load_llm", lambda settings: judge)
    report = evaluate_agent(config)
    asked = sum(len(call) for call in judge.calls)
    assert len(judge.calls) <= 1 and report["judge"]["judge_calls"] == asked
    assert report["judge_acc"] == pytest.approx(plain["em"] + asked / plain["trajectories"])
    assert {k: v for k, v in report.items() if k not in ("judge_acc", "judge")} == plain
