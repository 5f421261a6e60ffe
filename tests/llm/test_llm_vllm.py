"""The vLLM backend without vLLM: the missing-extra error, the parameter mapping, and the output mapping."""

from __future__ import annotations

import sys
import types

import pytest

from agentic_retriever.llm import LLMConfig, SamplingParams, load_llm
from agentic_retriever.llm.vllm import VLLMLLM, sampling_kwargs


def test_a_missing_vllm_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    with pytest.raises(ImportError, match=r"pip install 'agentic-retriever\[vllm\]'"):
        load_llm(LLMConfig(backend="vllm"))


def test_sampling_params_map_to_vllm_with_the_stop_string_kept():
    params = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, stop=["</search>", "</answer>"], n=4,
                            seed=11, logprobs=True)
    assert sampling_kwargs(params) == {"n": 4, "max_tokens": 64, "temperature": 0.7, "top_p": 0.9,
                                       "stop": ["</search>", "</answer>"], "include_stop_str_in_output": True,
                                       "seed": 11, "logprobs": 0, "skip_special_tokens": True}
    greedy = sampling_kwargs(SamplingParams())
    assert (greedy["temperature"], greedy["logprobs"], greedy["seed"], greedy["stop"]) == (0.0, None, None, [])


def fake_vllm(record: dict) -> types.ModuleType:
    """A stand-in `vllm` module: records the engine and sampling arguments, answers two samples."""
    module = types.ModuleType("vllm")

    class SamplingParamsStub:
        def __init__(self, **kwargs):
            record["sampling"] = kwargs

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
    llm = load_llm(LLMConfig(backend="vllm", model="Qwen/Qwen2.5-7B-Instruct", max_model_len=8192))
    assert isinstance(llm, VLLMLLM)
    assert record["engine"]["enable_prefix_caching"] is True and record["engine"]["max_model_len"] == 8192
    assert record["engine"]["model"] == "Qwen/Qwen2.5-7B-Instruct"

    outputs = llm.generate(["text prompt", [1, 2, 3]], SamplingParams(n=2, stop=["</search>"], logprobs=True))

    assert record["prompts"] == ["text prompt", {"prompt_token_ids": [1, 2, 3]}]
    assert record["sampling"]["include_stop_str_in_output"] is True and record["sampling"]["n"] == 2
    stopped, ran_out = outputs[1]
    assert (stopped.text, stopped.token_ids, stopped.finish_reason, stopped.stop_string, stopped.logprobs) == (
        "go <search>x</search>", [5, 6, 7], "stop", "</search>", [-1.0, -2.0, -3.0])
    assert (ran_out.finish_reason, ran_out.stop_string, ran_out.logprobs) == ("length", None, [-0.5, -0.25])
