"""The QAgent dialect ("QAgent: A modular Search Agent with Interactive Query Understanding", arXiv 2510.08383):
Table 5 byte for byte, the parser on malformed turns, the one-block observation, and the passage set K."""

from __future__ import annotations

import hashlib

import pytest

from agent.dialects import Action, QAgentDialect, get_dialect
from agent.dialects.qagent import (PROMPT_TEMPLATE, QUESTION_PLACEHOLDER, QAgentPassages, QAgentSettings, parse_turn,
                                   search_queries)
from agent.dialects.search_r1 import INVALID_ACTION_MESSAGE
from agent.env import EnvConfig
from agentic_retriever.base.corpus import Passage, ScoredPassage
from tests.agent.paper_text import QAGENT_PAPER, table_text


@pytest.mark.skipif(not QAGENT_PAPER.exists(), reason="the QAgent paper's text is not next to this checkout")
def test_prompt_is_table_5_of_the_paper_byte_for_byte():
    paper = QAGENT_PAPER.read_text(encoding="utf-8")
    assert PROMPT_TEMPLATE == table_text(paper, 5, "Search for information to answer the given question.")


def test_prompt_hash_and_distinctive_sentences():
    assert hashlib.sha256(PROMPT_TEMPLATE.encode()).hexdigest() == (
        "aaed62bd95318860860fafda46704bb53e6125db5101a6e00e1b6494c39122f1")
    assert PROMPT_TEMPLATE.count(QUESTION_PLACEHOLDER) == 1 and PROMPT_TEMPLATE.endswith("Question: {questionquestion}.")
    assert "search multiple queries (no more than 3) by\n<search>\n<query>query1</query>\n" in PROMPT_TEMPLATE
    assert "such as <search>\\n <query>query1</query>\\n" in PROMPT_TEMPLATE  # the paper's literal backslash-n
    assert "\u201cxxx\u201d, should be a few short words." in PROMPT_TEMPLATE


def test_the_dialect_is_registered_and_keeps_search_r1s_loop():
    dialect = get_dialect("qagent")
    assert isinstance(dialect, QAgentDialect) and dialect.settings == QAgentSettings()
    assert dialect.stop == ("</search>", "</answer>")
    assert dialect.invalid_action_message is INVALID_ACTION_MESSAGE
    assert dialect.search_disabled_on_last_turn
    assert dialect.initial_queries("who wrote hamlet") == ()


def test_settings_are_the_papers_and_fix_the_environment():
    settings = QAgentSettings()
    assert (settings.topk, settings.max_queries, settings.max_turns, settings.max_new_tokens_per_turn,
            settings.max_context_tokens) == (1, 3, 5, 512, 8192)
    env = EnvConfig(**settings.env_fields())
    assert (env.dialect, env.topk, env.max_turns, env.max_new_tokens_per_turn, env.max_context_tokens) == (
        "qagent", 1, 5, 512, 8192)
    with pytest.raises(ValueError, match="QAgentSettings.max_queries must be at least 1, got 0"):
        QAgentSettings(max_queries=0)


def test_prompt_fills_the_papers_placeholder_with_the_stripped_question():
    prompt = QAgentDialect().build_prompt("  who wrote hamlet \n")
    assert prompt == PROMPT_TEMPLATE.replace(QUESTION_PLACEHOLDER, "who wrote hamlet")
    assert prompt.endswith("\nQuestion: who wrote hamlet.") and "{" not in prompt
    with pytest.raises(ValueError, match="the question is empty"):
        QAgentDialect().build_prompt("  ")
    with pytest.raises(ValueError, match="retrieves nothing before the first turn"):
        QAgentDialect().build_prompt("q", [[ScoredPassage("1", "t", "x", 1.0)]])


