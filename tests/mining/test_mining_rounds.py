"""Stage 1: trajectories split into rounds at every search call."""

from __future__ import annotations

import pytest

from agent.env import Prefix
from agent.trajectory import Turn
from agentic_retriever.mining.rounds import extract_rounds, search_queries
from tests.fakes import DIALECT, answer_turn, make_trajectory, make_world, search_turn

WORLD = make_world({"a": [(50, None)] * 3})
HITS = [WORLD.corpus[f"a-{j}"] for j in range(3)]


def trajectory(queries: list[str], **kwargs):
    return make_trajectory("q1", "Who founded it?", ["Mickey Gilley"],
                           [search_turn(q, HITS) for q in queries] + [answer_turn("Mickey Gilley")], "Mickey Gilley",
                           **kwargs)


def test_one_round_per_search_call_with_history_and_context():
    t = trajectory(["urban cowboy club", "gilleys club founder"])
    rounds, drops = extract_rounds(t)
    assert drops == []
    assert [(r.round_index, r.turn_index, r.query) for r in rounds] == [(1, 0, "urban cowboy club"),
                                                                      (2, 1, "gilleys club founder")]
    assert [r.history_queries for r in rounds] == [(), ("urban cowboy club",)]
    assert [r.id for r in rounds] == ["q1#1", "q1#2"]
    first, second = rounds
    assert first.context == t.turns[0].text and first.context.endswith("</search>")
    assert second.context == t.turns[0].text + t.turns[0].observation + t.turns[1].text
    assert (first.turns_used, second.turns_used) == (1, 2)
    assert first.question == "Who founded it?" and first.golden_answers == ("Mickey Gilley",)
    assert first.retriever == "fake-retriever"


def test_the_context_is_the_environments_prefix():
    t = trajectory(["x", "y"])
    [_, second], _ = extract_rounds(t)
    expected = Prefix.from_trajectory(t, 1, HITS[:1])
    assert second.prefix(HITS[:1]) == expected
    assert "<information>" not in second.context.split("<search> y")[-1]  # nothing of round 2's own results


def test_invalid_turns_count_as_turns_used():
    invalid = Turn("<think> hmm </think> I will look it up", "invalid", observation=DIALECT.invalid_action_message)
    t = make_trajectory("q", "Q?", ["a"], [invalid, search_turn("x", HITS), answer_turn("a")], "a")
    [r], _ = extract_rounds(t)
    assert (r.round_index, r.turn_index, r.turns_used) == (1, 1, 2)
    assert r.context.startswith(invalid.text + invalid.observation)


def test_rounds_at_or_beyond_the_limit_are_dropped():
    t = trajectory([f"q{i}" for i in range(6)])
    rounds, drops = extract_rounds(t, round_index_limit=5)
    assert [r.round_index for r in rounds] == [1, 2, 3, 4]
    assert [(d.round_id, d.reason) for d in drops] == [("q1#5", "round_index_limit"), ("q1#6", "round_index_limit")]
    assert len(extract_rounds(t, round_index_limit=7)[0]) == 6


def test_unexecuted_empty_and_multi_query_searches_are_dropped_with_reasons():
    multi = search_turn("m1", HITS)
    multi = Turn(multi.text, "search", ["m1", "m2"], multi.retrieved * 2, multi.observation)
    turns = [search_turn("", HITS), multi, search_turn("ok", HITS), search_turn("last", HITS, executed=False)]
    t = make_trajectory("q9", "Q?", ["a"], turns)
    rounds, drops = extract_rounds(t, round_index_limit=10)
    assert [r.query for r in rounds] == ["ok"]
    assert rounds[0].round_index == 4 and rounds[0].history_queries == ("", "m1", "m2")
    assert [(d.round_id, d.reason) for d in drops] == [
        ("q9#1", "empty_query"), ("q9#2", "multi_query"), ("q9#3", "multi_query"), ("q9#5", "not_executed")]
    # the sub-answer prompt asks one per query the agent wrote, unexecuted ones included
    assert [q for _, q in search_queries(t)] == ["", "m1", "m2", "ok", "last"]


def test_contexts_longer_than_the_agent_may_run_are_dropped():
    t = trajectory(["a1", "a2", "a3"])
    rounds, drops = extract_rounds(t, max_turns=2)
    assert [r.round_index for r in rounds] == [1, 2]
    assert [(d.round_id, d.reason) for d in drops] == [("q1#3", "beyond_agent_turns")]


def test_a_trajectory_without_searches_has_no_rounds():
    t = make_trajectory("q", "Q?", ["a"], [answer_turn("a")], "a")
    assert extract_rounds(t) == ([], [])
    with pytest.raises(ValueError):
        extract_rounds(t, round_index_limit=0)


def test_fingerprints_change_with_the_trajectory():
    [r1], _ = extract_rounds(trajectory(["x"]))
    [r2], _ = extract_rounds(trajectory(["x"]))
    [r3], _ = extract_rounds(make_trajectory("q1", "Who founded it?", ["Mickey Gilley"],
                                             [Turn("<think> other </think>\n<search> x </search>", "search", ["x"],
                                                   search_turn("x", HITS).retrieved, "obs")]))
    assert r1.fingerprint == r2.fingerprint != r3.fingerprint
