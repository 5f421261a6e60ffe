"""The reward registry: every reward under a name, so configs and verl pick one by string.

A registered reward is a pure function ``reward(response, golden, *, options...) -> float`` of the response
(`base.Response`: text, `Trajectory` or `Rollout`) and the golden answers (`agentic_retriever.base.qa_metrics.Golden`:
a string, or a list of alternatives). Its keyword-only arguments are its whole configuration.

    from agent.rewards import get_reward
    reward = get_reward("search_r1_format", lambda_f=0.4)
    reward("<think> ... </think>\\n<answer> Paris </answer>", ["Paris"])   # 1.0

`register_in`, `keyword_options` and `bind` work on any such table: s3's gains (`agent.rewards.gbr.GAINS`)
use them too.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

__all__ = ["REWARDS", "RewardFn", "bind", "get_reward", "keyword_options", "register", "register_in", "reward_options"]

RewardFn = Callable[..., float]

REWARDS: dict[str, RewardFn] = {}


def register_in(table: dict[str, Callable], kind: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator: register a function under `name` in `table` (a name is taken once); `kind` names the table's
    entries in errors ("reward", "gain")."""
    def decorate(fn: Callable) -> Callable:
        if name in table:
            raise ValueError(f"a {kind} named {name!r} is already registered ({table[name].__qualname__})")
        table[name] = fn
        return fn
    return decorate


def keyword_options(table: dict[str, Callable], kind: str, name: str) -> dict[str, object]:
    """The options (keyword-only arguments) of the function registered as `name`, with their defaults."""
    params = inspect.signature(_lookup(table, kind, name)).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def bind(table: dict[str, Callable], kind: str, name: str, **options) -> Callable[..., float]:
    """The function registered as `name` with `options` bound; an unknown name or an option it does not take
    raises ValueError listing what exists."""
    fn = _lookup(table, kind, name)
    allowed = keyword_options(table, kind, name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"{kind} {name!r} takes no option {', '.join(unknown)}; its options: "
                         f"{', '.join(allowed) or 'none'}")
    return functools.partial(fn, **options) if options else fn


def _lookup(table: dict[str, Callable], kind: str, name: str) -> Callable:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(sorted(table))}") from None


def register(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: register a reward function under `name` (a name is taken once)."""
    return register_in(REWARDS, "reward", name)


def reward_options(name: str) -> dict[str, object]:
    """The options (keyword-only arguments) of a registered reward, with their defaults."""
    return keyword_options(REWARDS, "reward", name)


def get_reward(name: str, **options) -> Callable[..., float]:
    """The reward registered as `name`, as ``reward(response, golden)`` with `options` bound.

    An unknown name or an option the reward does not take raises ValueError listing what exists.
    """
    return bind(REWARDS, "reward", name, **options)
