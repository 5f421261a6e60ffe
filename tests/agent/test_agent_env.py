"""Mechanics of the agent environment, with a scripted LLM (real SmolLM2 tokenizer) and a fake retriever."""

from __future__ import annotations

from itertools import groupby

import pytest

from agent.dialects import DIALECTS, SearchR1Dialect
from agent.env import EnvConfig, Prefix, Rollout, rollout
from agent.rollouts import make_trajectory
from agentic_retriever.base.client import RetrievalClient
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.llm.protocol import LLM
from agentic_retriever.base.qa_sources import QARow
from tests.fakes import FakeClient, ScriptedLLM, load_smollm2_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return load_smollm2_tokenizer()


def passages(query: str, k: int = 3) -> list[ScoredPassage]:
    return FakeClient().retrieve([query], k)[0]


def run(tokenizer, script, questions=None, client=None, prefixes=None, **config) -> tuple[list[Rollout], ScriptedLLM,
                                                                                           FakeClient]:
    llm, client = ScriptedLLM(tokenizer, script), client or FakeClient()
    out = rollout(questions or list(script), llm, client, EnvConfig(**config), prefixes=prefixes)
    return out, llm, client


def spans(result: Rollout) -> list[tuple[int, str]]:
    """(mask value, decoded text) of each maximal run of equal mask values."""
    ids, mask, out, pos = result.response_ids, result.response_mask, [], 0
    for value, run_ in groupby(mask):
        n = len(list(run_))
        out.append((value, load_smollm2_tokenizer().decode(ids[pos:pos + n])))
        pos += n
    return out


def test_fakes_implement_the_protocols(tokenizer):
    assert isinstance(ScriptedLLM(tokenizer, {}), LLM)
    assert isinstance(FakeClient(), RetrievalClient)


def test_search_then_answer(tokenizer):
    dialect = SearchR1Dialect()
    turn1 = "<think>need it</think>\n<search> hamlet author </search>"
    turn2 = "<think>ok</think>\n<answer> Shakespeare </answer>"
    [result], llm, client = run(tokenizer, {"who wrote hamlet": [turn1, turn2]})
    observation = dialect.format_observation([passages("hamlet author")])
    assert result.finish_reason == "answer" and result.answer == "Shakespeare"
    assert result.response_text == turn1 + observation + turn2
    assert [t.action for t in result.turns] == ["search", "answer"]
    assert result.turns[0].queries == ["hamlet author"] and result.turns[0].observation == observation
    assert result.turns[0].retrieved[0].ids == ["hamlet author#0", "hamlet author#1", "hamlet author#2"]
    assert result.num_searches == 1
    expected_prompt = llm.chat_prompt(dialect.build_prompt("who wrote hamlet"))
    assert result.prompt == expected_prompt
    assert llm.calls[0][0] == [tokenizer.encode(expected_prompt, add_special_tokens=False)]
    assert client.calls == [(["hamlet author"], 3, ["who wrote hamlet"])]


def test_masks_mark_generated_tokens_and_inserted_spans_decode_to_the_inserted_text(tokenizer):
    dialect = SearchR1Dialect()
    script = {"q one": ["I am not sure what to do", "<search> first query </search>", "<answer> x </answer>"]}
    [result], llm, _ = run(tokenizer, script)
    observation = dialect.format_observation([passages("first query")])
    assert spans(result) == [(1, "I am not sure what to do"), (0, dialect.invalid_action_message),
                             (1, "<search> first query </search>"), (0, observation), (1, "<answer> x </answer>")]
    assert [t.observation for t in result.turns] == [dialect.invalid_action_message, observation, ""]
    # each later prompt is the prompt ids plus the response ids so far: nothing is re-tokenised
    third_prompt = llm.calls[2][0][0]
    assert third_prompt == result.prompt_ids + [i for s in result.segments[:4] for i in s.token_ids]


def test_finished_trajectories_drop_out_and_each_step_makes_one_retrieval_call(tokenizer):
    script = {
        "question a": ["<answer> a </answer>"],
        "question b": ["<search> b1 </search>", "<answer> b </answer>"],
        "question c": ["<search> c1 </search>", "<search> c2 </search>", "<answer> c </answer>"],
    }
    results, llm, client = run(tokenizer, script)
    assert [len(prompts) for prompts, _ in llm.calls] == [3, 2, 1]
    assert client.calls == [(["b1", "c1"], 3, ["question b", "question c"]), (["c2"], 3, ["question c"])]
    assert [r.answer for r in results] == ["a", "b", "c"]
    assert [r.num_searches for r in results] == [0, 1, 2]


