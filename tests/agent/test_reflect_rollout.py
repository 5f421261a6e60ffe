"""`reflect` rollouts in the environment ("Learning When to Search: Multi-Stage Reward Design for Efficient Agentic
RAG with Reasoning Language Models", section 3.2 "Rollout with Search"): a search -> information -> reflect ->
answer episode, a no-search episode, repeated searches, and the episodes whose shape the format reward rejects;
the retrieval count read from the text agrees with the rollout's.

The LLM is scripted over a character tokenizer; the client makes up passages ``{query}#{rank}``.
"""

from __future__ import annotations

from agent.dialects import ReflectDialect
from agent.dialects.reflect import INSTRUCTION, ReflectSettings, ShapeCheck, check_shape, search_queries
from agent.dialects.search_r1 import INVALID_ACTION_MESSAGE
from agent.env import EnvConfig, Rollout, rollout
from tests.fakes import CharScriptedLLM
from tests.fakes import FakeClient

SCRIPT = {
    "who wrote hamlet": ["<think>Not sure who wrote it.</think>\n<search> hamlet author </search>",
                         "<reflect>Doc 1 names the author.</reflect>\n<answer> William Shakespeare </answer>"],
    "capital of france": ["<think>I know this.</think>\n<reflect>Paris is the capital.</reflect>\n"
                          "<answer>Paris</answer>"],
    "birth year of the father of frederick of liege": [
        "<think>Two hops.</think>\n<search>frederick of liege father</search>",
        "<reflect>His father is Albert III.</reflect>\n<search>albert iii count of namur birth</search>",
        "<reflect>Born in 1027.</reflect>\n<answer>1027</answer>"],
}


def run_reflect(script: dict[str, list[str]] = SCRIPT, **config) -> tuple[list[Rollout], FakeClient]:
    client = FakeClient()
    env = EnvConfig(**{**ReflectSettings().env_fields(), **config})
    return rollout(list(script), CharScriptedLLM(script), client, env), client


def test_the_prompt_is_the_papers_instruction_with_the_question():
    (hamlet, france, _), _ = run_reflect()
    assert hamlet.prompt == INSTRUCTION + "\n\nQuestion: who wrote hamlet?\n"
    assert france.prompt == ReflectDialect().build_prompt("capital of france")


def test_a_search_information_reflect_answer_episode():
    (hamlet, _, _), client = run_reflect()
    queries, topk, questions = client.calls[0]
    assert "hamlet author" in queries and topk == 5 and questions[queries.index("hamlet author")] == "who wrote hamlet"
    assert [t.action for t in hamlet.turns] == ["search", "answer"]
    assert hamlet.turns[0].retrieved[0].ids == [f"hamlet author#{i}" for i in range(5)]
    observation = hamlet.turns[0].observation
    assert observation.startswith("\n\n<information>Doc 1(Title: ") and observation.count("Doc ") == 5
    assert hamlet.response_text == SCRIPT["who wrote hamlet"][0] + observation + SCRIPT["who wrote hamlet"][1]
    assert [s.text for s in hamlet.segments if not s.generated] == [observation]  # masked from the loss
    assert (hamlet.finish_reason, hamlet.answer) == ("answer", "William Shakespeare")
    assert check_shape(hamlet.response_text) == ShapeCheck(True, "think -> (search -> information -> reflect) x1 "
                                                                 "-> answer")
    assert search_queries(hamlet.response_text) == ["hamlet author"]
    assert len(search_queries(hamlet.response_text)) == hamlet.num_searches == 1


def test_a_no_search_episode_answers_in_one_turn_without_retrieval():
    (_, france, _), client = run_reflect()
    assert [t.action for t in france.turns] == ["answer"] and france.response_text == SCRIPT["capital of france"][0]
    assert all("capital of france" not in questions for _, _, questions in client.calls)
    assert (france.finish_reason, france.answer) == ("answer", "Paris")
    assert check_shape(france.response_text) == ShapeCheck(True, "think -> reflect -> answer")
    assert len(search_queries(france.response_text)) == france.num_searches == 0


def test_two_searches_each_reflected_on():
    (_, _, liege), client = run_reflect()
    assert [c[0] for c in client.calls] == [["hamlet author", "frederick of liege father"],
                                           ["albert iii count of namur birth"]]
    assert check_shape(liege.response_text).reason == "think -> (search -> information -> reflect) x2 -> answer"
    assert search_queries(liege.response_text) == ["frederick of liege father", "albert iii count of namur birth"]
    assert len(search_queries(liege.response_text)) == liege.num_searches == 2 and liege.answer == "1027"


def test_the_environment_executes_an_unreflected_search_and_the_shape_check_rejects_it():
    script = {"who wrote hamlet": ["<think>t</think><search>q1</search>", "<search>q2</search>",
                                   "<reflect>r</reflect><answer>Shakespeare</answer>"]}
    [hamlet], client = run_reflect(script)
    assert [c[0] for c in client.calls] == [["q1"], ["q2"]] and hamlet.answer == "Shakespeare"
    assert check_shape(hamlet.response_text) == ShapeCheck(False, "block 4 is <search>; expected <reflect> after "
                                                                  "<information>")
    assert len(search_queries(hamlet.response_text)) == hamlet.num_searches == 2


def test_an_invalid_turn_gets_the_rethink_message_and_breaks_the_shape():
    script = {"who wrote hamlet": ["<think>t</think>Answer: Shakespeare",
                                   "<think>t</think><reflect>r</reflect><answer>Shakespeare</answer>"]}
    [hamlet], client = run_reflect(script)
    assert [t.action for t in hamlet.turns] == ["invalid", "answer"] and client.calls == []
    assert hamlet.turns[0].observation == INVALID_ACTION_MESSAGE
    assert check_shape(hamlet.response_text) == ShapeCheck(False, "text outside tags at offset 16: 'Answer: "
                                                                  "Shakespeare\\nMy previous action i'")
    assert search_queries(hamlet.response_text) == []  # the message's quoted tags are not a search


def test_after_max_turns_the_last_search_is_not_executed_nor_counted():
    turns = ["<think>t</think><search>q0</search>"] + [f"<reflect>r</reflect><search>q{i}</search>" for i in (1, 2, 3)]
    [hamlet], client = run_reflect({"who wrote hamlet": turns}, max_turns=3)
    assert [c[0] for c in client.calls] == [["q0"], ["q1"], ["q2"]]
    assert hamlet.finish_reason == "max_turns" and hamlet.answer is None
    assert search_queries(hamlet.response_text) == ["q0", "q1", "q2"]
    assert len(search_queries(hamlet.response_text)) == hamlet.num_searches == 3
    assert check_shape(hamlet.response_text) == ShapeCheck(False, "no <answer>: the response ends after <search>")
