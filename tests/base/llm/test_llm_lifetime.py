"""Engines with a lifetime and generations the engine aborted: every backend closes (the commands close what
they load before the next step takes the device), and an aborted generation is tried once more, then ends its
trajectory as ``aborted``, never as a stop."""

from __future__ import annotations

import sys
import types

import pytest

from agent.env import EnvConfig, rollout
from agentic_retriever.base.llm import LLMConfig, SamplingParams, load_llm
from agentic_retriever.base.llm.protocol import Generation
from agentic_retriever.base.llm.transformers import TransformersLLM
from agentic_retriever.base.llm.vllm import to_generation
from tests.fakes import ClosableLLM, FakeAgent, FakeClient, FakeScorer, load_smollm2_tokenizer, write_jsonl


def test_a_loaded_transformers_model_is_let_go_and_a_lent_one_kept(tiny_causal_lm_dir):
    with TransformersLLM.load(tiny_causal_lm_dir) as llm:
        assert llm.owns_model
    assert llm.model is None and llm.prefix_cache is None
    loaded = TransformersLLM.load(tiny_causal_lm_dir)
    lent = TransformersLLM(loaded.model, loaded.tokenizer)  # e.g. the RL trainer's policy
    lent.close()
    assert lent.model is loaded.model


def test_a_vllm_engine_is_shut_down_once(monkeypatch):
    events: list[str] = []
    module = types.ModuleType("vllm")

    class Engine:
        def __init__(self, **kwargs):
            events.append("start")

        def shutdown(self):
            events.append("shutdown")

    module.LLM, module.SamplingParams = Engine, dict
    monkeypatch.setitem(sys.modules, "vllm", module)
    with load_llm(LLMConfig(backend="vllm", model="m")) as llm:
        assert llm.engine is not None
    llm.close()  # a second close does nothing
    assert events == ["start", "shutdown"] and llm.engine is None


class Recording(ClosableLLM):
    """Records generate and close calls into a shared event list."""

    def __init__(self, inner, name: str, events: list[str]):
        self.inner, self.name, self.events = inner, name, events

    tokenizer = property(lambda self: self.inner.tokenizer)

    def chat_prompt(self, message):
        return self.inner.chat_prompt(message)

    def generate(self, prompts, params):
        self.events.append(f"{self.name} generates")
        return self.inner.generate(prompts, params)

    def score(self, prompts, continuations):
        self.events.append(f"{self.name} scores")
        return self.inner.score(prompts, continuations)

    def close(self):
        self.events.append(f"{self.name} closed")
        super().close()


def test_the_commands_close_the_engines_they_load_when_their_step_ends(tmp_path, monkeypatch):
    """`agent rollout` and `mine run` (its agent and its scorer, each once, also when mining fails) close their
    engines before returning, so the loop's next step finds the device free."""
    from agent.rollouts import RolloutConfig, run_rollout_job
    from agentic_retriever.mining.job import MineJobConfig, run_mine_job

    events: list[str] = []
    monkeypatch.setattr("agentic_retriever.base.llm.load_llm", lambda config: Recording(
        FakeScorer() if config.model == "scorer" else FakeAgent(), config.model, events))
    monkeypatch.setattr("agent.rollouts.open_client", lambda config: FakeClient())
    qa = write_jsonl(tmp_path / "qa.jsonl", [{"id": "q1", "question": "Which city?", "golden_answers": ["x"]}])
    run_rollout_job(RolloutConfig(qa=str(qa), out=str(tmp_path / "t.jsonl"), agent=LLMConfig(model="agent")))
    assert events[-1] == "agent closed" and events.count("agent closed") == 1

    events.clear()
    seen = {}

    def mine(trajectories, client, agent, scorer, *rest):
        seen.update(agent=agent.closed, scorer=scorer.closed)
        raise RuntimeError("mining failed")

    monkeypatch.setattr("agentic_retriever.mining.job.mine", mine)
    monkeypatch.setattr("agentic_retriever.mining.job.open_client", lambda config: FakeClient())
    config = MineJobConfig(trajectories="t.jsonl", out=str(tmp_path / "m"), agent=LLMConfig(model="agent"),
                           scorer=LLMConfig(model="scorer"))
    with pytest.raises(RuntimeError, match="mining failed"):
        run_mine_job(config)
    assert seen == {"agent": False, "scorer": False}  # open while mining
    assert events == ["scorer closed", "agent closed"]  # the last loaded first


class AbortingLLM(ClosableLLM):
    """Aborts the first `aborts` generations of every prompt (an engine preempting them), then answers."""

    name = "aborting"

    def __init__(self, aborts: int):
        self._tokenizer, self.aborts, self.calls = load_smollm2_tokenizer(), aborts, 0

    tokenizer = property(lambda self: self._tokenizer)

    def chat_prompt(self, message):
        return message

    def generate(self, prompts, params):
        self.calls += 1
        if self.calls <= self.aborts:
            return [[Generation("<think> cut sh", [1, 2], "abort")] for _ in prompts]
        text = "<answer> Paris </answer>"
        return [[Generation(text, self._tokenizer.encode(text, add_special_tokens=False), "stop", "</answer>")]
                for _ in prompts]


def test_an_aborted_generation_is_tried_again_then_ends_the_trajectory_as_aborted():
    once = rollout(["Where?"], AbortingLLM(aborts=1), FakeClient(), EnvConfig())
    assert once[0].finish_reason == "answer" and once[0].answer == "Paris" and len(once[0].turns) == 1
    twice = rollout(["Where?"], AbortingLLM(aborts=2), FakeClient(), EnvConfig())
    assert twice[0].finish_reason == "aborted" and twice[0].turns == [] and twice[0].answer is None


def test_a_context_longer_than_the_engines_is_refused_before_the_first_turn(monkeypatch):
    """vLLM refuses a prompt past its max_model_len request by request (found by `make vllm-check`: a GAC
    continuation of 2,247 tokens on a 2,048-token engine stopped mining): the environment refuses the mismatch
    before generating anything."""
    module = types.ModuleType("vllm")

    class Engine:
        def __init__(self, **kwargs):
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(
                max_model_len=kwargs["max_model_len"]))

        def get_tokenizer(self):
            return load_smollm2_tokenizer()

    module.LLM, module.SamplingParams = Engine, dict
    monkeypatch.setitem(sys.modules, "vllm", module)
    llm = load_llm(LLMConfig(backend="vllm", model="m", max_model_len=2048))
    assert llm.max_context == 2048
    with pytest.raises(ValueError, match="env.max_context_tokens=4096 is more than the 2048 tokens m takes"):
        rollout(["Where?"], llm, FakeClient(), EnvConfig(max_context_tokens=4096))


def test_vllms_abort_finish_reason_is_kept():
    completion = types.SimpleNamespace(text="cut", token_ids=[3], finish_reason="abort", stop_reason=None,
                                       logprobs=None)
    assert to_generation(completion, False).finish_reason == "abort"
    assert SamplingParams(seeds=[1]).prompt_seeds(1) == [1]
