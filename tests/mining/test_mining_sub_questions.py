"""GAC's sub-question target for multi-hop questions (agentic_retriever.mining.sub_questions)."""

from __future__ import annotations

import json

import pytest

from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.mining import MiningConfig
from agentic_retriever.mining.sub_questions import SubQuestion, pursued_sub_question, read_sub_questions
from tests.fakes import FakeAgent
from tests.mining.test_mining_pipeline import GILLEY, config, rows_of, run, trajectory_file  # noqa: F401

FANOUT = [SubQuestion(f"p-{i}", f"What is the population of {country}?", (str(i),))
          for i, country in enumerate(["Macau", "Maldives", "Singapore"])]


class RecordingAgent(FakeAgent):
    """The fake agent, recording the golds it is asked to score."""

    def __init__(self):
        super().__init__()
        self.golds: set[str] = set()

    def score(self, prompts, continuations):
        self.golds |= {self._tokenizer.decode(c).strip() for c in continuations}
        return super().score(prompts, continuations)


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_pursued_sub_question_is_decided_by_its_distinctive_words():
    # "population" is in every leaf: the country decides, whatever the query's wording
    assert pursued_sub_question("Maldives population", FANOUT).id == "p-1"
    assert pursued_sub_question("how many people live in Singapore", FANOUT).id == "p-2"
    assert pursued_sub_question("population", FANOUT).id == "p-0"  # a tie goes to the first leaf
    assert pursued_sub_question("capital of France", FANOUT) is None
    assert pursued_sub_question("anything", []) is None


def test_sub_questions_are_grouped_by_parent_with_answer_parts_as_golds(tmp_path):
    path = _write(tmp_path / "leaves.jsonl", [
        {"id": "a", "question": "Which?", "golden_answers": ["X, Y"], "answer_parts": [["X"], ["k", "Y"]],
         "parent_id": "p"},
        {"id": "b", "question": "Who?", "golden_answers": ["Z"], "parent_id": "q"}])
    grouped = read_sub_questions(path)
    assert grouped["p"][0].golden_answers == ("X, Y", "X", "Y") and grouped["q"][0].id == "b"
    bad = _write(tmp_path / "bad.jsonl", [{"id": "a", "question": "Which?", "golden_answers": ["x"]}])
    with pytest.raises(DataFormatError, match=r"bad.jsonl:1: field 'parent_id'"):
        read_sub_questions(bad)
    with pytest.raises(ValueError, match="needs sub_questions"):
        MiningConfig(gac_target="sub_question").validate()


def test_gac_scores_the_answer_of_the_sub_question_each_round_pursues(trajectory_file, tmp_path):  # noqa: F811
    # t1 asks who founded the honky tonk of Urban Cowboy: first which club it is, then who founded that club
    leaves = _write(tmp_path / "leaves.jsonl", [
        {"id": "t1-a", "question": "Which club is in Urban Cowboy?", "golden_answers": ["Gilley's Club"],
         "parent_id": "t1"},
        {"id": "t1-b", "question": "Who founded Gilley's Club?", "golden_answers": [GILLEY], "parent_id": "t1"}])
    likelihood = {"gac_mode": "answer_likelihood", "gac_criterion": "sequence"}
    final, _, _ = run(trajectory_file, tmp_path / "final", cfg=config(**likelihood))
    agent = RecordingAgent()
    sub, _, _ = run(trajectory_file, tmp_path / "sub", agent=agent,
                    cfg=config(**likelihood, gac_target="sub_question", sub_questions=str(leaves)))
    first_round = {name: [r["passage_ids"][0] for r in rows_of(result) if (r["query_id"], r["round_index"]) == ("t1", 1)]
                   for name, result in (("final", final), ("sub", sub))}
    # the final answer favours the passages naming Gilley; the round's own target, the passage naming the club
    assert first_round == {"final": ["urban_cowboy_club-0"], "sub": ["urban_cowboy_club-3"]}
    assert {"Gilley's Club", GILLEY} <= agent.golds  # t3's rounds keep its final answer, "x"
    assert "x" in agent.golds
    # the second round pursues the founder: its target is the final answer's sub-answer, its rows unchanged
    second = [[r["passage_ids"][0] for r in rows_of(result) if (r["query_id"], r["round_index"]) == ("t1", 2)]
              for result in (final, sub)]
    assert second[0] == second[1]
    assert sub.stats["gac_target"] == {"sub_question": 2, "without_sub_question": 6}
    assert final.stats["gac_target"] == {}
