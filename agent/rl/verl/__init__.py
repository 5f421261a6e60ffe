"""The agent's second RL trainer, verl: write the run, launch it (or let the user), pick up its checkpoint.

Algorithm 1 of "Agentic-R: Learning to Retrieve for Agentic Search" (arXiv 2601.11888) trains Agent_i with PPO
against the retriever of the iteration. With ``agent_trainer: verl`` that step runs on verl ("HybridFlow: A
Flexible and Efficient RLHF Framework", arXiv 2409.19256; written against verl 0.9.1) instead of the embedded
trainer (`agent.rl`). `run_verl_job` does it all in one call, as `agent.rl.run_rl_job` does for the embedded
trainer, and the co-training loop calls it; under it, `prepare_verl_run` writes everything verl needs into one folder, `start_verl_run` starts it
(``VerlSettings.launch``) and `wait_for_checkpoint` returns the trained policy as a Hugging Face model folder.

The agent is ours: verl runs `agent_loop.DialectAgentLoop` (registered as ``agentic_retriever_agent``), which
drives the environment of our own rollouts (`agent.env.Environment`) in the dialect of ``agent_train.env`` (Search-R1's
``<search> q </search>`` by default, "Search-R1: Training LLMs to Reason and Leverage Search Engines with
Reinforcement Learning", arXiv 2503.09516), calls our retrieval service with the question, and keeps the paper's
budgets per turn and in all. So the agent verl trains writes what the loop's rollouts and mining read. For
tool-calling models, ``agent_loop: tool_agent`` runs verl's hermes tool loop with `SearchTool` instead. Modules:

* `job`: `run_verl_job`, the one entry point;
* `settings`: `VerlSettings` (the loop config's ``verl`` section) and `VerlRun` (what a prepared run is);
* `reward`: our registered rewards as verl's ``compute_score`` (the file verl loads by path);
* `overrides`: our `RLConfig` and the settings on verl's Hydra names (`verl_overrides`; verl's V1 trainer pinned,
  global micro-batches per GPU with `per_gpu_micro_batches`, ``trainer.total_epochs`` from `epochs_for_steps`), the
  reward file, and the RLConfig fields verl has no counterpart for;
* `run_folder`: the files of one run (`prepare_verl_run`: parquet data with a held-out validation slice of the
  training questions, the agent-loop or tool config, overrides, launch script);
* `agent_loop`: `DialectAgentLoop`, verl's ``AgentLoopBase`` over our environment, and `SearchToolAgentLoop`, verl's
  tool loop failing a trajectory whose search failed (imports verl: not imported here);
* `search_tool`: `SearchTool`, the native verl tool of the ``tool_agent`` loop, and its config;
* `checkpoint`: starting a run (`start_verl_run`), picking up its final checkpoint (`wait_for_checkpoint`) and
  stopping every process of it (`agentic_retriever.base.sessions.stop_session`);
* `cpu`, `cpu_platform`: verl on CPUs (``device: cpu``): the environment and overrides a CPU run's ``launch.sh``
  carries, and the ``cpu`` platform plugin verl loads through them (imports verl: not imported here);
* `leftovers`: the shared-memory segments a run leaves, removed by its ``launch.sh`` on exit;
* `disk`: the disk a run's checkpoints take, printed before launch;
* `console`: verl's console metrics read back from a run's log (the step's reward curve in the loop's report).
"""

from .checkpoint import finished_checkpoint, start_verl_run, wait_for_checkpoint
from .job import run_verl_job
from .overrides import (AGENT_LOOP_NAME, REWARD_FILE, TOOL_AGENT_LOOP_NAME, epochs_for_steps, per_gpu_micro_batches,
                        verl_overrides)
from .run_folder import agent_loop_config, prepare_verl_run, split_heldout, write_verl_parquet
from .search_tool import SearchTool, search_tool_config
from .settings import VerlRun, VerlSettings

__all__ = ["AGENT_LOOP_NAME", "REWARD_FILE", "TOOL_AGENT_LOOP_NAME", "SearchTool", "VerlRun", "VerlSettings",
           "agent_loop_config", "epochs_for_steps", "finished_checkpoint", "per_gpu_micro_batches", "prepare_verl_run",
           "run_verl_job", "search_tool_config", "split_heldout", "start_verl_run", "verl_overrides", "write_verl_parquet",
           "wait_for_checkpoint"]
