"""The reward registry: every reward under a name, so configs and verl pick one by string.

A registered reward is a pure function ``reward(response, golden, *, options...) -> float`` of the response
(`base.Response`: text, `Trajectory` or `Rollout`) and the golden answers (`agentic_retriever.eval.qa.Golden`:
a string, or a list of alternatives). Its keyword-only arguments are its whole configuration.

    from agent.rewards import get_reward
    reward = get_reward("search_r1_format", lambda_f=0.4)
    reward("<think> ... </think>\\n<answer> Paris </answer>", ["Paris"])   # 1.0
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

__all__ = ["REWARDS", "RewardFn", "get_reward", "register", "reward_options"]

RewardFn = Callable[..., float]

REWARDS: dict[str, RewardFn] = {}


def register(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: register a reward function under `name` (a name is taken once)."""
    def decorate(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"a reward named {name!r} is already registered ({REWARDS[name].__qualname__})")
        REWARDS[name] = fn
        return fn
    return decorate


def reward_options(name: str) -> dict[str, object]:
    """The options (keyword-only arguments) of a registered reward, with their defaults."""
    params = inspect.signature(_lookup(name)).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def get_reward(name: str, **options) -> Callable[..., float]:
    """The reward registered as `name`, as ``reward(response, golden)`` with `options` bound.

    An unknown name or an option the reward does not take raises ValueError listing what exists.
    """
    fn = _lookup(name)
    unknown = sorted(set(options) - set(reward_options(name)))
    if unknown:
        raise ValueError(f"reward {name!r} takes no option {', '.join(unknown)}; its options: "
                         f"{', '.join(reward_options(name)) or 'none'}")
    return functools.partial(fn, **options) if options else fn


def _lookup(name: str) -> RewardFn:
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; choose one of {', '.join(sorted(REWARDS))}") from None
