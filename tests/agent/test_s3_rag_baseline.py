"""s3's naive-RAG baseline ("s3: You Don't Need That Much Data to Train a Search Agent via RL", arXiv 2505.14146,
section 3.2): the cache computes each question once, in batches, resumes after a kill without losing or
duplicating rows, and is keyed by retriever, generator and judge; the training filters and their counts."""

from __future__ import annotations

import json
import re

import pytest

from agent.s3_rag_baseline import NaiveRagCache, is_yes_no, retriever_identity, training_filter_counts, training_rows
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.base.llm.protocol import Generation, SamplingParams
from agentic_retriever.base.qa_sources import QARow
from agentic_retriever.base.writer_lock import WriterLockedError
from tests.fakes import FakeClient, Killed


class AnsweringLLM:
    """A generator that answers x when its prompt holds ``ANSWER=x`` (else "unknown"), or a judge that says
    `verdict`; records every call and raises `Killed` once it has served `fail_after` calls."""

    def __init__(self, name: str = "generator", verdict: str | None = None, fail_after: int | None = None):
        self.name, self.verdict, self.fail_after = name, verdict, fail_after
        self.calls: list[list[str]] = []

    def chat_prompt(self, user_message: str) -> str:
        return user_message

    def generate(self, prompts, params: SamplingParams) -> list[list[Generation]]:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise Killed(f"{self.name} killed after {len(self.calls)} calls")
        self.calls.append(list(prompts))
        texts = [self.verdict if self.verdict is not None else
                 (found.group(1) if (found := re.search(r"ANSWER=(\w+)", p)) else "unknown") for p in prompts]
        return [[Generation(text, [], "stop", None)] for text in texts]


