"""Shared fixtures: tiny corpora and a tiny random-weight BERT encoder, all made in the test session (the corpora's
rows and other shared fakes: `tests/fakes.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import synthetic_rows, write_jsonl


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("AGENTIC_RETRIEVER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(300))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A 2-layer, 32-d BERT with random weights and MiniLM's tokenizer: fast mechanics tests."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from agentic_retriever.defaults import minilm_model_dir

    out = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_model_dir()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_causal_lm_dir(tmp_path_factory) -> str:
    """A 2-layer, 64-d Llama with random weights (seeded; untied embeddings, so its greedy output varies)
    and SmolLM2's tokenizer with its chat template: fast generation mechanics tests."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from agentic_retriever.defaults import smollm2_gguf_path

    out = tmp_path_factory.mktemp("tiny-llama")
    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)
