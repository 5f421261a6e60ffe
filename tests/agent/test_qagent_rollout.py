"""QAgent rollouts in the environment ("QAgent: A modular Search Agent with Interactive Query Understanding", arXiv
2510.08383, Algorithm 1): a multi-query search is one retrieval call and one ``<information>`` block (top-1 per
query with the paper's settings), and the rollout's selection is the episode's deduplicated passage set K.

The LLM is scripted over a character tokenizer; the client makes up passages ``{query}#{rank}``.
"""

from __future__ import annotations

from agent.dialects import QAgentDialect
from agent.dialects.qagent import PROMPT_TEMPLATE, QUESTION_PLACEHOLDER, QAgentSettings
from agent.dialects.search_r1 import INVALID_ACTION_MESSAGE
from agent.env import EnvConfig, Rollout, rollout
from tests.fakes import CharScriptedLLM, FakeClient


SCRIPT = {
    "who wrote hamlet": [
        "<plan>find the author and the date</plan>\n<search>\n<query>hamlet author</query>\n"
        "<query>hamlet date</query>\n</search>",
        "<reflection>partial</reflection>\n<plan>more</plan>\n<search>\nhamlet author\nshakespeare birth\n\n"
        "globe theatre\nstratford\n</search>",                                  # a repeat, and a 4th query
        "<plan>again</plan>\n<search>\n\n</search>",                               # no query: invalid
        "<reflection>enough</reflection>\n<answer> Shakespeare </answer>",
    ],
    "capital of peru": ["<plan>one fact</plan>\n<search><query>peru capital</query></search>",
                        "<reflection>found</reflection><answer>Lima</answer>"],
}


def run_qagent(script: dict[str, list[str]] = SCRIPT, **config) -> tuple[list[Rollout], FakeClient]:
    client = FakeClient()
    env = EnvConfig(**{**QAgentSettings().env_fields(), **config})
    return rollout(list(script), CharScriptedLLM(script), client, env), client


def test_the_prompt_is_table_5_with_the_question():
    (hamlet, _), _ = run_qagent()
    assert hamlet.prompt == PROMPT_TEMPLATE.replace(QUESTION_PLACEHOLDER, "who wrote hamlet")


def test_a_multi_query_search_is_one_call_and_one_information_block_of_top_1_passages():
    (hamlet, peru), client = run_qagent()
    queries, topk, questions = client.calls[0]
    assert queries == ["hamlet author", "hamlet date", "peru capital"] and topk == 1  # the whole step, one call
    assert questions == ["who wrote hamlet", "who wrote hamlet", "capital of peru"]
    first = hamlet.turns[0]
    assert first.queries == ["hamlet author", "hamlet date"]
    assert [r.ids for r in first.retrieved] == [["hamlet author#0"], ["hamlet date#0"]]
    assert first.observation.count("<information>") == 1 and first.observation.count("</information>") == 1
    assert first.observation == QAgentDialect().format_observation(
        [[FakeClient().retrieve([q], 1)[0][0]] for q in ("hamlet author", "hamlet date")])
    assert client.calls[1][0] == ["hamlet author", "shakespeare birth", "globe theatre"]  # "stratford" dropped
    assert peru.turns[0].observation.count("Doc ") == 1


def test_an_empty_search_gets_the_rethink_message_and_the_answer_ends_the_episode():
    (hamlet, peru), client = run_qagent()
    assert [t.action for t in hamlet.turns] == ["search", "search", "invalid", "answer"]
    assert hamlet.turns[2].observation == INVALID_ACTION_MESSAGE and len(client.calls) == 2
    assert (hamlet.finish_reason, hamlet.answer) == ("answer", "Shakespeare")
    assert (peru.finish_reason, peru.answer) == ("answer", "Lima")
    inserted = [s.text for s in hamlet.segments if not s.generated]
    assert inserted == [hamlet.turns[0].observation, hamlet.turns[1].observation, INVALID_ACTION_MESSAGE]


def test_the_selection_is_every_retrieved_passage_once_first_seen_first():
    (hamlet, peru), _ = run_qagent()
    assert [d.id for d in hamlet.selection.documents] == [
        "hamlet author#0", "hamlet date#0", "shakespeare birth#0", "globe theatre#0"]
    assert hamlet.selection.documents[0].text == FakeClient().retrieve(["hamlet author"], 1)[0][0].text
    assert hamlet.selection.counters == {"duplicate_passages": 1, "searches_without_queries": 1,
                                         "queries_beyond_limit": 1}
    assert [d.id for d in peru.selection.documents] == ["peru capital#0"]


def test_after_max_turns_the_last_generation_searches_nothing_and_adds_nothing_to_the_selection():
    script = {"who wrote hamlet": [f"<plan>p</plan><search><query>q{i}</query></search>" for i in range(3)]}
    [hamlet], client = run_qagent(script, max_turns=2)
    assert [c[0] for c in client.calls] == [["q0"], ["q1"]]
    assert hamlet.finish_reason == "max_turns" and len(hamlet.turns) == 3 and hamlet.turns[-1].observation == ""
    assert [d.id for d in hamlet.selection.documents] == ["q0#0", "q1#0"]


def test_a_wider_topk_shows_and_keeps_every_passage_of_every_query():
    [peru], client = run_qagent({"capital of peru": SCRIPT["capital of peru"]}, topk=3)
    assert client.calls[0][1] == 3 and peru.turns[0].observation.count("Doc ") == 3
    assert [d.id for d in peru.selection.documents] == ["peru capital#0", "peru capital#1", "peru capital#2"]
