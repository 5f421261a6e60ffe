"""`agentic-retriever agent sft`: synthesise warm-start trajectories, then fine-tune the agent on them.

The result is cached under ``cache_root()/agents/sft-<key>``, the key a hash of contents, not of paths: the
examples, the base model's fingerprint (a hash of its config and weights, `agentic_retriever.base.fingerprint`) and the
training settings. So the demo (and anyone calling `warm_start_agent` again with the same inputs) reuses the
model instead of training it twice, also after the cache root moved, and a base model retrained in place is
trained on again. A folder cached by the previous release (keyed by the base model's path) is adopted when
found: renamed to its new key. Pass `out` to write it somewhere of your choosing instead.

    from agentic_retriever.base.client import RetrievalConfig
    path = warm_start_agent(WarmStartConfig(qa="runs/quickstart/data/fanoutqa_leaf_train_warmstart.jsonl",
                                            retrieval=RetrievalConfig(index="runs/quickstart/index/minilm-flat")))
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from agentic_retriever.base.client import RetrievalConfig
from agentic_retriever.base.defaults import cache_root, resolve_llm_name
from agentic_retriever.base.fingerprint import model_fingerprint, stable_hash
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.precision import TORCH_NAMES
from agentic_retriever.base.qa_sources import read_qa_rows
from agentic_retriever.retrieval import open_client

from .data import SynthesisConfig, synthesize_sft_examples
from .multihop import read_multihop_rows, synthesize_multihop_examples
from .train import SFTConfig, data_fingerprint, train_sft, write_sft_examples

__all__ = ["WarmStartConfig", "warm_start_agent"]

log = logging.getLogger(__name__)

MANIFEST = "sft_manifest.json"


@dataclass
class WarmStartConfig:
    """Settings of `agentic-retriever agent sft` (the `agent_sft` section of a config file)."""

    RENAMED: ClassVar[dict[str, str]] = {"index": "retrieval.index", "url": "retrieval.url",
                                         "train.model": "agent.model", "train.dtype": "agent.precision"}

    qa: str = field(default="", metadata={"help": "leaf QA rows with supporting_titles (the train split)",
                                          "required": True})
    exclude_qa: str = field(default="", metadata={
        "help": "QA rows held out of the warm start (by id), e.g. the questions mining will use"})
    multihop_qa: str = field(default="", metadata={
        "help": "multi-hop questions (with leaf_ids, e.g. fanoutqa_multihop_train_warmstart.jsonl) to add multi-search "
                "trajectories from, their leaves read from qa (agent.sft.multihop); empty: leaf questions only"})
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    agent: LLMConfig = field(default_factory=LLMConfig)
    out: str = field(default="", metadata={"help": "model folder to write (default: the cache, keyed by inputs)"})
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    train: SFTConfig = field(default_factory=SFTConfig)


#: Bumped when what the cache key hashes changes.
_KEY_VERSION = 3
#: Training settings that do not change the trained weights (where logs go, how often): not in the key.
_NOT_IN_KEY = ("report_to", "logging_steps", "save_steps")
#: Settings that change how the weights are computed, not what they are (gradient checkpointing recomputes the same
#: activations in the backward pass): hashed at their defaults, so a warm start made either way is found either way.
_AS_DEFAULT_IN_KEY = ("gradient_checkpointing",)


def _key_dtype(precision: str) -> str:
    """The precision as the cache key has spelled it since before `Precision`'s names (torch's dtype names)."""
    return TORCH_NAMES.get(precision, precision)


def _key_settings(config: SFTConfig, agent: LLMConfig) -> dict:
    """The settings that change the trained weights, and the precision."""
    defaults = dataclasses.asdict(SFTConfig())
    settings = {k: defaults[k] if k in _AS_DEFAULT_IN_KEY else v for k, v in dataclasses.asdict(config).items()
                if k not in _NOT_IN_KEY}
    return settings | {"dtype": _key_dtype(agent.precision)}


def _cache_key(examples_sha256: str, base_fingerprint: str, config: SFTConfig, agent: LLMConfig) -> str:
    """The cache folder's key: contents only (the examples, the base model's fingerprint, the settings that change
    the weights, the precision), by the project's one content hash."""
    return stable_hash([_KEY_VERSION, examples_sha256, base_fingerprint, _key_settings(config, agent)], 16, "sha256")


