"""s3's rewards: Figures 12/13 byte for byte, span_check, judge_check, GenAcc calling the judge only on span
failures (batched), and Gain Beyond RAG in the paper's and the release's variants."""

from __future__ import annotations

import hashlib

import pytest

from agent.rewards import REWARDS, get_reward
from agent.rewards.gbr import gain_beyond_rag, gain_beyond_rag_paper
from agent.rewards.generation import (
    GENERATOR_PROMPT,
    JUDGE_PROMPT,
    FirstDocumentsReader,
    format_context,
    gen_acc,
    generation_accuracy,
    judge_check,
    span_check,
)
from agentic_retriever.base.corpus import Passage
from agentic_retriever.base.llm.protocol import Generation, SamplingParams
from tests.agent.paper_text import S3_PAPER, figure_text

@pytest.mark.skipif(not S3_PAPER.exists(), reason="the s3 paper's text is not next to this checkout")
def test_generator_and_judge_prompts_are_figures_12_and_13_byte_for_byte():
    paper = S3_PAPER.read_text(encoding="utf-8")
    assert GENERATOR_PROMPT == figure_text(paper, 12, "Prompt for Answer Generation")
    assert JUDGE_PROMPT == figure_text(paper, 13, "Prompt for Judge_Check")


def test_prompt_hashes_and_distinctive_sentences():
    assert hashlib.sha256(GENERATOR_PROMPT.encode()).hexdigest() == "443a275c5c07ae281feff28259fb502340ca58b467675ca3f4e565cf6d9dfe1a"
    assert hashlib.sha256(JUDGE_PROMPT.encode()).hexdigest() == "292268bf859002b0981edb15aa7255ae80766cd548be35443e3955742b2724cf"
    assert "Important: You MUST directly answer the question without any other text." in GENERATOR_PROMPT
    assert JUDGE_PROMPT.endswith("Please directly answer with \u2019yes\u2019 or \u2019no\u2019.")


@pytest.mark.parametrize("prediction, golden, expected", [
    ("The 44th President of the United States was Barack Obama.", ["Barack Obama"], True),  # A.4's success case
    ("barack   OBAMA!", "Barack Obama", True),
    ("It is the Eiffel Tower.", ["the eiffel tower"], True),          # articles and punctuation normalised away
    ("a catalog of items", ["cat"], False),                           # token boundaries
    ("Obama, Barack", ["Barack Obama"], False),                       # a span, not a bag of tokens
    ("born in 1889", [1889], True),
    ("That statement is not true.", ["true"], True),                  # A.4's negation failure case, as the paper says
    ("anything", ["The"], False),                                     # a gold that normalises to nothing
    (None, ["x"], False),
])
def test_span_check(prediction, golden, expected):
    assert span_check(prediction, golden) is expected


@pytest.mark.parametrize("answer, verdict", [
    ("yes", True), ("Yes.", True), (" \u2019no\u2019", False), ("**YES**", True), ("No, it does not.", False),
    ("The answer is yes", None), ("yesno", None), ("", None), ("maybe", None),
])
def test_judge_check(answer, verdict):
    assert judge_check(answer) is verdict


class RecordingLLM:
    """The LLM protocol: answers each prompt by the first rule whose key it contains; records every call."""

    name = "recording"
    tokenizer = None

    def __init__(self, rules: dict[str, str]):
        self.rules = rules
        self.calls: list[list[str]] = []

    def chat_prompt(self, user_message: str) -> str:
        return f"<user>{user_message}</user>"

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        return [[Generation(next(v for k, v in self.rules.items() if k in p), [], "stop")] for p in prompts]


def test_the_judge_is_asked_only_when_the_span_check_fails_in_one_batched_call():
    judge = RecordingLLM({"Paris, France": "Yes", "Lyon": "no", "Nice": "I cannot tell"})
    result = gen_acc(["Paris", "Paris, France", "Lyon", "Nice"], ["Paris", ["City of Paris"], "Paris", "Paris"], judge)
    assert len(judge.calls) == 1 and len(judge.calls[0]) == 3       # prediction 0 passed the span check
    assert judge.calls[0][0] == "<user>" + JUDGE_PROMPT.format(response="Paris, France",
                                                               golden_answers="['City of Paris']") + "</user>"
    assert result.accuracies == [1.0, 1.0, 0.0, 0.0]
    assert [item.how for item in result.items] == ["span", "judge", "none", "none"]
    assert result.judge_calls == 3 and result.judge_malformed == 1 and result.items[3].judge_malformed


