"""Integration: the embedded SmolLM2-135M-Instruct, converted once from its GGUF, answers a question."""

from __future__ import annotations

import time

import pytest

from agentic_retriever.base.defaults import gguf_tokenizer, resolve_llm_name, smollm2_gguf_path, smollm2_hf_dir
from agentic_retriever.base.llm import LLMConfig, SamplingParams, load_llm
from tests.fakes import load_smollm2_tokenizer, smollm2_tokenizer_dir


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


def test_the_gguf_tokenizer_ends_sequences_where_the_model_does_and_the_tests_saved_copy_is_the_same():
    """SmolLM2's turns end with <|im_end|> (id 2, the GGUF's eos); transformers 5.9.0 reads <|im_start|> instead.
    The tests read the tokenizer from a folder saved once (`tests.fakes.smollm2_tokenizer_dir`), not from the GGUF
    each time: the same vocabulary, special tokens, chat template and token ids."""
    converted, saved = gguf_tokenizer(smollm2_gguf_path()), load_smollm2_tokenizer()
    assert saved is not converted and smollm2_tokenizer_dir().is_dir() and converted.pad_token_id is not None
    assert saved.get_vocab() == converted.get_vocab()
    assert [(t.eos_token, t.eos_token_id, t.pad_token_id, t.bos_token) for t in (saved, converted)] == \
        [("<|im_end|>", 2, converted.pad_token_id, "<|im_start|>")] * 2
    turn = [{"role": "user", "content": "Who wrote Hamlet, and when? <search> Hamlet </search>"}]
    assert saved.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) == \
        converted.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    text = saved.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) + "Shakespeare, ca. 1600."
    assert saved.encode(text) == converted.encode(text)
