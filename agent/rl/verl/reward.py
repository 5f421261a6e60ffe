"""The rewards with verl's custom reward signature ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

verl (the cluster-scale RL trainer; docs/rl.md, "The RL trainer") calls a custom reward function as
``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` with ``solution_str`` the decoded
response (prompt excluded) and ``ground_truth`` the row's ``reward_model.ground_truth``; the options in
``custom_reward_function.reward_kwargs`` arrive as keyword arguments. Point verl at this file:

    custom_reward_function.path=agent/rl/verl/reward.py
    custom_reward_function.name=search_r1_format            # or compute_score / search_r1_em / ...
    +custom_reward_function.reward_kwargs.lambda_f=0.4      # the reward's options (agent.rewards.reward_options)

``compute_score`` scores with the registered reward named by its ``reward`` option (default ``search_r1_em``,
Search-R1's reward); every registered response reward (`VERL_REWARDS`, read from the one reward table) also has a
function of its own name here. ``data_source`` and
``extra_info`` do not change the score (Search-R1's QA sets all use the same reward).

``ground_truth`` may be Search-R1's ``{"target": [...]}`` (its data preparation writes the golden answers
there; read back from parquet the list is a numpy array), a list or tuple of golden answers, or one string.
Anything else, a dict without ``"target"`` and an empty answer list raise ValueError.

QAgent's stage 1 (``qagent_stage1``), its format rule and Hit are here; its stage 2 (``qagent_stage2``, Eq. 10 of
"QAgent: A modular Search Agent with Interactive Query Understanding", arXiv 2510.08383) is not, nor are s3's
gains: they score a frozen generator's answer from the rollout's retrieved documents, and verl's reward manager
hands a reward the decoded response and the ground truth only (no generator, no documents). Run them in the
embedded trainer (`agent.rl.batch_reward`; docs/rl.md, "QAgent"). Likewise "Learning when to search"'s
format term (Eq. 6) is here as ``when_to_search_format``, its stage rewards (Eqs. 10-12) are not: they read an
LLM judge's verdict and the query embeddings of an encoder (docs/rl.md, "Learning when to search").

verl loads this file by path as a stand-alone module, so it imports the package absolutely (``agent`` must be
installed, e.g. ``pip install -e .``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agent.rewards.registry import KINDS, REWARDS, reward_entry
from agentic_retriever.base.qa_metrics import golden_strings

DEFAULT_REWARD = "search_r1_em"
#: The rewards verl can run: the response rewards (the others read a generator, a judge or query embeddings).
VERL_REWARDS = tuple(sorted(name for name, entry in REWARDS.items() if entry.kind == "response"))


def golden_answers_from_ground_truth(ground_truth: Any) -> list[str]:
    """The golden answers in a verl ``ground_truth``: ``{"target": answers}``, a list/tuple/array of them, or a str."""
    answers = ground_truth
    if isinstance(answers, Mapping):
        if "target" not in answers:
            raise ValueError(f"ground_truth dict has no 'target' key (keys: {', '.join(map(str, answers))}); "
                             "expected Search-R1's {'target': [golden answers]}")
        answers = answers["target"]
    if not isinstance(answers, str) and hasattr(answers, "tolist"):  # numpy array read back from parquet
        answers = answers.tolist()
    if not isinstance(answers, (str, list, tuple)):
        raise ValueError(  # noqa: TRY004 (a bad value in the data, reported like the others)
            f"ground_truth must be {{'target': [...]}}, a list of golden answers or a string, "
            f"got {type(answers).__name__}: {answers!r:.80}")
    try:
        golds = golden_strings(answers)
    except TypeError as error:
        raise ValueError(f"ground_truth holds something other than answer strings: {error}") from None
    if not golds:
        raise ValueError("ground_truth holds no golden answers")
    return golds


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, *,
                  reward: str = DEFAULT_REWARD, **options: Any) -> float:
    """verl's signature over the registered reward `reward` with `options` (e.g. ``lambda_f=0.4``)."""
    if not isinstance(solution_str, str):
        raise TypeError(f"solution_str must be the decoded response text, got {type(solution_str).__name__}")
    entry = reward_entry(reward)
    if entry.kind != "response":
        raise ValueError(f"reward {reward!r} is {KINDS[entry.kind]}: verl hands a reward the response alone; "
                         f"train it with the embedded trainer (verl runs {', '.join(VERL_REWARDS)})")
    return float(entry.bind(**options)(solution_str, golden_answers_from_ground_truth(ground_truth)))


def _named(reward: str) -> Callable[..., float]:
    def score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
              **options: Any) -> float:
        return compute_score(data_source, solution_str, ground_truth, extra_info, reward=reward, **options)
    score.__name__ = score.__qualname__ = reward
    score.__doc__ = f"verl's signature over the reward {reward!r}: {REWARDS[reward].fn.__doc__}"
    return score


globals().update({name: _named(name) for name in VERL_REWARDS})  # verl finds a reward's function by its name
__all__ = ["VERL_REWARDS", "compute_score", "golden_answers_from_ground_truth", *VERL_REWARDS]
