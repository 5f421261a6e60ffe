"""Utility mining ("Agentic-R: Learning to Retrieve for Agentic Search", section 4.1.1; docs/mining.md): agent
trajectories -> retriever training rows.

trajectories -> rounds -> candidates -> sub-answers -> local relevance -> global answer correctness ->
selection -> ``retriever_train.jsonl`` (+ ``rounds.jsonl``, ``mining_stats.json`` / ``.png``). `mine`
(`pipeline`) runs it all, resumably, under a `MiningConfig` (`config`); `outputs` writes the results and
`shards` splits a run and merges the shards. Each stage is a module usable on its own (prompts, parse, rounds,
candidates, sub_answers, local_relevance, gac, selection, store, stats, usage). The audit
(`agentic_retriever.eval.mining_audit`, evaluation side)
joins a run with evidence labels; `job` is the CLI's entry point. `environment` is the seam to the agent: the
only mining module importing `agent`.
"""

from .config import MiningConfig
from .outputs import MiningResult
from .pipeline import mine
from .shards import merge_shards, parse_shard, shard_dir
from .prompts import PROMPT_VERSION
from .rounds import Round, extract_rounds
from .selection import Candidate, SelectionConfig, select_passages

__all__ = ["PROMPT_VERSION", "Candidate", "MiningConfig", "MiningResult", "Round", "SelectionConfig",
           "extract_rounds", "merge_shards", "mine", "parse_shard", "select_passages", "shard_dir"]
