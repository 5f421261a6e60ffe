"""The s3 searcher dialect: Figure 11 byte for byte, the turn parser on malformed turns, and the D_s3 bookkeeping
(selection per block, the no-important_info rule, dedup, the per-block token budget)."""

from __future__ import annotations

import hashlib

import pytest

from agent.dialects import Action, S3Dialect, get_dialect
from agent.dialects.s3 import (INVALID_ACTION_MESSAGE, NAIVE_RAG_TOPK, SEARCHER_PROMPT, S3Selection, S3Settings,
                              parse_turn)
from agentic_retriever.base.corpus import ScoredPassage
from tests.agent.paper_text import S3_PAPER, figure_text

@pytest.mark.skipif(not S3_PAPER.exists(), reason="the s3 paper's text is not next to this checkout")
def test_searcher_prompt_is_figure_11_of_the_paper_byte_for_byte():
    paper = S3_PAPER.read_text(encoding="utf-8")
    assert SEARCHER_PROMPT == figure_text(paper, 11, "Prompt Instructions for Searcher")


def test_searcher_prompt_hash_and_distinctive_sentences():
    assert hashlib.sha256(SEARCHER_PROMPT.encode()).hexdigest() == (
        "5baa852ec86caaa373d58b32ce712f93dd54bf0c91d4fa769f4a03cc95b2947d")
    assert SEARCHER_PROMPT.startswith("You are a search copilot for a generation model. Based on a user\u2019s query")
    assert "(up to 3 documents, within the current information window)" in SEARCHER_PROMPT
    assert "<query> \\rightarrow <information> \\rightarrow <important_info>" in SEARCHER_PROMPT
    assert SEARCHER_PROMPT.endswith("[An abstractive example of s3 loop] <question> {question} </question> "
                                    "<information> {initial_search_result} </information>")


def docs(prefix: str, n: int, words: int = 3) -> list[ScoredPassage]:
    return [ScoredPassage(f"{prefix}{i}", f"T{prefix}{i}", " ".join([f"w{i}"] * words), 1.0 - i / 10)
            for i in range(1, n + 1)]


def test_the_dialect_is_registered_and_searches_with_the_question_first():
    dialect = get_dialect("s3")
    assert isinstance(dialect, S3Dialect)
    assert dialect.initial_queries("  who wrote hamlet ") == ("  who wrote hamlet ",)  # as naive RAG searches it
    assert dialect.initial_topk == NAIVE_RAG_TOPK == 3
    assert dialect.stop == ("</query>",)
    assert dialect.search_disabled_on_last_turn
    assert dialect.invalid_action_message == INVALID_ACTION_MESSAGE
    assert dialect.extract_answer("<search_complete>True</search_complete>") is None


def test_prompt_fills_figure_11_with_the_question_and_the_initial_documents():
    prompt = S3Dialect().build_prompt("who wrote hamlet", [docs("a", 2)])
    assert prompt == SEARCHER_PROMPT.format(
        question="who wrote hamlet?",
        initial_search_result='Doc 1(Title: "Ta1") w1 w1 w1\nDoc 2(Title: "Ta2") w2 w2 w2')
    with pytest.raises(ValueError, match="exactly one initial search"):
        S3Dialect().build_prompt("q", [])


def test_observation_is_an_information_block_of_doc_lines():
    assert S3Dialect().format_observation([docs("b", 2, words=1)]) == (
        '\n\n<information>Doc 1(Title: "Tb1") w1\nDoc 2(Title: "Tb2") w2</information>\n\n')


@pytest.mark.parametrize("turn, action", [
    ('<important_info>[1]</important_info><search_complete>False</search_complete><query>{"query": "x y"}</query>',
     Action("search", ("x y",))),
    ('<search_complete>True</search_complete>', Action("answer")),
    ('<search_complete> true </search_complete><query>{"query": "ignored"}</query>', Action("answer")),
    ('<query>not json</query>', Action("search", ("",))),                     # parse failure: empty query
    ('<query>{"q": "wrong key"}</query>', Action("search", ("",))),
    ('<query>{"query": ["a list"]}</query>', Action("search", ("",))),
    ('{"query": "after the rethink message"}\n</query>', Action("search", ("after the rethink message",))),
    ('<search_complete>False</search_complete>', Action("invalid")),          # neither query nor completion
    ('<search_complete>maybe</search_complete>', Action("invalid")),
    ('<query>{"query": "unclosed"}', Action("invalid")),
    ("", Action("invalid")),
])
def test_parse_action(turn, action):
    assert S3Dialect().parse_action(turn) == action


