"""Supervised warm start of the search agent (`agentic-retriever agent sft`; docs/agent.md, "Supervised
warm start").

* `agent.sft.data`: synthesis of warm-start trajectories from decomposed QA and real retrieval;
* `agent.sft.train`: the examples, their tokenisation with the loss mask, and the fine-tuning;
* `agent.sft.warm_start`: the command: synthesise, fine-tune, cache the result by its inputs.

    from agent.sft import WarmStartConfig, warm_start_agent
    from agentic_retriever.base.client import RetrievalConfig
    path = warm_start_agent(WarmStartConfig(qa="runs/quickstart/data/fanoutqa_leaf_train_warmstart.jsonl",
                                            retrieval=RetrievalConfig(index="runs/quickstart/index/minilm-flat")))
"""

from .data import SynthesisConfig, query_phrasings, synthesize_sft_examples
from .train import (IGNORE_INDEX, SFTConfig, SFTExample, data_fingerprint, read_sft_examples, tokenize_example,
                    train_sft, write_sft_examples)
from .warm_start import WarmStartConfig, warm_start_agent

__all__ = ["IGNORE_INDEX", "SFTConfig", "SFTExample", "SynthesisConfig", "WarmStartConfig", "data_fingerprint",
           "query_phrasings", "read_sft_examples", "synthesize_sft_examples", "tokenize_example", "train_sft",
           "warm_start_agent", "write_sft_examples"]
