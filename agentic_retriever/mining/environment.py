"""The seam between mining and the agent: the only mining module that imports `agent`, and only `agent.env`.

Mining needs the agent in three places: rounds are cut from the agent's trajectories (`Trajectory`) and
resume it from a `Prefix`; global answer correctness continues it (`rollout` under an `EnvConfig`) or
scores an answer after an observation formatted by its dialect (`get_dialect`, `cut_to_tokens`). Every
other mining module imports these names from here, so the retriever library's dependence on the agent is
this one file, and what it may use is `agent.env`'s public surface (its `__all__`), not the agent's
internals. `tests/test_import_rules.py` enforces it (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from agent.env import EnvConfig, Prefix, Trajectory, cut_to_tokens, get_dialect, rollout, trajectory_id

__all__ = ["EnvConfig", "Prefix", "Trajectory", "cut_to_tokens", "get_dialect", "rollout", "trajectory_id"]