def test_after_max_turns_one_last_generation_runs_with_search_disabled(tokenizer):
    script = {
        "keeps searching": ["<search> s1 </search>", "<search> s2 </search>", "<search> s3 </search>"],
        "answers at last": ["<search> a1 </search>", "bad turn", "<answer> late </answer>"],
        "invalid at last": ["<search> i1 </search>", "<search> i2 </search>", "no action"],
    }
    results, llm, client = run(tokenizer, script, max_turns=2)
    searching, late, invalid = results
    assert len(llm.calls) == 3 and len(client.calls) == 2
    assert searching.finish_reason == "max_turns" and searching.answer is None
    assert searching.turns[-1].action == "search" and searching.turns[-1].retrieved == []
    assert searching.turns[-1].observation == "" and searching.response_text.endswith("<search> s3 </search>")
    assert searching.num_searches == 2
    assert (late.finish_reason, late.answer) == ("answer", "late")
    assert invalid.finish_reason == "max_turns" and invalid.response_text.endswith("no action")


def test_without_a_search_disabled_turn_the_trajectory_ends_after_max_turns(tokenizer, monkeypatch):
    class NoLastTurn(SearchR1Dialect):
        name = "no_last_turn"
        search_disabled_on_last_turn = False

    monkeypatch.setitem(DIALECTS, NoLastTurn.name, NoLastTurn)
    [result], llm, client = run(tokenizer, {"q": ["<search> s1 </search>", "<search> s2 </search>"]},
                                dialect="no_last_turn", max_turns=2)
    assert result.finish_reason == "max_turns" and len(llm.calls) == 2 and len(client.calls) == 1
    assert result.turns[-1].retrieved == [] and result.response_text.endswith("<search> s2 </search>")


def test_resume_from_a_prefix_shows_the_forced_passage_as_doc_1_then_retrieves_normally(tokenizer):
    dialect = SearchR1Dialect()
    forced = ScoredPassage("42", "Forced Title", "the only passage", 0.5)
    prefix_text = "<think>start</think>\n<search> original query </search>"
    script = {"resumed question": ["<search> next query </search>", "<answer> done </answer>"]}
    [result], llm, client = run(tokenizer, script, prefixes=[Prefix(prefix_text, [forced])], max_turns=3)
    forced_observation = '\n\n<information>Doc 1(Title: "Forced Title") the only passage</information>\n\n'
    assert dialect.format_observation([[forced]]) == forced_observation
    assert result.response_text.startswith(prefix_text + forced_observation)
    assert client.calls == [(["next query"], 3, ["resumed question"])]  # the forced search retrieved nothing
    first_prompt = llm.calls[0][0][0]
    inserted_ids = tokenizer.encode(prefix_text, add_special_tokens=False) + tokenizer.encode(forced_observation,
                                                                                              add_special_tokens=False)
    assert first_prompt == result.prompt_ids + inserted_ids
    assert result.turns[0].forced and result.turns[0].retrieved[0].ids == ["42"]
    assert (result.prefix, result.prefix_turns, result.answer) == (prefix_text, 1, "done")
    assert spans(result)[0] == (0, prefix_text + forced_observation)  # the prefix is not the model's
    assert result.turns[1].retrieved[0].ids[0] == "next query#0"


def test_prefix_turns_count_towards_max_turns(tokenizer):
    forced = [ScoredPassage("1", "T", "x")]
    prefix = "<search> a </search>\n\n<information>..</information>\n\n<search> b </search>"  # 2 turns used
    script = {"counted": ["<search> c </search>", "<answer> z </answer>"]}
    [result], _, client = run(tokenizer, script, prefixes=[Prefix(prefix, forced)], max_turns=2)
    assert client.calls == [] and result.turns[-1].retrieved == []  # that generation was the search-disabled one
    assert result.finish_reason == "max_turns"
    with pytest.raises(ValueError, match="max_turns"):
        run(tokenizer, script, prefixes=[Prefix(prefix, forced, turns_used=3)], max_turns=2)


def test_prefix_from_a_trajectory_cuts_at_the_turns_search_call(tokenizer):
    script = {"multi hop": ["<search> q1 </search>", "oops", "<search> q2 </search>", "<answer> a </answer>"]}
    [result], _, _ = run(tokenizer, script)
    trajectory = make_trajectory(QARow("1", "multi hop", ("a",)), result, EnvConfig(), "scripted", "fake")
    forced = [ScoredPassage("9", "Nine", "nine")]
    prefix = Prefix.from_trajectory(trajectory, 2, forced)
    t = trajectory.turns
    assert prefix.response_text == t[0].text + t[0].observation + t[1].text + t[1].observation + "<search> q2 </search>"
    assert prefix.turns_used == 3
    with pytest.raises(ValueError, match="not a generated search turn"):
        Prefix.from_trajectory(trajectory, 1, forced)


