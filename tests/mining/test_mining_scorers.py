"""Stages 3-4: sub-answers (Figure 8) and local relevance (listwise windows with retry; pointwise likelihood)."""

from __future__ import annotations

import pytest

from agentic_retriever.mining.prompts import passage_text
from agentic_retriever.mining.local_relevance import ListwiseScorer, PointwiseLikelihoodScorer, RelevanceRequest
from agentic_retriever.mining.sub_answers import SubAnswerGenerator, SubAnswerRequest
from tests.fakes import FakeScorer, answer_turn, make_trajectory, make_world, search_turn

LRS = [95, 3, 60, 150, 42, 7, 88, 19, 61, 0, 33, 70, 12, 99, 5, 64, 28, 81, 47, 9]
WORLD = make_world({"q": [(lr, None) for lr in LRS]})
PASSAGES = tuple(passage_text(WORLD.corpus[f"q-{j}"]) for j in range(20))


def request(query: str = "q", sub_answer: str | None = None, n: int = 20) -> RelevanceRequest:
    return RelevanceRequest(query, PASSAGES[:n], sub_answer)


def test_listwise_scores_20_candidates_in_two_windows_of_10():
    scorer = FakeScorer()
    [record] = ListwiseScorer(scorer, window=10).score([request()])
    assert record["scores"] == [min(v, 100) for v in LRS]  # 150 clamped
    assert len(scorer.calls) == 1 and len(scorer.calls[0]) == 2  # both windows in one generate call
    assert all("Search Query and 10 passages" in p for p in scorer.calls[0])
    assert "Passage [1] " + PASSAGES[10] in scorer.calls[0][1]  # each window numbers from 1
    assert [w["status"] for w in record["windows"]] == ["ok", "ok"] and record["template"] == "without_sub_answer"


def test_window_20_is_one_list_and_a_sub_answer_selects_figure_6():
    scorer = FakeScorer()
    [record] = ListwiseScorer(scorer, window=20).score([request(sub_answer="Mickey Gilley")])
    assert len(scorer.calls[0]) == 1 and "Search Query and 20 passages" in scorer.calls[0][0]
    assert "**Reference Answer:**\nMickey Gilley" in scorer.calls[0][0] and record["template"] == "with_sub_answer"
    assert record["scores"][3] == 100


def test_an_unparsable_window_is_retried_once_by_sampling_and_raw_outputs_are_kept():
    scorer = FakeScorer()
    ok, retried = ListwiseScorer(scorer, window=10, retries=1).score([request("q"), request("garbled q")])
    assert ok["scores"] is not None and retried["scores"] == ok["scores"]
    assert len(scorer.calls) == 2 and len(scorer.calls[1]) == 2  # only the garbled round's 2 windows again
    assert [len(w["outputs"]) for w in retried["windows"]] == [2, 2]
    assert retried["windows"][0]["outputs"][0] == "These passages are all quite relevant."


def test_a_window_failing_its_retry_drops_the_round():
    scorer = FakeScorer()
    good, bad = ListwiseScorer(scorer, window=10).score([request("q"), request("hopeless q")])
    assert good["scores"] is not None and bad["scores"] is None
    assert [w["status"] for w in bad["windows"]] == ["too_few", "too_few"]
    no_retry = FakeScorer()
    [record] = ListwiseScorer(no_retry, window=10, retries=0).score([request("garbled q")])
    assert record["scores"] is None and len(no_retry.calls) == 1


def test_short_candidate_lists_make_a_short_last_window():
    scorer = FakeScorer()
    [record] = ListwiseScorer(scorer, window=10).score([request(n=13)])
    assert record["scores"] == [min(v, 100) for v in LRS[:13]]
    assert "Search Query and 3 passages" in scorer.calls[0][1]


def test_pointwise_judgement_maps_p_yes_to_0_100():
    scorer = FakeScorer()
    [record] = PointwiseLikelihoodScorer(scorer).score([request(n=5)])
    assert record["scores"] == pytest.approx([95, 3, 60, 99, 42], abs=0.01)
    assert record["template"] == "pointwise:judgement" and len(record["logprobs"]) == 5
    assert len(scorer.calls) == 1 and len(scorer.calls[0]) == 10  # Yes and No per passage, one score call
    [with_reference] = PointwiseLikelihoodScorer(FakeScorer()).score([request(n=1, sub_answer="x")])
    assert with_reference["scores"] == pytest.approx([95], abs=0.01)


def test_pointwise_query_likelihood_is_the_geometric_mean_probability():
    class Scorer(FakeScorer):
        def score(self, prompts, continuations):
            self._enter(prompts)
            return [[-0.5, -1.5] for _ in prompts]

    [record] = PointwiseLikelihoodScorer(Scorer(), mode="query_likelihood").score([request(n=2)])
    assert record["scores"] == pytest.approx([100 * 2.718281828 ** -1.0] * 2, abs=0.01)
    with pytest.raises(ValueError):
        PointwiseLikelihoodScorer(FakeScorer(), mode="bogus")


def test_scorer_settings_name_what_changes_results():
    scorer = FakeScorer()
    assert ListwiseScorer(scorer, window=10).settings() != ListwiseScorer(scorer, window=20).settings()
    assert ListwiseScorer(scorer).settings()["prompt_version"]
    with pytest.raises(ValueError):
        ListwiseScorer(scorer, window=0)


def test_sub_answers_one_call_per_trajectory_in_one_batch():
    hits = [WORLD.corpus["q-0"]]
    t1 = make_trajectory("a", "Who founded Gilley's?", ["Mickey Gilley"],
                         [search_turn("club", hits), search_turn("founder", hits), answer_turn("x")], "x")
    t2 = make_trajectory("b", "Capital of Freedonia?", ["Fredville"], [search_turn("capital", hits)])
    scorer = FakeScorer()
    records = SubAnswerGenerator(scorer).generate(
        [SubAnswerRequest(t.question, tuple(t.golden_answers), t.response_text, n) for t, n in ((t1, 2), (t2, 1))])
    assert len(scorer.calls) == 1 and len(scorer.calls[0]) == 2
    assert "[Mickey Gilley]" in scorer.calls[0][0] and t1.response_text in scorer.calls[0][0]
    assert records[0]["answers"] == ["sub club", "sub founder"] and records[0]["status"] == "ok"
    assert records[1]["answers"] == [None]  # "Not Sure"
    [mismatch] = SubAnswerGenerator(FakeScorer()).generate(
        [SubAnswerRequest(t1.question, ("Mickey Gilley",), t1.response_text, 3)])
    assert mismatch["answers"] == [None, None, None] and mismatch["status"] == "count_mismatch"
    assert mismatch["raw"].count("<sub-answer>") == 2
