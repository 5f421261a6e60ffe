"""Stage 1: trajectories -> rounds, one per search call ("Agentic-R: Learning to Retrieve for Agentic Search",
section 4.1.1; the round cut follows the authors' release).

A trajectory T = {t_1, q_1, D_1, ..., t_n, A} is split at every search call. Round i holds the original
question Q, the query q_i, the queries before it (``history_queries``), and the context: the response up to
and including the turn that issued q_i (it ends with ``</search>``). The context is exactly what
`agent.env.Prefix` resumes from, so global answer correctness continues the agent from it with a candidate
passage as the round's only ``<information>`` (`Round.prefix`).

``round_index`` is 1-based and counts the trajectory's search queries in order, as the released rows do
(its sub-answers are looked up at ``round_index - 1``); the Figure 8 sub-answers are numbered the same way.
Rounds are not mined (and are counted, by reason) when:

* ``round_index_limit``: ``round_index >= limit`` (default 5, as the authors' release: only rounds with
  index < 5);
* ``multi_query``: the search action carried several queries (one ``<information>`` block for all of them
  has no single query to train on; the Search-R1 dialect never produces it);
* ``empty_query``: an empty ``<search></search>``;
* ``not_executed``: the search got no results into the context (Search-R1's search-disabled last turn);
* ``beyond_agent_turns``: the context used more turns than the GAC agent may (`EnvConfig.max_turns`).

A question's sampled trajectories (``Trajectory.sample``) give rounds of their own (ids ``question_id@sample#i``);
the mining pipeline keeps one round per search state (`Round.search_state`), so a search that two samples made
alike, after the same queries, is mined once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.fingerprint import stable_hash
from .environment import Prefix, Trajectory, trajectory_id

__all__ = ["Round", "RoundDrop", "extract_rounds", "search_queries"]


@dataclass(frozen=True)
class Round:
    """One search call of one trajectory, with everything later stages need."""

    question_id: str
    question: str
    golden_answers: tuple[str, ...]
    round_index: int  # 1-based position of the query among the trajectory's search queries
    turn_index: int  # index of the turn that issued the query in `Trajectory.turns`
    query: str
    history_queries: tuple[str, ...]  # the trajectory's search queries before this one
    context: str  # response text up to and including the search call (a `Prefix.response_text`)
    turns_used: int  # generation turns the context used (a `Prefix.turns_used`)
    retriever: str  # the retriever the trajectory was rolled out with
    sample: int = 0  # which of the question's sampled trajectories (`Trajectory.sample`)

    @property
    def id(self) -> str:
        """``<trajectory id>#round_index`` (``question_id#i``, or ``question_id@sample#i``): unique in a file."""
        return f"{trajectory_id(self.question_id, self.sample)}#{self.round_index}"

    @property
    def search_state(self) -> tuple:
        """What the retriever is asked and after which searches: the question, the queries before, the query."""
        return self.question_id, self.question, self.history_queries, self.query

    @property
    def fingerprint(self) -> str:
        """Hash of everything that defines the round: a re-rolled trajectory gives new fingerprints."""
        return stable_hash([self.question_id, self.question, list(self.golden_answers), self.round_index,
                            self.turn_index, self.query, list(self.history_queries), self.context, self.turns_used])

    def prefix(self, passages: Sequence[ScoredPassage]) -> Prefix:
        """Where global answer correctness resumes: this context, `passages` as the round's observation."""
        return Prefix(self.context, tuple(passages), self.turns_used)


@dataclass(frozen=True)
class RoundDrop:
    """A round that is not mined, and why (see the module docstring for the reasons)."""

    round_id: str
    reason: str


def search_queries(trajectory: Trajectory) -> list[tuple[int, str]]:
    """(turn index, query) of every search query the agent wrote, in order: what Figure 8 asks sub-answers for.

    Searches on the search-disabled last turn count (the scorer sees them in the trajectory text);
    forced observations of a resumed rollout and searches before the first turn do not (no generated text).
    """
    return [(i, q) for i, turn in enumerate(trajectory.turns) if turn.action == "search" and turn.text
            for q in turn.queries]


def extract_rounds(trajectory: Trajectory, round_index_limit: int = 5,
                   max_turns: int | None = None) -> tuple[list[Round], list[RoundDrop]]:
    """The minable rounds of one trajectory and the dropped ones with their reasons.

    `max_turns` (the GAC agent's `EnvConfig.max_turns`) drops contexts that used more turns than it allows;
    None skips that check (no rollouts).
    """
    if round_index_limit < 1:
        raise ValueError(f"round_index_limit must be at least 1, got {round_index_limit}")
    queries = search_queries(trajectory)
    rounds, drops = [], []
    for k, (turn_index, query) in enumerate(queries):
        round_index = k + 1
        turn = trajectory.turns[turn_index]
        round_id = f"{trajectory.id}#{round_index}"
        reason = None
        if round_index >= round_index_limit:
            reason = "round_index_limit"
        elif len(turn.queries) != 1:
            reason = "multi_query"
        elif not query.strip():
            reason = "empty_query"
        elif not turn.retrieved or not turn.observation:
            reason = "not_executed"
        if reason is None:
            prefix = Prefix.from_trajectory(trajectory, turn_index, ())
            if max_turns is not None and prefix.turns_used > max_turns:
                reason = "beyond_agent_turns"
        if reason is not None:
            drops.append(RoundDrop(round_id, reason))
            continue
        rounds.append(Round(
            question_id=trajectory.question_id, question=trajectory.question,
            golden_answers=tuple(trajectory.golden_answers), round_index=round_index, turn_index=turn_index,
            query=query, history_queries=tuple(q for _, q in queries[:k]), context=prefix.response_text,
            turns_used=prefix.turns_used, retriever=trajectory.retriever, sample=trajectory.sample,
        ))
    return rounds, drops