def test_observations_are_cut_to_the_token_budget(tokenizer):
    dialect = SearchR1Dialect()
    [result], _, _ = run(tokenizer, {"long q": ["<search> x </search>", "<answer> y </answer>"]},
                         client=FakeClient(text_words=200), observation_max_tokens=40)
    full = dialect.format_observation([FakeClient(text_words=200).retrieve(["x"], 3)[0]])
    observation = result.segments[1]
    assert len(observation.token_ids) == 40 and not observation.generated
    assert observation.token_ids == tokenizer.encode(full, add_special_tokens=False)[:40]
    assert full.startswith(observation.text) and observation.text == tokenizer.decode(observation.token_ids)
    assert result.turns[0].observation == observation.text


def test_context_budget_stops_a_trajectory_before_it_could_overflow(tokenizer):
    llm = ScriptedLLM(tokenizer, {})
    prompt_len = len(tokenizer.encode(llm.chat_prompt(SearchR1Dialect().build_prompt("budget q")),
                                      add_special_tokens=False))
    script = {"budget q": ["<search> x </search>", "<answer> never </answer>"], "tiny q": ["<answer> ok </answer>"]}
    results, llm, _ = run(tokenizer, script, max_new_tokens_per_turn=20, max_context_tokens=prompt_len + 30)
    assert [r.finish_reason for r in results] == ["context_exhausted", "answer"]
    assert results[0].answer is None and len(results[0].turns) == 1
    assert [len(p) for p, _ in llm.calls] == [2]
    assert all(len(p) + 20 <= prompt_len + 30 for prompts, _ in llm.calls for p in prompts)


def test_sampling_is_greedy_by_default_with_a_seed_per_step_and_the_dialects_stops(tokenizer):
    script = {"q1": ["<search> a </search>", "<answer> b </answer>"]}
    first, llm, _ = run(tokenizer, script)
    params = [p for _, p in llm.calls]
    assert all(p.greedy and p.max_new_tokens == 512 and p.stop == ["</search>", "</answer>"] for p in params)
    assert [p.seed for p in params] == [0, 1]
    again, _, _ = run(tokenizer, script)
    assert first == again
    _, sampled, _ = run(tokenizer, script, temperature=0.7, top_p=0.9, seed=None)
    assert [(p.temperature, p.top_p, p.seed) for _, p in sampled.calls] == [(0.7, 0.9, None)] * 2


def test_a_backend_that_ignores_stop_strings_is_cut_at_the_first_one(tokenizer):
    llm = ScriptedLLM(tokenizer, {"no stop": ["<search> a </search> and more <answer> z </answer>",
                                              "<answer> b </answer>"]}, honour_stop=False)
    [result] = rollout(["no stop"], llm, FakeClient(), EnvConfig())
    first = result.segments[0]
    assert first.text == "<search> a </search>" and tokenizer.decode(first.token_ids) == first.text
    assert result.answer == "b"


def test_a_dialect_can_retrieve_before_the_first_turn(tokenizer, monkeypatch):
    class PreRetrieving(SearchR1Dialect):
        name = "pre_retrieving"

        def initial_queries(self, question):
            return (question,)

        def build_prompt(self, question, initial_passages=()):
            titles = ", ".join(p.title for hits in initial_passages for p in hits)
            return f"Known: {titles}. Question: {question}\n"

    monkeypatch.setitem(DIALECTS, PreRetrieving.name, PreRetrieving)
    [result], _, client = run(tokenizer, {"pre q": ["<answer> a </answer>"]}, dialect="pre_retrieving", topk=2)
    assert client.calls == [(["pre q"], 2, ["pre q"])]
    assert "Known: Title pre q 0, Title pre q 1. Question: pre q" in result.prompt
    assert result.turns[0].text == "" and result.turns[0].retrieved[0].ids == ["pre q#0", "pre q#1"]
    assert result.num_searches == 1 and result.response_text == "<answer> a </answer>"


def test_config_and_arguments_are_checked():
    with pytest.raises(ValueError, match="max_turns"):
        EnvConfig(max_turns=0)
    with pytest.raises(ValueError, match="unknown dialect"):
        EnvConfig(dialect="nope")
    with pytest.raises(ValueError, match="parallel"):
        rollout(["a", "b"], ScriptedLLM(None, {}), FakeClient(), EnvConfig(), prefixes=[None])
