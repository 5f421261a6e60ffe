"""`agentic-retriever agent sft`: synthesise warm-start trajectories, then fine-tune the agent on them.

The result is cached: its folder name is a hash of the examples, the base model and the training
settings, so the demo (and anyone calling `warm_start_agent` again with the same inputs) reuses the
model instead of training it twice. Pass `out` to write it somewhere of your choosing instead.

    path = warm_start_agent(WarmStartConfig(qa="runs/quickstart/data/fanoutqa_leaf_train.jsonl",
                                            index="runs/quickstart/index/minilm-flat"))
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from agentic_retriever.client import HttpRetrievalClient, LocalRetrievalClient, RetrievalClient
from agentic_retriever.defaults import cache_root, resolve_llm_name

from .qa_data import read_qa_rows
from .sft import SFTConfig, data_fingerprint, train_sft, write_sft_examples
from .sft_data import SynthesisConfig, synthesize_sft_examples

__all__ = ["WarmStartConfig", "open_retrieval_client", "warm_start_agent"]

log = logging.getLogger(__name__)

MANIFEST = "sft_manifest.json"


@dataclass
class WarmStartConfig:
    """Settings of `agentic-retriever agent sft` (the `agent_sft` section of a config file)."""

    qa: str = field(default="", metadata={"help": "leaf QA rows with supporting_titles (the train split)"})
    exclude_qa: str = field(default="", metadata={
        "help": "QA rows held out of the warm start (by id), e.g. the questions mining will use"})
    index: str = field(default="", metadata={"help": "index folder searched in process"})
    url: str = field(default="", metadata={"help": "or a retrieval service URL"})
    out: str = field(default="", metadata={"help": "model folder to write (default: the cache, keyed by inputs)"})
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    train: SFTConfig = field(default_factory=SFTConfig)


def open_retrieval_client(index: str, url: str) -> RetrievalClient:
    """An in-process client over `index`, or an HTTP client of the service at `url` (exactly one of them)."""
    if bool(index) == bool(url):
        raise ValueError("give exactly one of --index DIR or --url URL")
    if url:
        return HttpRetrievalClient(url)
    from agentic_retriever.index import open_index

    return LocalRetrievalClient(open_index(index))


def _cache_key(examples_sha256: str, model_path: str, config: SFTConfig) -> str:
    settings = json.dumps(dataclasses.asdict(config), sort_keys=True)
    return hashlib.sha256(f"{examples_sha256}|{model_path}|{settings}".encode()).hexdigest()[:16]


def warm_start_agent(config: WarmStartConfig) -> Path:
    """Build (or reuse) the warm-started agent; returns its HF model folder."""
    from transformers import AutoTokenizer

    if not config.qa:
        raise ValueError("agent sft needs leaf QA rows (--qa FILE)")
    model_path = resolve_llm_name(config.train.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    client = open_retrieval_client(config.index, config.url)
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
        cache_root() / "agents" / f"sft-{_cache_key(examples_sha, model_path, config.train)}"
    if (out / MANIFEST).is_file():
        log.info("reusing the warm-started agent in %s", out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    write_sft_examples(out.with_name(out.name + ".examples.jsonl"), examples)
    return train_sft(config.train, examples, out, extra_manifest={
        "qa": config.qa, "retriever": config.index or config.url, "synthesis": dataclasses.asdict(config.synthesis),
        "synthesis_counts": counts})
