"""The shared fakes (`tests/fakes.py`) fit the protocols they stand in for, and fail when told to."""

from __future__ import annotations

from collections import Counter

from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.llm.protocol import LLM, SamplingParams
from tests.fakes import CharTokenizer, FakeAgent, FakeScorer, Killed, make_world


def test_fakes_implement_the_protocols():
    assert isinstance(FakeAgent(), LLM) and isinstance(FakeScorer(), LLM)
    assert isinstance(make_world({}), RetrievalClient)
    assert CharTokenizer().decode(CharTokenizer().encode("<a> é")) == "<a> é"


def test_fake_llms_stop_after_the_given_number_of_calls():
    scorer = FakeScorer(fail_after=1)
    scorer.generate(["**Search Query:**\nq\n\n**Passages:**\nPassage [1] lr=5."], SamplingParams())
    try:
        scorer.generate(["anything"], SamplingParams())
    except Killed:
        pass
    else:
        raise AssertionError("the second call should have been refused")
    assert len(scorer.calls) == 1 and Counter(map(len, scorer.calls)) == {1: 1}
