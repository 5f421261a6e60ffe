"""`agentic-retriever agent sft`: synthesise warm-start trajectories, then fine-tune the agent on them.

The result is cached: its folder name is a hash of the examples, the base model and the training
settings, so the demo (and anyone calling `warm_start_agent` again with the same inputs) reuses the
model instead of training it twice. Pass `out` to write it somewhere of your choosing instead.

    from agentic_retriever.client import RetrievalConfig
    path = warm_start_agent(WarmStartConfig(qa="runs/quickstart/data/fanoutqa_leaf_train.jsonl",
                                            retrieval=RetrievalConfig(index="runs/quickstart/index/minilm-flat")))
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from agentic_retriever.client import RetrievalConfig, open_client
from agentic_retriever.defaults import cache_root, resolve_llm_name
from agentic_retriever.llm import LLMConfig

from ..qa_data import read_qa_rows
from .data import SynthesisConfig, synthesize_sft_examples
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
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    agent: LLMConfig = field(default_factory=LLMConfig)
    out: str = field(default="", metadata={"help": "model folder to write (default: the cache, keyed by inputs)"})
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    train: SFTConfig = field(default_factory=SFTConfig)


#: The precision as the previous release spelled it in the cache key (so its warm-started agents are reused).
_KEY_DTYPE = {"auto": "auto", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _cache_key(examples_sha256: str, model_path: str, config: SFTConfig, agent: LLMConfig) -> str:
    settings = json.dumps(dataclasses.asdict(config) | {"model": agent.model, "dtype": _KEY_DTYPE[agent.precision]},
                          sort_keys=True)
    return hashlib.sha256(f"{examples_sha256}|{model_path}|{settings}".encode()).hexdigest()[:16]


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
    if not examples:
        raise ValueError(f"no warm-start trajectory could be built from {config.qa}: no retrieved evidence passage "
                         f"holds its question's answer ({counts})")
    log.info("synthesised %d warm-start trajectories: %s", len(examples), counts)
    examples_sha = data_fingerprint(examples)
    out = Path(config.out) if config.out else \
        cache_root() / "agents" / f"sft-{_cache_key(examples_sha, model_path, config.train, config.agent)}"
    if (out / MANIFEST).is_file():
        log.info("reusing the warm-started agent in %s", out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    write_sft_examples(out.with_name(out.name + ".examples.jsonl"), examples)
    return train_sft(config.train, config.agent, examples, out, extra_manifest={
        "qa": config.qa, "retriever": config.retrieval.index or config.retrieval.url, "synthesis": dataclasses.asdict(config.synthesis),
        "synthesis_counts": counts})
