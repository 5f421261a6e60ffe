"""s3 rollouts in the environment ("s3: You Don't Need That Much Data to Train a Search Agent via RL", arXiv
2505.14146, section 3.1): the dialect's `S3Selection` bounds the prompt's and every observation's documents by the
per-turn token budget, reads every generated turn, and hands D_s3 and its counters to the rollout and its trajectory.

The LLM is scripted over a character tokenizer (one token per character), so token budgets are character counts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pytest

from agent.dialects import S3Dialect, SelectedDocuments
from agent.dialects.s3 import SEARCHER_PROMPT, S3Settings, format_documents
from agent.env import EnvConfig, Rollout, rollout
from agent.rollouts import make_trajectory
from agent.trajectory import TrajectoryWriter, read_trajectories
from agentic_retriever.base.corpus import Passage, ScoredPassage
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.base.qa_sources import QARow
from tests.fakes import CharScriptedLLM

BUDGET = S3Settings().max_doc_tokens  # 1,400 document tokens per turn ([P] Appendix A.2)


class TableClient:
    """A fixed result list per query (at most `topk` of it); records every query and its depth."""

    def __init__(self, table: dict[str, list[ScoredPassage]]):
        self.table, self.queries, self.topks = table, [], []

    def retrieve(self, queries: Sequence[str], topk: int, questions=None) -> list[list[ScoredPassage]]:
        self.queries.extend(queries)
        self.topks.extend([topk] * len(queries))
        return [self.table[q][:topk] for q in queries]


def doc(pid: str, size: int = 400) -> ScoredPassage:
    """A passage whose text is `size` characters (its ``Doc i(Title: ...)`` line about 20 more)."""
    return ScoredPassage(pid, f"T{pid}", (pid + " ") * (size // (len(pid) + 1)), 1.0)


# three 400-character documents fit the 1,400-token budget of a turn, a fourth does not (nor a 700-character
# third after two); the first search is naive RAG's: the question as asked, its top 3
HAMLET = [doc("a1"), doc("a2"), doc("a3", 700), doc("a4"), doc("a5")]
AUTHOR = [doc("b1"), doc("a2"), doc("b3"), doc("b4")]
EMPTY = [doc("c1", 100), doc("c2", 100)]
PERU = [doc(f"p{i}", 100) for i in range(1, 4)]
TABLE = {"who wrote hamlet": HAMLET, "hamlet author": AUTHOR, "": EMPTY, "capital of peru": PERU}

SCRIPT = {
    "who wrote hamlet": [
        '<important_info>[2, 9]</important_info><search_complete>False</search_complete>'
        '<query>{"query": "hamlet author"}</query>',
        '<search_complete>False</search_complete><query>not json</query>',         # no selection: the whole block
        '<important_info>[2]</important_info><search_complete>False</search_complete>'
        '<query>{"query": "never searched"}</query>',                              # the search-disabled last turn
    ],
    "capital of peru": [
        "<important_info>[3]</important_info> I am not sure",                       # an invalid turn that selects
        "<search_complete>True</search_complete>",
    ],
}


def run_s3(script: dict[str, list[str]] = SCRIPT, **config) -> tuple[list[Rollout], CharScriptedLLM, TableClient]:
    llm, client = CharScriptedLLM(script), TableClient(TABLE)
    env = EnvConfig(**{"dialect": "s3", "topk": 8, "max_turns": 2, "max_new_tokens_per_turn": 200,
                       "max_context_tokens": 12000, **config})
    return rollout(list(script), llm, client, env), llm, client


def test_the_prompt_holds_only_the_initial_documents_within_the_budget():
    (hamlet, peru), _, client = run_s3()
    assert client.queries[:2] == ["who wrote hamlet", "capital of peru"]
    assert client.topks[:2] == [3, 3]  # naive RAG's depth, not env.topk (8)
    assert hamlet.prompt == SEARCHER_PROMPT.format(question="who wrote hamlet?",
                                                   initial_search_result=format_documents(HAMLET[:2]).strip())
    assert len(format_documents(HAMLET[:2])) <= BUDGET < len(format_documents(HAMLET[:3]))
    assert HAMLET[2].text not in hamlet.prompt
    assert hamlet.turns[0].retrieved[0].ids == [d.id for d in HAMLET[:3]]  # the record keeps what was retrieved
    assert peru.prompt.endswith(f"<information> {format_documents(PERU).strip()} </information>")


def test_each_observation_shows_whole_documents_within_the_budget_and_is_not_cut():
    [hamlet, _], _, client = run_s3(observation_max_tokens=100)
    assert client.queries[2:] == ["hamlet author", ""]                  # "not json" searches with ""
    author, empty = hamlet.turns[1].observation, hamlet.turns[2].observation
    assert author == S3Dialect().format_observation([AUTHOR[:3]])        # b4 would pass the budget
    assert len(format_documents(AUTHOR[:3])) <= BUDGET < len(format_documents(AUTHOR))
    assert len(author) > 100 and author.endswith("</information>\n\n")  # observation_max_tokens does not apply
    assert empty == S3Dialect().format_observation([EMPTY])
    assert [s.text for s in hamlet.segments if not s.generated] == [author, empty]


def test_the_rollout_carries_d_s3_by_the_selection_rules_and_counts_what_was_ignored():
    (hamlet, peru), _, _ = run_s3()
    assert hamlet.finish_reason == "max_turns" and len(hamlet.turns) == 4 and hamlet.turns[-1].observation == ""
    # block 0 selects a2 (9 is ignored); block 1 has no important_info: all it showed, the repeated a2 dropped;
    # block 2's selection comes from the search-disabled last turn
    assert hamlet.selection.documents == [Passage(d.id, d.title, d.text) for d in (HAMLET[1], AUTHOR[0],
                                                                                  AUTHOR[2], EMPTY[1])]
    counters = hamlet.selection.counters
    assert (counters["ignored_ids"], counters["query_parse_failures"], counters["duplicate_docs"],
            counters["docs_over_budget"], counters["turns_without_action"]) == (1, 1, 1, 2, 0)
    assert peru.finish_reason == "answer" and peru.answer is None
    assert peru.selection == SelectedDocuments([Passage("p3", "Tp3", PERU[2].text)],
                                               {**dict.fromkeys(counters, 0), "turns_without_action": 1})


def test_a_trajectory_file_round_trips_the_selection(tmp_path):
    (hamlet, _), _, _ = run_s3()
    config = EnvConfig(dialect="s3")
    trajectory = make_trajectory(QARow("q1", "who wrote hamlet", ("Shakespeare",)), hamlet, config, "m", "r")
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write([trajectory])
    row = json.loads(path.read_text())
    assert row["selection"]["documents"][0] == {"id": "a2", "title": "Ta2", "text": HAMLET[1].text}
    assert row["selection"]["counters"]["ignored_ids"] == 1
    [back] = read_trajectories(path)
    assert back == trajectory and back.selection == hamlet.selection


def test_a_search_r1_trajectory_has_no_selection_and_older_files_still_read(tmp_path):
    llm = CharScriptedLLM({"who wrote hamlet": ["<search> hamlet author </search>", "<answer> Shakespeare </answer>"]})
    config = EnvConfig(max_context_tokens=12000)
    [result] = rollout(["who wrote hamlet"], llm, TableClient(TABLE), config)
    assert result.selection is None
    assert result.turns[0].observation.startswith("\n\n<information>") and len(result.turns[0].observation) == 500
    trajectory = make_trajectory(QARow("q1", "who wrote hamlet", ("Shakespeare",)), result, config, "m", "r")
    assert "selection" not in trajectory.to_json()
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(trajectory.to_json()) + "\n")
    assert list(read_trajectories(path)) == [trajectory]


@pytest.mark.parametrize("selection, field", [
    ({"documents": [{"id": "a", "title": "t"}], "counters": {}}, "selection.documents[0].text"),
    ({"documents": [], "counters": {"ignored_ids": "1"}}, "selection.counters.ignored_ids"),
    ({"documents": []}, "selection.counters"),
])
def test_a_malformed_selection_names_its_field(tmp_path, selection, field):
    (hamlet, _), _, _ = run_s3()
    row = make_trajectory(QARow("q1", "who wrote hamlet", ()), hamlet, EnvConfig(dialect="s3"), "m", "r").to_json()
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({**row, "selection": selection}) + "\n")
    with pytest.raises(DataFormatError, match=re.escape(f"field '{field}'")):
        list(read_trajectories(path))