class QuestionClient:
    """Top-k passages per question: the first says ``ANSWER=<answers[question]>`` when the question has one."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.calls: list[tuple[list[str], int]] = []

    def retrieve(self, queries, topk, questions=None) -> list[list[ScoredPassage]]:
        self.calls.append((list(queries), topk))
        return [[ScoredPassage(f"{q}#{i}", f"T{i}", f"about {q}" + (f" ANSWER={self.answers[q]}" if q in self.answers
                                                                       and i == 0 else ""), 1.0)
                 for i in range(topk)] for q in queries]


ROWS = [QARow(f"q{i}", f"question {i}", (f"gold{i}",)) for i in range(5)]
#: q0, q2 and q4 are answered by their top passage; q1 gets a wrong answer, q3 none.
ANSWERS = {"question 0": "gold0", "question 1": "wrong", "question 2": "gold2", "question 4": "gold4"}
EXPECTED = {"q0": 1.0, "q1": 0.0, "q2": 1.0, "q3": 0.0, "q4": 1.0}


def lines(cache: NaiveRagCache) -> list[dict]:
    return [json.loads(line) for line in cache.path.read_text().splitlines()]


def test_each_question_is_computed_once_with_one_retrieve_and_one_generate_call_per_batch(tmp_path):
    client, generator = QuestionClient(ANSWERS), AnsweringLLM()
    cache = NaiveRagCache(tmp_path, "retriever-a", "generator-a", None)
    assert cache.accuracies(ROWS, client, generator, None, batch_size=2) == EXPECTED
    assert [queries for queries, _ in client.calls] == [["question 0", "question 1"], ["question 2", "question 3"],
                                                        ["question 4"]]
    assert all(topk == 3 for _, topk in client.calls)
    assert [len(call) for call in generator.calls] == [2, 2, 1]
    assert "ANSWER=gold0" in generator.calls[0][0] and "question 0" in generator.calls[0][0]

    again_client, again_generator = QuestionClient(ANSWERS), AnsweringLLM()
    again = NaiveRagCache(tmp_path, "retriever-a", "generator-a", None)
    assert again.accuracies(ROWS[::-1] + ROWS[:1], again_client, again_generator, None) == EXPECTED
    assert again_client.calls == [] and again_generator.calls == []
    assert len(lines(again)) == 5
    assert json.loads(cache.path.with_name(cache.path.stem + ".key.json").read_text())["retriever"] == "retriever-a"


def test_a_killed_run_resumes_without_losing_or_duplicating_rows(tmp_path):
    cache = NaiveRagCache(tmp_path, "retriever-a", "generator-a", None)
    with pytest.raises(Killed):
        cache.accuracies(ROWS, QuestionClient(ANSWERS), AnsweringLLM(fail_after=1), None, batch_size=2)
    assert [row["id"] for row in lines(cache)] == ["q0", "q1"]  # the batch in flight is lost, the first kept

    client, generator = QuestionClient(ANSWERS), AnsweringLLM()
    assert cache.accuracies(ROWS, client, generator, None, batch_size=2) == EXPECTED
    assert [queries for queries, _ in client.calls] == [["question 2", "question 3"], ["question 4"]]
    assert sorted(row["id"] for row in lines(cache)) == ["q0", "q1", "q2", "q3", "q4"]


def test_a_second_run_on_the_same_cache_file_is_refused_while_the_first_holds_it(tmp_path):
    from agentic_retriever.base.writer_lock import WriterLock, lock_beside

    cache = NaiveRagCache(tmp_path, "retriever-a", "generator-a", None)
    with WriterLock(lock_beside(cache.path), "another naive-RAG run"):  # held as a run in another process holds it
        with pytest.raises(WriterLockedError, match=r"the naive-RAG cache .* is being written by another process"):
            cache.accuracies(ROWS, QuestionClient(ANSWERS), AnsweringLLM(), None, batch_size=2)
    assert cache.accuracies(ROWS, QuestionClient(ANSWERS), AnsweringLLM(), None, batch_size=2) == EXPECTED


def test_a_partial_last_line_is_cut_off_and_a_corrupt_line_names_file_and_line(tmp_path):
    cache = NaiveRagCache(tmp_path, "retriever-a", "generator-a", None)
    cache.accuracies(ROWS[:2], QuestionClient(ANSWERS), AnsweringLLM(), None)
    with open(cache.path, "a") as handle:
        handle.write('{"key": "abc", "accu')  # a crash mid-write
    client = QuestionClient(ANSWERS)
    assert cache.accuracies(ROWS[:3], client, AnsweringLLM(), None) == {k: EXPECTED[k] for k in ("q0", "q1", "q2")}
    assert [queries for queries, _ in client.calls] == [["question 2"]]
    assert len(lines(cache)) == 3

    cache.path.write_text(cache.path.read_text().replace('"accuracy": 1.0', '"accuracy": 0.5', 1))
    with pytest.raises(DataFormatError, match=re.escape(f"{cache.path}:1: field 'accuracy'")):
        cache.accuracies(ROWS[:1], client, AnsweringLLM(), None)
    cache.path.write_text("not json\n")
    with pytest.raises(DataFormatError, match=re.escape(f"{cache.path}:1: invalid JSON")):
        cache.accuracies(ROWS[:1], client, AnsweringLLM(), None)


@pytest.mark.parametrize("other", [dict(retriever_identity="retriever-b"), dict(generator_identity="generator-b"),
                                   dict(judge_identity="judge-a"), dict(topk=5)])
def test_another_retriever_generator_judge_or_topk_gets_another_file_and_is_recomputed(tmp_path, other):
    key = dict(retriever_identity="retriever-a", generator_identity="generator-a", judge_identity=None, topk=3)
    first = NaiveRagCache(tmp_path, **key)
    first.accuracies(ROWS, QuestionClient(ANSWERS), AnsweringLLM(), None)
    second = NaiveRagCache(tmp_path, **{**key, **other})
    assert second.path != first.path and second.path.parent == first.path.parent
    client, generator = QuestionClient(ANSWERS), AnsweringLLM()
    judge = AnsweringLLM("judge", verdict="no") if second.judge_identity else None
    assert second.accuracies(ROWS, client, generator, judge) == EXPECTED
    assert client.calls == [([row.question for row in ROWS], second.topk)] and len(generator.calls) == 1
    assert NaiveRagCache(tmp_path, **key).path == first.path, "the same key fields name the same file"


def test_the_judge_is_asked_once_for_the_span_failures_only(tmp_path):
    cache = NaiveRagCache(tmp_path, "retriever-a", "generator-a", "judge-a")
    judge = AnsweringLLM("judge", verdict="Yes")
    assert cache.accuracies(ROWS, QuestionClient(ANSWERS), AnsweringLLM(), judge) == dict.fromkeys(EXPECTED, 1.0)
    assert len(judge.calls) == 1 and len(judge.calls[0]) == 2  # q1 ("wrong") and q3 ("unknown")
    assert {row["id"]: row["how"] for row in lines(cache)} == {"q0": "span", "q1": "judge", "q2": "span",
                                                                "q3": "judge", "q4": "span"}
    with pytest.raises(ValueError, match="keyed with a judge"):
        cache.accuracies(ROWS, QuestionClient(ANSWERS), AnsweringLLM(), None)


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="topk"):
        NaiveRagCache(tmp_path, "r", "g", None, topk=0)
    with pytest.raises(ValueError, match="generator_identity"):
        NaiveRagCache(tmp_path, "r", "", None)
    cache = NaiveRagCache(tmp_path, "r", "g", None)
    with pytest.raises(ValueError, match="'q0' is given twice"):
        cache.accuracies([ROWS[0], QARow("q0", "another question", ("x",))], QuestionClient({}), AnsweringLLM(), None)
    with pytest.raises(TypeError, match="FakeClient has no identity"):
        retriever_identity(FakeClient())


class IdentifiedClient(QuestionClient):
    def identity(self) -> dict:
        return {"kind": "index", "corpus_sha256": "abc", "rows": 5}


def test_retriever_identity_is_the_clients_content_identity_as_a_string():
    assert json.loads(retriever_identity(IdentifiedClient({}))) == {"kind": "index", "corpus_sha256": "abc", "rows": 5}


# ------------------------------------------------------------------------------------------------------ filters

@pytest.mark.parametrize("golden, expected", [
    (("yes",), True), (("No.",), True), (("Yes", "no"), True), (("true",), True), (("False",), True),
    (("yes", "Paris"), False), (("yes sir",), False), ((), False), (("Paris",), False),
])
def test_yes_no_questions(golden, expected):
    assert is_yes_no(golden) is expected


FILTER_ROWS = [QARow("a", "qa", ("yes",)), QARow("b", "qb", ("Paris",)), QARow("c", "qc", ("Rome",)),
               QARow("d", "qd", ("no", "No")), QARow("e", "qe", ("Oslo",))]
NAIVE = {"b": 0.0, "c": 1.0, "e": 0.0}  # the yes/no questions need no accuracy


def test_training_rows_drop_yes_no_then_naive_rag_solved_questions_and_count_them():
    assert [row.id for row in training_rows(FILTER_ROWS, NAIVE)] == ["b", "e"]
    assert training_filter_counts(FILTER_ROWS, NAIVE) == {"questions": 5, "dropped_yes_no": 2,
                                                          "dropped_naive_rag_solved": 1, "kept": 2}


def test_each_training_filter_is_a_switch():
    everything = {**NAIVE, "a": 1.0, "d": 0.0}
    assert [r.id for r in training_rows(FILTER_ROWS, everything, drop_yes_no=False)] == ["b", "d", "e"]
    assert [r.id for r in training_rows(FILTER_ROWS, None, drop_naive_rag_solved=False)] == ["b", "c", "e"]
    assert training_filter_counts(FILTER_ROWS, None, drop_yes_no=False, drop_naive_rag_solved=False) == {
        "questions": 5, "dropped_yes_no": 0, "dropped_naive_rag_solved": 0, "kept": 5}
    with pytest.raises(ValueError, match="needs the naive-RAG accuracies"):
        training_rows(FILTER_ROWS, None)
    with pytest.raises(KeyError, match="no naive-RAG accuracy for question 'a'"):
        training_rows(FILTER_ROWS, NAIVE, drop_yes_no=False)