def test_no_judge_call_when_every_span_check_passes():
    judge = RecordingLLM({})
    assert gen_acc(["Paris"], ["paris"], judge).accuracies == [1.0]
    assert judge.calls == []


def test_without_a_judge_the_span_check_alone_decides():
    result = gen_acc(["Paris", "Lyon"], ["paris", "Paris"], None)
    assert [(item.accuracy, item.how) for item in result.items] == [(1.0, "span"), (0.0, "none")]
    assert (result.judge_calls, result.judge_malformed) == (0, 0)


def test_generation_accuracy_batches_the_generator_over_figure_12_prompts():
    documents = [[Passage("1", "Paris", "Paris is the capital of France.")], []]
    generator = RecordingLLM({"capital of France": " Paris \n", "Question: who": "Unknown"})
    judge = RecordingLLM({"Unknown": "no"})
    result = generation_accuracy(["capital of France?", "who painted it?"], documents, ["Paris", "Monet"],
                                 generator=generator, judge=judge)
    assert len(generator.calls) == 1
    assert generator.calls[0][0] == "<user>" + GENERATOR_PROMPT.format(
        context="Doc 1 (Title: Paris)\nParis is the capital of France.\n\n", question="capital of France?") + "</user>"
    assert result.accuracies == [1.0, 0.0] and result.items[0].prediction == "Paris"
    assert len(judge.calls) == 1 and len(judge.calls[0]) == 1
    assert format_context([]) == ""
    with pytest.raises(ValueError, match="parallel"):
        generation_accuracy(["q"], [], ["a"], generator=generator, judge=judge)


def test_the_first_documents_reader_answers_with_its_window_so_genacc_is_answer_containment():
    docs = [Passage("1", "Oslo", "Oslo is a city.\n\nIt is cold."), Passage("2", "Rome", "Rome has 2.8 million people."),
            Passage("3", "Bern", "Bern is the federal city.")]
    one, two = FirstDocumentsReader(1), FirstDocumentsReader(2)
    questions = ["which city?"] * 3
    assert generation_accuracy(questions, [docs, docs[1:], []], ["2.8 million"] * 3, generator=one,
                               judge=None).accuracies == [0.0, 1.0, 0.0]  # only the first document is read
    assert generation_accuracy(questions, [docs, docs[2:], docs], ["2.8 million", "Rome", "Bern"], generator=two,
                               judge=None).accuracies == [1.0, 0.0, 0.0]
    prompt = one.chat_prompt(GENERATOR_PROMPT.format(context=format_context(docs), question="q"))
    assert one.answer(prompt) == "Doc 1 (Title: Oslo)\nOslo is a city.\n\nIt is cold."  # a blank line is not a document end
    assert [g.text for g in one.generate([prompt], SamplingParams(n=2))[0]] == [one.answer(prompt)] * 2
    assert one.fingerprint != two.fingerprint  # another window is another naive-RAG cache
    with pytest.raises(ValueError, match="Figure 12"):
        one.answer("Question: who?")
    with pytest.raises(ValueError, match="at least one document"):
        FirstDocumentsReader(0)


@pytest.mark.parametrize("acc_s3, acc_rag, paper, release", [
    (1.0, 0.0, 1.0, 2.0),
    (0.0, 0.0, 0.0, 0.0),
    (1.0, 1.0, 0.0, 1.0),
    (0.0, 1.0, -1.0, -1.0),
    (0.75, 0.25, 0.5, 1.25),
])
def test_gain_beyond_rag_both_variants(acc_s3, acc_rag, paper, release):
    assert gain_beyond_rag_paper(acc_s3, acc_rag) == pytest.approx(paper)
    assert gain_beyond_rag(acc_s3, acc_rag) == pytest.approx(release)
    assert get_reward("s3_gbr_paper")(acc_s3, acc_rag) == pytest.approx(paper)
    assert get_reward("s3_gbr")(acc_s3, acc_rag) == pytest.approx(release)


def test_gain_registry_validates_names_options_and_accuracies():
    assert {name for name, entry in REWARDS.items() if entry.kind == "gain"} == {"s3_gbr", "s3_gbr_paper"}
    with pytest.raises(ValueError, match="unknown reward 'gbr'; .*a gain over naive RAG .*: s3_gbr, s3_gbr_paper"):
        get_reward("gbr")
    with pytest.raises(ValueError, match="takes no option scale; its options: none"):
        get_reward("s3_gbr", scale=2.0)
    for bad in (1.5, -0.1, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="acc_s3 must be an accuracy"):
            gain_beyond_rag(bad, 0.0)
