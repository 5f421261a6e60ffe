"""The vLLM backend without vLLM: the missing-extra error, the parameter mapping, and the output mapping."""

from __future__ import annotations

import sys
import types

import pytest

from agentic_retriever.base.llm import LLMConfig, SamplingParams, load_llm
from agentic_retriever.base.llm.vllm import VLLMLLM, sampling_kwargs


def test_a_missing_vllm_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    with pytest.raises(ImportError, match=r"pip install 'agentic-retriever\[vllm\]'"):
        load_llm(LLMConfig(backend="vllm"))


def test_sampling_params_map_to_vllm_with_the_stop_string_kept():
    params = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, stop=["</search>", "</answer>"], n=4,
                            seed=11, logprobs=True)
    assert sampling_kwargs(params, seed=11) == {
        "n": 4, "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
        "stop": ["</search>", "</answer>"], "include_stop_str_in_output": True, "seed": 11, "logprobs": 0,
        "skip_special_tokens": True}
    greedy = sampling_kwargs(SamplingParams())
    assert (greedy["temperature"], greedy["logprobs"], greedy["seed"], greedy["stop"]) == (0.0, None, None, [])
    assert sampling_kwargs(SamplingParams(top_k=20, min_p=0.05))["top_k"] == 20


def fake_vllm(record: dict) -> types.ModuleType:
    """A stand-in `vllm` module: records the engine and sampling arguments, answers two samples."""
    module = types.ModuleType("vllm")

    class SamplingParamsStub:
        def __init__(self, **kwargs):
            record.setdefault("sampling", []).append(kwargs)

    class Engine:
        def __init__(self, **kwargs):
            record["engine"] = kwargs

        def generate(self, prompts, sampling, use_tqdm):
            record["prompts"] = prompts
            stop = types.SimpleNamespace(text="go <search>x</search>", token_ids=(5, 6, 7), finish_reason="stop",
                                         stop_reason="</search>",
                                         logprobs=[{5: types.SimpleNamespace(logprob=-1.0)},
                                                   {6: types.SimpleNamespace(logprob=-2.0)},
                                                   {7: types.SimpleNamespace(logprob=-3.0)}])
            length = types.SimpleNamespace(text="go on", token_ids=[8, 9], finish_reason="length", stop_reason=None,
                                           logprobs=[{8: types.SimpleNamespace(logprob=-0.5)},
                                                     {9: types.SimpleNamespace(logprob=-0.25)}])
            return [types.SimpleNamespace(outputs=[stop, length]) for _ in prompts]

    module.SamplingParams, module.LLM = SamplingParamsStub, Engine
    return module


def test_the_engine_gets_prefix_caching_and_outputs_become_generations(monkeypatch):
    record: dict = {}
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(record))
    llm = load_llm(LLMConfig(backend="vllm", model="Qwen/Qwen2.5-7B-Instruct", max_model_len=8192,
                             engine_args={"enable_chunked_prefill": False}))
    assert isinstance(llm, VLLMLLM)
    assert record["engine"]["enable_prefix_caching"] is True and record["engine"]["max_model_len"] == 8192
    assert record["engine"]["model"] == "Qwen/Qwen2.5-7B-Instruct" and record["engine"]["enable_chunked_prefill"] is False

    outputs = llm.generate(["text prompt", [1, 2, 3]], SamplingParams(n=2, stop=["</search>"], logprobs=True))

    assert record["prompts"] == ["text prompt", {"prompt_token_ids": [1, 2, 3]}]
    assert len(record["sampling"]) == 2  # one per prompt, as vLLM takes a list
    assert record["sampling"][0]["include_stop_str_in_output"] is True and record["sampling"][0]["n"] == 2
    stopped, ran_out = outputs[1]
    assert (stopped.text, stopped.token_ids, stopped.finish_reason, stopped.stop_string, stopped.logprobs) == (
        "go <search>x</search>", [5, 6, 7], "stop", "</search>", [-1.0, -2.0, -3.0])
    assert (ran_out.finish_reason, ran_out.stop_string, ran_out.logprobs) == ("length", None, [-0.5, -0.25])


def seeded_vllm() -> types.ModuleType:
    """A stand-in `vllm` that samples as vLLM does: each request from its own generator, seeded by its
    ``SamplingParams.seed`` (unseeded: fresh randomness), so two requests with one seed and one prompt agree."""
    import random

    from tests.fakes import load_smollm2_tokenizer

    module = types.ModuleType("vllm")
    tokenizer = load_smollm2_tokenizer()

    class Engine:
        def __init__(self, **kwargs):
            pass

        def get_tokenizer(self):
            return tokenizer

        def generate(self, prompts, sampling, use_tqdm):
            outputs = []
            sampling = sampling if isinstance(sampling, list) else [sampling] * len(prompts)  # as vLLM takes either
            for prompt, params in zip(prompts, sampling):
                rng = random.Random(f"{prompt}|{params.seed}") if params.seed is not None else random.Random()
                text = f"<answer> {rng.randint(0, 10 ** 9)} </answer>"
                ids = tokenizer.encode(text, add_special_tokens=False)
                outputs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(
                    text=text, token_ids=ids, finish_reason="stop", stop_reason="</answer>", logprobs=None)]))
            return outputs

    module.SamplingParams, module.LLM = types.SimpleNamespace, Engine
    return module


def test_samples_of_one_question_differ_on_vllm_and_draw_the_same_in_any_batch(monkeypatch, tmp_path):
    """`agent rollout --samples 4` on an engine that seeds every request alone: four different trajectories (one
    seed for the whole step gave four copies), and a trajectory's draw does not depend on its batch."""
    from agent.env import EnvConfig
    from agent.rollouts import run_rollouts
    from agent.trajectory import read_trajectories
    from tests.fakes import FakeClient

    monkeypatch.setitem(sys.modules, "vllm", seeded_vllm())
    llm = load_llm(LLMConfig(backend="vllm", model="fake"))
    rows = [{"id": "q1", "question": "Who?", "golden_answers": ["x"]},
            {"id": "q2", "question": "Where?", "golden_answers": ["y"]}]
    env = EnvConfig(temperature=1.0, max_turns=1)
    run_rollouts(rows, llm, FakeClient(), env, tmp_path / "all.jsonl", batch_size=8, samples=4)
    answers = {(t.question_id, t.sample): t.answer for t in read_trajectories(tmp_path / "all.jsonl")}
    assert len({answers["q1", s] for s in range(4)}) == 4 and len(set(answers.values())) == 8

    run_rollouts(rows, llm, FakeClient(), env, tmp_path / "small.jsonl", batch_size=3, samples=4)
    assert {(t.question_id, t.sample): t.answer for t in read_trajectories(tmp_path / "small.jsonl")} == answers
