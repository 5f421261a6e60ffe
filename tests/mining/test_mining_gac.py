"""Stage 5: global answer correctness by continuing the agent with each candidate (Eqs. 2-3), and the
answer-likelihood option."""

from __future__ import annotations

import math
import re

import pytest

from agent.env import EnvConfig
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.mining.gac import GACRequest, answer_likelihood_gac, answer_pieces, gac_value, rollout_gac
from agentic_retriever.mining.rounds import extract_rounds
from tests.fakes import FakeAgent, answer_turn, last_information, make_trajectory, make_world, search_turn

WORLD = make_world({"club": [(50, "Mickey Gilley"), (50, None), (50, "mickey gilley!"), (50, "Gilley's Club")],
                    "capital": [(50, "Fredville"), (50, None)]})


def rounds():
    t1 = make_trajectory("a", "Who founded the club?", ["Mickey Gilley"],
                         [search_turn("club", [WORLD.corpus["club-1"]]), answer_turn("unknown")], "unknown")
    t2 = make_trajectory("b", "Capital of Freedonia?", ["Fredville"],
                         [search_turn("capital", [WORLD.corpus["capital-1"]]), answer_turn("x")], "x")
    return extract_rounds(t1)[0] + extract_rounds(t2)[0]


def requests():
    r1, r2 = rounds()
    return [GACRequest(r1, tuple(WORLD.corpus[f"club-{j}"] for j in range(4))),
            GACRequest(r2, tuple(WORLD.corpus[f"capital-{j}"] for j in range(2)))]


def test_gac_continues_every_pair_in_one_batched_rollout():
    agent = FakeAgent()
    first, second = rollout_gac(requests(), agent, WORLD, EnvConfig(max_turns=5))
    assert len(agent.calls[0]) == 6  # all (round, candidate) pairs of all rounds in the first generate call
    assert first["gac"] == [1.0, 0.0, 1.0, 0.0]  # EM: normalisation makes "mickey gilley!" right
    assert first["answers"] == ["Mickey Gilley", "unknown", "mickey gilley!", "Gilley's Club"]
    assert second["gac"] == [1.0, 0.0]


def test_gac_continuation_uses_only_the_candidate_passage():
    agent = FakeAgent()
    rollout_gac(requests()[:1], agent, WORLD, EnvConfig(max_turns=5))
    for j, prompt in enumerate(agent.calls[0]):
        observation = last_information(prompt)
        assert observation.startswith("Doc 1(") and "Doc 2" not in observation
        assert WORLD.corpus[f"club-{j}"].text in observation
        assert ('"club 1"' in observation) == (j == 1)  # not the trajectory's own result (club-1)
        assert prompt.count("<search> club </search>") == 1  # the context ends with the round's search call


def test_later_turns_retrieve_normally_and_further_searches_are_counted():
    agent = FakeAgent()
    [record, _] = rollout_gac(requests(), agent, WORLD, EnvConfig(max_turns=5, topk=3))
    assert record["further_searches"] == [0, 1, 0, 0]
    assert record["finish"] == ["answer"] * 4
    assert any(queries == ["misc facts", "misc facts"] and topk == 3 for queries, topk, _ in WORLD.calls)


def test_contains_match_on_word_boundaries():
    [record, _] = rollout_gac(requests(), FakeAgent(), WORLD, EnvConfig(max_turns=5), metric="contains")
    assert record["gac"] == [1.0, 0.0, 1.0, 0.0]  # "Gilley's Club" does not contain "mickey gilley"
    with pytest.raises(ValueError):
        rollout_gac(requests(), FakeAgent(), WORLD, EnvConfig(), metric="f1")


def test_answer_likelihood_scores_the_gold_after_each_candidate_and_after_no_passage():
    agent = FakeAgent()
    first, second = answer_likelihood_gac(requests(), agent, EnvConfig(max_turns=5))
    assert gac_value(first, "sequence") == pytest.approx([0.9, 0.1, 0.1, 0.1], abs=1e-4)
    assert gac_value(second, "sequence") == pytest.approx([0.9, 0.1], abs=1e-4)
    assert first["baseline_logprobs"] == [pytest.approx(math.log(0.1), abs=1e-4)]  # no passage: no answer in it
    assert len(agent.calls) == 1 and len(agent.calls[0]) == 8  # one score call: (1 baseline + candidates) per gold
    assert all(p.endswith("</information>\n\n<answer>") for p in agent.calls[0])
    assert agent.calls[0][0].endswith("<information></information>\n\n<answer>")


