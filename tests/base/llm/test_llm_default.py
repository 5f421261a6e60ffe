"""Integration: the embedded SmolLM2-135M-Instruct, converted once from its GGUF, answers a question."""

from __future__ import annotations

import time

import pytest

from agentic_retriever.base.defaults import gguf_tokenizer, resolve_llm_name, smollm2_gguf_path, smollm2_hf_dir
from agentic_retriever.base.llm import LLMConfig, SamplingParams, load_llm


@pytest.mark.slow
def test_the_default_llm_is_converted_once_and_answers_greedily():
    folder = smollm2_hf_dir()  # a fresh cache in tests: this converts
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    started = time.perf_counter()
    assert smollm2_hf_dir() == folder and time.perf_counter() - started < 1.0  # cached
    assert resolve_llm_name("default") == str(folder)
    assert resolve_llm_name("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"

    llm = load_llm(LLMConfig(model="default", device="cpu"))
    prompt = llm.chat_prompt("What is the capital of France?")
    g = llm.generate([prompt], SamplingParams(max_new_tokens=12))[0][0]

    assert "Paris" in g.text
    assert g.finish_reason == "stop" and g.token_ids[-1] == llm.tokenizer.eos_token_id  # ended by EOS


def test_the_gguf_tokenizer_ends_sequences_where_the_model_does():
    """SmolLM2's turns end with <|im_end|> (id 2, the GGUF's eos); transformers 5.9.0 reads <|im_start|> instead."""
    tokenizer = gguf_tokenizer(smollm2_gguf_path())
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.pad_token_id is not None and tokenizer.bos_token == "<|im_start|>"