@pytest.mark.parametrize("turn, action", [
    ("<plan>two facts</plan>\n<search>\n<query> a </query>\n<query>b</query>\n</search>",
     Action("search", ("a", "b"))),
    ("<search>\nfirst query\n\n   \nsecond query\n</search>", Action("search", ("first query", "second query"))),
    ("<search> only one </search>", Action("search", ("only one",))),
    ("<search>\n<query>1</query><query>2</query><query>3</query><query>4</query>\n</search>",
     Action("search", ("1", "2", "3"))),                                      # past 3: the first 3
    ("<search>a\nb\nc\nd\ne</search>", Action("search", ("a", "b", "c"))),
    ("<search><query>tagged</query>\nuntagged line</search>", Action("search", ("tagged",))),
    ("<search>\n<query>unclosed\n</search>", Action("search", ("unclosed",))),  # a stray tag is removed
    ("<search><query></query><query> x </query></search>", Action("search", ("x",))),
    ("<search >spaced tag</search>", Action("search", ("spaced tag",))),      # Table 5's own "<search >"
    ("<search>\n\n</search>", Action("invalid")),                              # no query
    ("<search><query> </query></search>", Action("invalid")),
    ("<search>never closed", Action("invalid")),
    ("<plan>thinking only</plan>", Action("invalid")),
    ("", Action("invalid")),
    ("<reflection>enough</reflection>\n<answer>\n Paris \n</answer>", Action("answer", answer="Paris")),
    ("<answer>x</answer><search>y</search>", Action("answer", answer="x")),   # the first closed tag decides
])
def test_parse_action(turn, action):
    assert QAgentDialect().parse_action(turn) == action


def test_parse_turn_counts_queries_past_the_limit():
    turn = parse_turn("<search><query>a</query><query>b</query><query>c</query><query>d</query>"
                      "<query>e</query></search>")
    assert turn.kind == "search" and turn.queries == ("a", "b", "c") and turn.dropped_queries == 2
    assert parse_turn("<search>a\nb</search>", max_queries=1).queries == ("a",)
    assert parse_turn("no tags").kind is None
    assert search_queries("\n <query>x</query> \n") == ["x"]


def test_a_dialect_with_more_queries_allowed_keeps_them():
    dialect = QAgentDialect(QAgentSettings(max_queries=5))
    assert dialect.parse_action("<search>a\nb\nc\nd</search>") == Action("search", ("a", "b", "c", "d"))


def hit(pid: str) -> ScoredPassage:
    return ScoredPassage(pid, f"T{pid}", f"text of {pid}", 1.0)


def test_observation_is_one_information_block_for_all_queries():
    observation = QAgentDialect().format_observation([[hit("a")], [hit("b")], [hit("c")]])
    assert observation == ('\n\n<information>Doc 1(Title: "Ta") text of a\nDoc 2(Title: "Tb") text of b\n'
                           'Doc 3(Title: "Tc") text of c</information>\n\n')
    assert observation.count("<information>") == 1


def test_answer_is_the_last_answer_of_the_response():
    dialect = QAgentDialect()
    assert dialect.extract_answer("<answer> a </answer> ... <answer>\n b\n </answer>") == "b"
    assert dialect.extract_answer("<search>q</search>") is None


def test_the_passage_set_keeps_every_passage_once_first_seen_first():
    tracker = QAgentDialect().document_tracker(len)
    assert isinstance(tracker, QAgentPassages)
    assert tracker.observe([hit("a"), hit("b")]) == [hit("a"), hit("b")]   # the agent is shown everything
    tracker.read_turn("<search><query>q1</query><query>q2</query></search>")
    tracker.observe([hit("b")])
    tracker.observe([hit("c"), hit("a")])
    selection = tracker.selected()
    assert selection.documents == [Passage("a", "Ta", "text of a"), Passage("b", "Tb", "text of b"),
                                   Passage("c", "Tc", "text of c")]
    assert selection.counters == {"duplicate_passages": 2, "searches_without_queries": 0, "queries_beyond_limit": 0}


def test_the_tracker_counts_empty_searches_and_queries_past_the_limit():
    tracker = QAgentPassages()
    tracker.read_turn("<search>\n\n</search>")
    tracker.read_turn("<search>a\nb\nc\nd\ne</search>")
    tracker.read_turn("<answer>x</answer>")
    tracker.read_turn("invalid")
    assert tracker.selected().documents == []
    assert tracker.selected().counters == {"duplicate_passages": 0, "searches_without_queries": 1,
                                           "queries_beyond_limit": 2}