def test_parse_turn_reports_what_it_could_not_read():
    turn = parse_turn('<important_info>1 and 7</important_info><search_complete>perhaps</search_complete>'
                      '<query>{"query": "first"}</query><query>{"query": "second"}</query>')
    assert turn.query == "first" and turn.repeated_tags == ("query",)
    assert turn.important_ids == (1, 7) and turn.selection_malformed
    assert turn.search_complete is None and turn.complete_malformed
    bad = parse_turn("<query>{oops</query>")
    assert bad.query == "" and bad.query_parse_failed and bad.important_ids is None and bad.search_complete is None
    assert parse_turn("<important_info>[]</important_info>").important_ids == ()


def words(text: str) -> int:
    return len(text.split())


def test_selection_keeps_chosen_documents_per_block_and_all_of_unselected_blocks():
    selection = S3Selection(words)
    block0 = selection.observe(docs("a", 3))               # the prompt's block: never selected from
    assert block0 == docs("a", 3)
    selection.read_turn('<search_complete>False</search_complete><query>{"query": "q1"}</query>')
    selection.observe(docs("b", 4))
    selection.read_turn('<important_info>[4, 2]</important_info><search_complete>True</search_complete>')
    assert [d.id for d in selection.documents()] == ["a1", "a2", "a3", "b2", "b4"]  # block order, then doc order
    assert selection.counters.ignored_ids == 0 and selection.counters.turns_without_action == 0


def test_selection_ignores_and_counts_ids_outside_the_current_block_beyond_three_or_late():
    selection = S3Selection(words)
    selection.observe(docs("a", 8))
    selection.read_turn('<important_info>[8, 9, 0, 8, 1, 2, 3]</important_info><query>{"query": "q"}</query>')
    selection.observe(docs("b", 2))                         # a shorter block: id 5 was valid only in the older one
    selection.read_turn('<important_info>[5, 2]</important_info><query>not json</query>')
    selection.read_turn('<important_info>[1]</important_info>')  # the block already has its selection
    assert [d.id for d in selection.documents()] == ["a1", "a2", "a8", "b2"]
    counters = selection.counters
    assert counters.ignored_ids == 4 + 1 + 1                # 9, 0, repeated 8, the 4th valid id (3); 5; the late 1
    assert counters.late_selections == 1
    assert counters.query_parse_failures == 1
    assert counters.turns_without_action == 1


def test_selection_before_any_block_and_malformed_tags_are_counted():
    selection = S3Selection(words)
    selection.read_turn("<important_info>[1]</important_info><important_info>[2]</important_info>")
    assert selection.counters.late_selections == 1 and selection.counters.repeated_tags == 1
    selection.observe(docs("a", 3))
    selection.read_turn("<important_info>two</important_info><search_complete>yes</search_complete>")
    assert selection.documents() == []                     # a selection that names nothing keeps nothing
    assert selection.counters.malformed_selections == 1


def test_documents_are_deduplicated_by_id_keeping_the_first():
    selection = S3Selection(words)
    selection.observe(docs("a", 2))
    selection.read_turn('<query>{"query": "again"}</query>')
    selection.observe([docs("a", 2)[1], docs("c", 1)[0]])
    assert [d.id for d in selection.documents()] == ["a1", "a2", "c1"]
    assert selection.counters.duplicate_docs == 1


def test_each_block_shows_whole_documents_within_the_token_budget():
    # a rendered line 'Doc i(Title: "Tai") w w w w\n' is 7 words: two fit in 15, the third does not
    selection = S3Selection(words, max_doc_tokens=15)
    shown = selection.observe(docs("a", 4, words=4))
    assert [d.id for d in shown] == ["a1", "a2"]
    assert selection.counters.docs_over_budget == 2
    selection.read_turn("<important_info>[3]</important_info>")  # not shown, so not selectable
    assert selection.documents() == [] and selection.counters.ignored_ids == 1


def test_settings_default_to_the_papers_main_run_and_reject_nonsense():
    settings = S3Settings()
    assert (settings.topk, settings.max_selected, settings.max_turns, settings.max_doc_tokens,
            settings.max_context_tokens) == (8, 3, 3, 1400, 8000)
    with pytest.raises(ValueError, match="max_selected"):
        S3Settings(max_selected=0)
    with pytest.raises(ValueError, match="max_doc_tokens"):
        S3Selection(words, max_doc_tokens=0)
