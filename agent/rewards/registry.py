"""The reward registry: every reward of every method in one table (`REWARDS`), under a name, with what it needs.

A reward's kind says what it reads, so its entry decides how a step is scored (`agent.rl.batch_reward`), what a
config must give (`agent.rl.config.RLConfig.validate`) and whether verl can run it (`agent.rl.verl.reward`: verl's
reward manager hands a reward the decoded response and the ground truth alone):

============================  ==========================================================================
``response``                  ``reward(response, golden) -> float``: a pure function of the response (`base.Response`:
                              text, `Trajectory` or `Rollout`) and the golden answers (a string, or a list of
                              alternatives); runs in both trainers
``gain``                      ``gain(acc_s3, acc_rag) -> float``: s3's Gain Beyond RAG over a frozen generator's
                              accuracies (`agent.rewards.gbr`)
``submodule``                 ``reward(answer, response, golden) -> float``: a frozen generator's answer from the
                              agent's documents (QAgent's stage 2, `agent.rewards.qagent`)
``when_to_search``            ``reward(correct, response, query_embeddings) -> RewardTerms``: a judge's verdict and
                              the query embeddings ("Learning when to search", `agent.rewards.when_to_search`)
============================  ==========================================================================

A reward's keyword-only arguments are its whole configuration; an entry also names the dialect whose rollouts it
scores (None: any) and what the run must load for it (`NEEDS`).

    from agent.rewards import get_reward
    reward = get_reward("search_r1_format", lambda_f=0.4)
    reward("<think> ... </think>\\n<answer> Paris </answer>", ["Paris"])   # 1.0
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["KINDS", "NEEDS", "REWARDS", "RegisteredReward", "RewardFn", "get_reward", "register", "reward_entry",
           "reward_options"]

RewardFn = Callable[..., float]

#: Each kind of reward: what its function reads (see module).
KINDS = {"response": "a response reward", "gain": "a gain over naive RAG scored by a frozen generator",
         "submodule": "a reward of a frozen generator's answer", "when_to_search": "a when-to-search reward"}
#: What a run loads for a reward beyond the policy: the frozen generator, the judge (optional: exact match
#: without), the query encoder of the retriever, s3's cache of naive-RAG accuracies.
NEEDS = ("generator", "judge", "query_encoder", "naive_rag_cache")


@dataclass(frozen=True)
class RegisteredReward:
    """One entry of `REWARDS`."""

    name: str
    fn: Callable
    kind: str = "response"
    dialect: str | None = None  # the one dialect whose rollouts it scores; None: any
    needs: tuple[str, ...] = ()  # of `NEEDS`

    @property
    def options(self) -> dict[str, object]:
        """Its options (keyword-only arguments), with their defaults."""
        params = inspect.signature(self.fn).parameters.values()
        return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def bind(self, **options) -> Callable:
        """Its function with `options` bound; an option it does not take raises ValueError listing its options."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"reward {self.name!r} takes no option {', '.join(unknown)}; its options: "
                             f"{', '.join(self.options) or 'none'}")
        return functools.partial(self.fn, **options) if options else self.fn


REWARDS: dict[str, RegisteredReward] = {}


def register(name: str, kind: str = "response", dialect: str | None = None,
             needs: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator: register a reward function under `name` (a name is taken once), of `kind` (`KINDS`), scoring
    `dialect`'s rollouts only (None: any), needing `needs` (`NEEDS`) loaded."""
    if kind not in KINDS or not set(needs) <= set(NEEDS):
        raise ValueError(f"reward {name!r}: kind must be one of {', '.join(KINDS)} and needs of {', '.join(NEEDS)}, "
                         f"got {kind!r} and {needs!r}")

    def decorate(fn: Callable) -> Callable:
        if name in REWARDS:
            raise ValueError(f"a reward named {name!r} is already registered ({REWARDS[name].fn.__qualname__})")
        REWARDS[name] = RegisteredReward(name, fn, kind, dialect, tuple(needs))
        return fn
    return decorate


def reward_entry(name: str) -> RegisteredReward:
    """The entry registered as `name`; an unknown name raises ValueError listing every reward by kind."""
    try:
        return REWARDS[name]
    except KeyError:
        by_kind = "; ".join(f"{label}: {', '.join(sorted(r.name for r in REWARDS.values() if r.kind == kind))}"
                            for kind, label in KINDS.items())
        raise ValueError(f"unknown reward {name!r}; choose {by_kind}") from None


def reward_options(name: str) -> dict[str, object]:
    """The options (keyword-only arguments) of a registered reward, with their defaults."""
    return reward_entry(name).options


def get_reward(name: str, **options) -> Callable:
    """The reward registered as `name` with `options` bound (its call signature is its kind's, see module).

    An unknown name or an option the reward does not take raises ValueError listing what exists.
    """
    return reward_entry(name).bind(**options)
