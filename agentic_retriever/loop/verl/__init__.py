"""The co-training loop's agent step on verl: write the run, launch it (or let the user), pick up its checkpoint.

Algorithm 1 of "Agentic-R: Learning to Retrieve for Agentic Search" (arXiv 2601.11888) trains Agent_i with PPO
against the retriever of the iteration. With ``agent_trainer: verl`` that step runs on verl ("HybridFlow: A
Flexible and Efficient RLHF Framework", arXiv 2409.19256; written against verl 0.9.1) instead of the embedded
trainer (`agent.rl`): `prepare_verl_run` writes everything verl needs into one folder, `start_verl_run` starts it
(``VerlSettings.launch``) and `wait_for_checkpoint` returns the trained policy as a Hugging Face model folder.

The agent is Search-R1's ("Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement
Learning", arXiv 2503.09516) on verl's multi-turn tool agent loop (``tool_agent``, hermes tool calls). Modules:

* `settings`: `VerlSettings` (the loop config's ``verl`` section) and `VerlRun` (what a prepared run is);
* `overrides`: our `RLConfig` and the settings on verl's Hydra names (`verl_overrides`), the reward file, and
  the RLConfig fields verl has no counterpart for;
* `run_folder`: the files of one run (`prepare_verl_run`: parquet data, tool config, overrides, launch script);
* `search_tool`: `SearchTool`, the native verl tool that searches our retrieval service, and its config;
* `checkpoint`: starting a run (`start_verl_run`) and picking up its final checkpoint (`wait_for_checkpoint`).

**Known mismatch**: verl's tool loop parses hermes ``<tool_call>{"name": "search", "arguments": {"query_list":
[...]}}</tool_call>`` and renders the tool's answer with the chat template's tool role, while our Search-R1
prompt asks for ``<search> query </search>``. The chat template (e.g. Qwen2.5's) adds the tool-call instructions
from the tool schema; a policy that keeps writing ``<search>`` tags gets no retrieval on verl. The Search-R1
rewards that check the tag sequence (``search_r1_format``, ``search_r1_retrieval``) read ``<information>`` blocks,
which the tool's text keeps, but not ``<search>`` tags; ``search_r1_em`` scores the last ``<answer>`` only.
"""

from .checkpoint import finished_checkpoint, start_verl_run, wait_for_checkpoint
from .overrides import REWARD_FILE, verl_overrides
from .run_folder import prepare_verl_run, write_verl_parquet
from .search_tool import SearchTool, search_tool_config
from .settings import VerlRun, VerlSettings

__all__ = ["REWARD_FILE", "SearchTool", "VerlRun", "VerlSettings", "finished_checkpoint", "prepare_verl_run",
           "search_tool_config", "start_verl_run", "verl_overrides", "write_verl_parquet", "wait_for_checkpoint"]
