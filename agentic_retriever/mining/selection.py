"""Stage 6: positive and negative passages of a round (agentic_r.txt section 4.1.1, "Positive and Negative
Passages Selection"; notes "Selection [P/R]"). A pure function of the round's candidate table.

1. Rank the candidates by (GAC desc, LR desc); equal keys keep the retriever's order (a stable sort).
2. Keep the round only if the best has GAC >= ``gac_threshold`` (1, i.e. a correct final answer) and
   LR >= ``lr_threshold`` (60); otherwise drop it (``best_gac_below`` / ``best_lr_below``).
3. Positives: ``positives="ties"`` ([R]) takes every candidate whose keys equal the best's, at most
   ``max_positives`` (3), one training example each; ``"first"`` takes the best only (the paper's text).
4. Negatives: ``num_negatives`` (15) sampled without replacement from the rest (every candidate that is
   not a positive: "passages ranked below are sampled as negatives"), separately for each example; fewer
   than that: the round is dropped (``too_few_negatives``). With ``exclude_ties_from_negatives`` the
   candidates tied with the best that are not positives (beyond ``max_positives``, or all of them with
   ``positives="first"``) are kept out of the negatives too (equally good by the ranking keys; more rounds
   are dropped, mostly under "w/o LR" where every GAC=1 candidate ties). Sampling is seeded by (seed, round id, positive id): the same round gives the same rows whichever
   shard, batch or resumed run computes it. N = 1 + num_negatives = 16 passages per example.

Ablations (Table 5): ``use_gac=False`` ("w/o GAC") ranks and thresholds by LR only; ``use_lr=False``
("w/o LR") by GAC only, the LR tie-break removed (ties among GAC=1 candidates keep the retriever's order).

    result = select_passages([Candidate("p1", lr=80, gac=1), ...], SelectionConfig(), key="q1#1")
    result.examples[0].positive.passage_id, [n.passage_id for n in result.examples[0].negatives]
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .store import stable_hash

__all__ = ["Candidate", "Example", "SelectionConfig", "SelectionResult", "select_passages"]


@dataclass(frozen=True)
class Candidate:
    """One candidate passage of a round: its id, LR in 0..100 and GAC (None when that stage did not run)."""

    passage_id: str
    lr: float | None = None
    gac: float | None = None


@dataclass
class SelectionConfig:
    """How positives and negatives are chosen (defaults: the paper and [R])."""

    use_gac: bool = field(default=True, metadata={"help": "rank by global answer correctness (off: 'w/o GAC')"})
    use_lr: bool = field(default=True, metadata={"help": "rank by local relevance (off: 'w/o LR')"})
    lr_threshold: float = field(default=60.0, metadata={"help": "the best candidate needs LR >= this"})
    gac_threshold: float | None = field(default=None, metadata={
        "help": "the best candidate needs GAC >= this; none: 1 for rollout GAC, 0.5 for answer likelihood"})
    positives: Literal["ties", "first"] = field(default="ties", metadata={
        "help": "ties: every candidate tied with the best (release); first: the best only (paper text)"})
    max_positives: int = field(default=3, metadata={"help": "at most this many tied positives (one row each)"})
    num_negatives: int = field(default=15, metadata={"help": "sampled negatives per row (N = 1 + this)"})
    exclude_ties_from_negatives: bool = field(default=False, metadata={
        "help": "never sample a candidate tied with the best as a negative (paper and release: off)"})
    seed: int = field(default=0, metadata={"help": "seed of the negative sampling"})

    def validate(self) -> None:
        if not (self.use_gac or self.use_lr):
            raise ValueError("selection needs GAC, LR or both (use_gac and use_lr are both off)")
        if self.positives not in ("ties", "first"):
            raise ValueError(f"positives must be 'ties' or 'first', got {self.positives!r}")
        if self.max_positives < 1:
            raise ValueError(f"max_positives must be at least 1, got {self.max_positives}")
        if self.num_negatives < 1:
            raise ValueError(f"num_negatives must be at least 1, got {self.num_negatives}")


@dataclass(frozen=True)
class Example:
    """One training row: a positive and its sampled negatives."""

    positive: Candidate
    negatives: tuple[Candidate, ...]


@dataclass(frozen=True)
class SelectionResult:
    """The round's examples (empty when dropped), the drop reason, and the ranked candidates."""

    examples: tuple[Example, ...]
    drop_reason: str | None
    ranked: tuple[Candidate, ...]


def _keys(candidate: Candidate, config: SelectionConfig) -> tuple[float, ...]:
    keys = []
    if config.use_gac:
        if candidate.gac is None:
            raise ValueError(f"candidate {candidate.passage_id} has no GAC but selection ranks by it")
        keys.append(candidate.gac)
    if config.use_lr:
        if candidate.lr is None:
            raise ValueError(f"candidate {candidate.passage_id} has no LR but selection ranks by it")
        keys.append(candidate.lr)
    return tuple(keys)


def select_passages(candidates: Sequence[Candidate], config: SelectionConfig, key: str) -> SelectionResult:
    """Positives and negatives of one round (see the module docstring); `key` (the round id) seeds sampling."""
    config.validate()
    gac_threshold = 1.0 if config.gac_threshold is None else config.gac_threshold
    ranked = tuple(sorted(candidates, key=lambda c: tuple(-k for k in _keys(c, config))))
    if not ranked:
        return SelectionResult((), "no_candidates", ranked)
    best = ranked[0]
    if config.use_gac and best.gac < gac_threshold:
        return SelectionResult((), "best_gac_below", ranked)
    if config.use_lr and best.lr < config.lr_threshold:
        return SelectionResult((), "best_lr_below", ranked)
    best_keys = _keys(best, config)
    tied = [c for c in ranked if _keys(c, config) == best_keys]
    positives = tied[:config.max_positives] if config.positives == "ties" else tied[:1]
    chosen = {id(c) for c in positives}
    pool = [c for c in ranked if id(c) not in chosen
            and not (config.exclude_ties_from_negatives and _keys(c, config) == best_keys)]
    if len(pool) < config.num_negatives:
        return SelectionResult((), "too_few_negatives", ranked)
    examples = []
    for positive in positives:
        rng = random.Random(int(stable_hash([config.seed, key, positive.passage_id]), 16))
        examples.append(Example(positive, tuple(rng.sample(pool, config.num_negatives))))
    return SelectionResult(tuple(examples), None, ranked)
