"""Utility mining (Agentic-R, agentic_r.txt section 4.1.1): agent trajectories -> retriever training rows.

trajectories -> rounds -> candidates -> sub-answers -> local relevance -> global answer correctness ->
selection -> ``retriever_train.jsonl`` (+ ``mining_stats.json`` / ``.png``). `mine` runs it all, resumably;
each stage is a module usable on its own (prompts, parse, rounds, candidates, sub_answers, scorers, gac,
selection, store, stats). `environment` is the seam to the agent: the only mining module importing `agent`.
"""

from .pipeline import MiningConfig, MiningResult, merge_shards, mine, parse_shard, shard_dir
from .prompts import PROMPT_VERSION
from .rounds import Round, extract_rounds
from .selection import Candidate, SelectionConfig, select_passages

__all__ = ["PROMPT_VERSION", "Candidate", "MiningConfig", "MiningResult", "Round", "SelectionConfig",
           "extract_rounds", "merge_shards", "mine", "parse_shard", "select_passages", "shard_dir"]
