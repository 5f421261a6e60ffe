"""The one registry of commands: `agentic-retriever GROUP VERB`, the config section named after it, and the
settings class it reads.

The section of ``GROUP VERB`` is ``GROUP_VERB`` (``index build`` reads ``index_build``); ``demo`` reads
``demo`` and ``loop`` reads ``loop``. Classes are named by import path and imported only when asked for, so reading the registry (the
config loader does, to reject unknown sections) stays cheap. The command line (`cli`) adds a handler per
command; `docs/cli.md` lists the same commands and a test keeps them in step.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["COMMANDS", "DEPRECATED_COMMANDS", "DEPRECATED_SECTIONS", "Command", "command", "section_names"]


@dataclass(frozen=True)
class Command:
    group: str
    verb: str
    config: str   # "module:Class" of its settings
    help: str

    @property
    def name(self) -> str:
        """How it is typed: ``index build``, or ``demo``."""
        return f"{self.group} {self.verb}".strip()

    @property
    def section(self) -> str:
        """Its section in a config file: ``index_build``, or ``demo``."""
        return self.name.replace(" ", "_")

    def config_class(self) -> type:
        module, name = self.config.split(":")
        return getattr(importlib.import_module(module), name)


COMMANDS: tuple[Command, ...] = (
    Command("data", "prepare", "agentic_retriever.base.data.prepare:PrepareConfig",
            "write the embedded default corpus and the FanOutQA splits"),
    Command("data", "qa", "agentic_retriever.base.data.qa_set:QASetConfig",
            "one QA set from FlashRAG JSONL, Search-R1 parquet or hub splits, merged, as FlashRAG JSONL"),
    Command("index", "build", "agentic_retriever.index:IndexBuildConfig",
            "build a dense (FAISS) or BM25 index; resumes an interrupted build"),
    Command("index", "search", "agentic_retriever.retrieval:SearchConfig",
            "search an index (or a retrieval service) from the shell"),
    Command("index", "serve", "agentic_retriever.server:ServeConfig",
            "serve an index over HTTP (Search-R1's /retrieve API)"),
    Command("index", "swap", "agentic_retriever.server.config:IndexSwapConfig",
            "make a running service serve another index folder, without a restart (needs its admin token)"),
    Command("eval", "retrieval", "agentic_retriever.eval.retrieval:RetrievalEvalConfig",
            "Recall@k, MRR@k, nDCG@k and answer recall@k of an index on a QA file or a BEIR folder"),
    Command("eval", "agent", "agent.evaluate:AgentEvalConfig",
            "EM, F1, contains-EM, searches and evidence recall of agent trajectories"),
    Command("eval", "suite", "agent.evaluation_suite:SuiteConfig",
            "the agent on the paper's seven QA sets with one retriever: EM, F1 and searches per dataset (Table 1)"),
    Command("agent", "sft", "agent.sft:WarmStartConfig",
            "warm-start the search agent on synthesised search trajectories"),
    Command("agent", "rollout", "agent.rollouts:RolloutConfig",
            "run the agent over a QA file into a trajectory file"),
    Command("agent", "import", "agent.trajectory_import:ImportConfig",
            "trajectories from verl rollout dumps, Search-R1 responses or the Agentic-R release's step 1, as ours"),
    Command("agent", "train", "agent.rl.config:RLConfig",
            "RL of the agent (PPO or GRPO/DAPO) against a fixed retriever"),
    Command("mine", "run", "agentic_retriever.mining.job:MineJobConfig",
            "utility mining: agent trajectories -> retriever training rows"),
    Command("mine", "merge", "agentic_retriever.mining.job:MineMergeConfig",
            "join the outputs of mining shards"),
    Command("mine", "audit", "agentic_retriever.eval.mining_audit:MineAuditConfig",
            "where the evidence went in a mining run (reads evidence labels): audit.{json,md,png}"),
    Command("retriever", "init", "agentic_retriever.base.decoder_embedder:DecoderEmbedderConfig",
            "a causal LM -> a decoder embedder folder (last-token pooling, end token appended, instruction prompt)"),
    Command("retriever", "train", "agentic_retriever.training.config:RetrieverTrainConfig",
            "contrastive training on mined rows -> a drop-in sentence-transformers folder"),
    Command("retriever", "export", "agentic_retriever.training.export:RetrieverExportConfig",
            "a training checkpoint -> the drop-in encoder folder"),
    Command("", "demo", "agentic_retriever.app.demo:DemoConfig",
            "the main job on the embedded default stack (make demo)"),
    Command("", "loop", "agentic_retriever.app.loop.config:LoopConfig",
            "the agent <-> retriever co-training loop (Algorithm 1), resumable; `loop status DIR` shows its record"),
)

#: Spellings of the previous release (argv prefix) -> the command that replaces them.
DEPRECATED_COMMANDS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("data", "prepare-defaults"): ("data", "prepare"),
    ("search",): ("index", "search"),
    ("serve",): ("index", "serve"),
    ("agent", "eval"): ("eval", "agent"),
    ("mine-merge",): ("mine", "merge"),
    ("mine",): ("mine", "run"),   # `mine --trajectories ...`: only when no verb follows
}

#: Section names of the previous release -> the section that replaces them.
DEPRECATED_SECTIONS: dict[str, str] = {
    "prepare": "data_prepare", "index": "index_build", "search": "index_search", "serve": "index_serve",
    "agent_eval": "eval_agent", "mine": "mine_run", "train_retriever": "retriever_train",
    "demo_rollout": "agent_rollout",
}


def section_names() -> list[str]:
    return [c.section for c in COMMANDS]


def command(section: str) -> Command:
    for c in COMMANDS:
        if c.section == section:
            return c
    raise KeyError(f"no command reads section '{section}' (valid: {', '.join(section_names())})")