def test_gac_criteria_are_length_robust_or_relative_to_no_passage():
    # two golds: a 1-token one and a 5-token one whose every token has probability 0.8
    record = {"answer_logprobs": [[math.log(0.3), 5 * math.log(0.8)], [math.log(0.2), 5 * math.log(0.5)]],
              "answer_tokens": [1, 5], "baseline_logprobs": [math.log(0.3), 5 * math.log(0.4)]}
    assert gac_value(record, "sequence") == pytest.approx([0.8 ** 5, 0.2], abs=1e-6)  # the long gold is penalised
    assert gac_value(record, "per_token") == pytest.approx([0.8, 0.5], abs=1e-6)
    # gain: per-token log-prob over no passage, best gold; the second candidate lowers the short gold's
    assert gac_value(record, "gain") == pytest.approx([math.log(2), math.log(1.25)], abs=1e-5)
    with pytest.raises(ValueError, match="criterion"):
        gac_value(record, "max")


def test_gac_keeps_unlikely_answers_apart():
    """A weak model's (or a long answer's) probabilities are tiny; rounded to decimals they all tied at 0, and a
    round with no lower candidate has no negative."""
    record = {"answer_logprobs": [[-20.0], [-20.5], [-11.0], [-11.2]], "answer_tokens": [1],
              "baseline_logprobs": [-21.0]}
    for criterion in ("sequence", "per_token"):
        values = gac_value(record, criterion)
        assert values[0] > values[1] > 0 and values[2] > values[3] > 0
        assert values == pytest.approx([math.exp(v[0]) for v in record["answer_logprobs"]], rel=1e-5)


class WordReader(FakeAgent):
    """An agent that believes what it read, word by word: each character of the answer has probability 0.9 when
    its word occurs in the latest observation, else 0.1 (so a passage raises only the parts it names)."""

    def score(self, prompts, continuations) -> list[list[float]]:
        out = []
        for text, continuation in zip(self._enter(prompts), continuations):
            seen = set(re.findall(r"\w+", last_information(text)))
            answer = self._tokenizer.decode(continuation)
            words = [m for m in re.finditer(r"\w+", answer)]
            out.append([math.log(0.9 if any(m.start() <= i < m.end() and m.group() in seen for m in words) else 0.1)
                        for i in range(len(answer))])
        return out


def test_pieces_of_a_list_answer_are_its_parts_and_the_commas_between():
    assert answer_pieces("Busan: Camellia, Daegu: Magnolia") == [" Busan: Camellia", ",", " Daegu: Magnolia"]
    assert answer_pieces("1998") == [" 1998"]
    assert "".join(answer_pieces("A, B, C")) == " A, B, C"


def test_part_gain_credits_a_passage_on_one_part_of_a_list_answer():
    gold = "Busan: Camellia, Daegu: Magnolia"
    trajectory = make_trajectory("c", "Flowers of Busan and Daegu?", [gold],
                                 [search_turn("daegu flower", [WORLD.corpus["club-1"]]), answer_turn("x")], "x")
    [rnd] = extract_rounds(trajectory)[0]
    on_daegu = ScoredPassage("d", "Daegu", "The flower of Daegu is the Magnolia.", 1.0)
    on_both = ScoredPassage("b", "Flowers", "Busan: Camellia. Daegu: Magnolia.", 0.9)
    unrelated = ScoredPassage("u", "Seoul", "Seoul is the capital.", 0.8)
    [record] = answer_likelihood_gac([GACRequest(rnd, (on_daegu, on_both, unrelated))], WordReader(),
                                     EnvConfig(max_turns=5))
    assert record["answer_part_tokens"] == [[len(" Busan: Camellia"), len(" Daegu: Magnolia")]]
    assert record["answer_tokens"] == [len(" " + gold)]  # the comma is in the gold's sum, in no part's
    gain, part_gain = gac_value(record, "gain"), gac_value(record, "part_gain")
    full = math.log(9)  # every letter of a part goes from 0.1 to 0.9
    assert part_gain[0] == pytest.approx(full * len("DaeguMagnolia") / len(" Daegu: Magnolia"), abs=1e-4)
    assert part_gain[1] == pytest.approx(part_gain[0], abs=1e-4) and part_gain[2] == 0.0
    # the whole list's mean dilutes the Daegu passage's gain to half of what it adds to its part
    assert gain[0] == pytest.approx(full * len("DaeguMagnolia") / len(" " + gold), abs=1e-4)
    assert gain[0] < part_gain[0] / 2 + 0.05 and gain[1] > gain[0] and gain[2] == 0.0


def test_part_gain_of_a_one_part_answer_is_the_gain():
    [first, second] = answer_likelihood_gac(requests(), FakeAgent(), EnvConfig(max_turns=5))
    for record in (first, second):
        assert gac_value(record, "part_gain") == pytest.approx(gac_value(record, "gain"), abs=1e-5)