def _previous_cache_key(examples_sha256: str, base_fingerprint: str, config: SFTConfig, agent: LLMConfig) -> str:
    """The key the previous release named the same warm start by (version 2: the same contents, hashed from a text
    of its own), so that its cache is adopted, not trained again."""
    text = json.dumps(_key_settings(config, agent), sort_keys=True)
    return hashlib.sha256(f"v2|{examples_sha256}|{base_fingerprint}|{text}".encode()).hexdigest()[:16]


def _adopt_previous(previous: Path, out: Path) -> bool:
    """Rename a previous release's cache folder (and its examples file) to the new key; leave a link at the old
    name for whatever still refers to it. False when there is none (or another process took it first)."""
    if previous.is_symlink() or not (previous / MANIFEST).is_file():
        return False
    try:
        os.rename(previous, out)
    except OSError:
        return (out / MANIFEST).is_file()  # a concurrent run adopted it
    examples = previous.with_name(previous.name + ".examples.jsonl")
    if examples.is_file():
        os.replace(examples, out.with_name(out.name + ".examples.jsonl"))
    try:
        previous.symlink_to(out.name)
    except OSError:
        pass
    log.info("adopted the warm-started agent cached by the previous release: %s is now %s", previous, out)
    return True


def warm_start_agent(config: WarmStartConfig) -> Path:
    """Build (or reuse) the warm-started agent; returns its HF model folder."""
    from transformers import AutoTokenizer

    if not config.qa:
        raise ValueError("agent sft needs leaf QA rows (--qa FILE)")
    model_path = resolve_llm_name(config.agent.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    client = open_client(config.retrieval)
    rows = read_qa_rows(config.qa)
    if config.exclude_qa:
        held_out = {row.id for row in read_qa_rows(config.exclude_qa)}
        rows = [row for row in rows if row.id not in held_out]
        log.info("warm start on %d questions (%d held out by %s)", len(rows), len(held_out), config.exclude_qa)
    examples, counts = synthesize_sft_examples(rows, client, tokenizer, config.synthesis)
    if config.multihop_qa:
        multihop, multihop_counts = synthesize_multihop_examples(
            read_multihop_rows(config.multihop_qa, config.qa), client, tokenizer, config.synthesis)
        examples += multihop
        counts |= {f"multihop_{k}": v for k, v in multihop_counts.items()} | {"examples": len(examples)}
    if not examples:
        raise ValueError(f"no warm-start trajectory could be built from {config.qa}: no retrieved evidence passage "
                         f"holds its question's answer ({counts})")
    log.info("synthesised %d warm-start trajectories: %s", len(examples), counts)
    examples_sha = data_fingerprint(examples)
    base = model_fingerprint(model_path)
    if config.out:
        out = Path(config.out)
    else:
        agents = cache_root() / "agents"
        out = agents / f"sft-{_cache_key(examples_sha, base, config.train, config.agent)}"
        previous = agents / f"sft-{_previous_cache_key(examples_sha, base, config.train, config.agent)}"
        if not (out / MANIFEST).is_file() and _adopt_previous(previous, out):
            return out
    if (out / MANIFEST).is_file():
        log.info("reusing the warm-started agent in %s", out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    write_sft_examples(out.with_name(out.name + ".examples.jsonl"), examples)
    return train_sft(config.train, config.agent, examples, out, extra_manifest={
        "qa": config.qa, "multihop_qa": config.multihop_qa,
        "retriever": config.retrieval.index or config.retrieval.url, "synthesis": dataclasses.asdict(config.synthesis),
        "synthesis_counts": counts, "base_model_fingerprint": base})
