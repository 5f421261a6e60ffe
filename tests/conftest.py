"""Shared fixtures: tiny corpora and a tiny random-weight BERT encoder, all made in the test session (the corpora's
rows and other shared fakes: `tests/fakes.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakes import load_smollm2_tokenizer, smollm2_tokenizer_dir, synthetic_rows, write_jsonl


#: The cache the project writes to outside the tests (`agentic_retriever.base.defaults.cache_root`), as the user has it.
USER_CACHE = Path(os.environ.get("AGENTIC_RETRIEVER_CACHE") or Path.home() / ".cache" / "agentic_retriever")
#: The `datasets` library's cache (hub QA sets, and the parquet files verl's dataset loads), as the user has it.
USER_DATASETS_CACHE = Path(os.environ.get("HF_DATASETS_CACHE")
                           or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "datasets")


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and modification time (empty when `root` does not exist)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Every cache the suite writes goes under the session's temporary folder: set for the whole session, before
    any session-, package- or module-scoped fixture runs. At the end the user's cache must be as it was found."""
    import datasets.config  # read its cache folder at import: the environment alone comes too late

    caches = (USER_CACHE, USER_DATASETS_CACHE)
    before = [_snapshot(root) for root in caches]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENTIC_RETRIEVER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        test_datasets_cache = tmp_path_factory.getbasetemp() / "hf_datasets"
        patch.setenv("HF_DATASETS_CACHE", str(test_datasets_cache))  # processes the tests start (verl's workers)
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", test_datasets_cache)
        yield
    for root, earlier in zip(caches, before):
        after = _snapshot(root)
        if after != earlier:
            changed = sorted(set(after.items()) ^ set(earlier.items()))
            pytest.fail(f"the test suite changed the user's cache {root}: {len(changed)} files, e.g. "
                        f"{[name for name, _ in changed[:5]]}; a fixture wrote there instead of the test cache")


@pytest.fixture(scope="session", autouse=True)
def _hub_offline():
    """The suite never reaches the Hugging Face hub (tests run without network): the hub's offline mode, in this
    process and in those the tests start, so that a hub name nothing has cached fails at once, as it does for a user
    with ``HF_HUB_OFFLINE=1``, instead of retrying its requests for 23 s."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import: the environment comes late
        yield


#: Signals whose handling a test may change only for its own duration: children inherit an ignored one (the session
#: guard hands a command the disposition it found), so one left ignored changes what later tests of the worker see.
_PROCESS_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@pytest.fixture(autouse=True)
def _signal_handling_restored():
    """Each test leaves SIGINT, SIGTERM and SIGHUP handled as it found them (restored, and the test failed, if not)."""
    import signal

    before = {name: signal.getsignal(getattr(signal, name)) for name in _PROCESS_SIGNALS}
    yield
    changed = {name: (handler, signal.getsignal(getattr(signal, name))) for name, handler in before.items()
               if signal.getsignal(getattr(signal, name)) != handler}
    for name, (handler, _) in changed.items():
        signal.signal(getattr(signal, name), handler)
    if changed:
        pytest.fail("the test left signal handling changed (restored now): "
                    + ", ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in changed.items()))


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(300))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A 2-layer, 32-d BERT with random weights and MiniLM's tokenizer: fast mechanics tests."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from agentic_retriever.base.defaults import minilm_model_dir

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
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = load_smollm2_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_decoder_embedder_dir(tmp_path_factory) -> str:
    """A decoder embedder of Qwen3-Embedding's architecture at toy size (2 layers, 32-d, random weights, seeded)
    with SmolLM2's tokenizer, written as `retriever init` writes one: last-token pooling over the appended end token,
    left padding, Qwen3-Embedding's query instruction (`agentic_retriever.standins.decoder_embedder`)."""
    from agentic_retriever.standins.decoder_embedder import random_decoder_embedder

    out = tmp_path_factory.mktemp("tiny-qwen3") / "embedder"
    return str(random_decoder_embedder(out, smollm2_tokenizer_dir(), "tiny", max_length=64))
