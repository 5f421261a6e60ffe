"""Stage 6: positive and negative passages of a round ("Agentic-R: Learning to Retrieve for Agentic Search",
section 4.1.1, "Positive and Negative Passages Selection", and the authors' release). A pure function of the
round's candidate table. The deviations from the paper are listed in docs/paper-deviations.md.

The paper sorts by (GAC desc, LR desc) and keeps the round when the best has GAC = 1 and LR >= 60. Its GAC is
binary (EM of a continuation), so sorting by it is the same as thresholding it first. With a graded GAC (an
answer likelihood, see `gac`) sorting on the raw value would let GAC alone decide and never let LR break a
tie; so selection thresholds first, then ranks, which is the paper's rule for binary GAC and the meaningful
one for graded GAC:

1. A candidate **passes** when GAC >= ``gac_threshold`` (when GAC is used) and LR >= ``lr_threshold`` (when
   LR is used). No passing candidate: the round is dropped (``no_gac_pass`` when no candidate passes GAC,
   ``no_lr_pass`` when some pass GAC but none of those reaches the LR threshold, ``lr_below`` under "w/o GAC").
   With ``require_answer_in_positive`` a passing candidate must also contain a gold answer
   (``no_answer_in_passing`` otherwise).
2. Passing candidates are **ranked** by LR desc (by GAC desc under "w/o LR"), then by the retriever's rank.
3. **Positives**: ``positives="ties"`` (the authors' release) takes the passing candidates whose ranking value
   equals the best's, at most ``max_positives`` (3), one training example each; ``"first"`` takes the best
   only.
4. **Negatives** (``negatives="filtered"``, the default): ``num_negatives`` (15) sampled without replacement,
   separately for each example, from the candidates that are not *useful*: a useful candidate passes GAC or
   passes LR, so neither a passage after which the agent answers correctly nor one the judge finds relevant is a
   negative (the release samples from every candidate not tied with the best, GAC = 1 ones included: with
   tau = 0.01 such false negatives push useful pages down on the small CPU stack). With
   ``false_negative_filter`` a candidate containing a gold answer (normalised, on word boundaries; computed from
   gold answers, never from evidence labels) is never a negative either. Fewer than ``num_negatives`` left: the
   round is dropped (``too_few_negatives``). Sampling is seeded by (seed, round id, positive id): the same round
   gives the same rows whichever shard, batch or resumed run computes it. N = 1 + num_negatives = 16 passages.

   ``negatives="release"``: exactly the authors' release (``step4_construct_retriever_data.py`` of
   github.com/8421BCD/Agentic-R): the pool is every candidate not tied with the best, useful and answer-bearing
   ones included (a tied candidate beyond ``max_positives`` is neither positive nor negative); ``num_negatives``
   are sampled once per round, seeded by (seed, round id), shared by all of the round's rows and kept in ranking
   order (GAC desc, LR desc, retriever rank). Fewer than ``num_negatives`` in the pool drops the round. The
   false-negative filter is not part of it (refused together).

Ablations (Table 5): ``use_gac=False`` ("w/o GAC") thresholds and ranks by LR only; ``use_lr=False`` ("w/o
LR") by GAC only (passing candidates ranked by GAC value, then by retriever rank).

    result = select_passages([Candidate("p1", lr=80, gac=1), ...], SelectionConfig(), key="q1#1")
    result.examples[0].positive.passage_id, [n.passage_id for n in result.examples[0].negatives]
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentic_retriever.base.fingerprint import stable_hash

__all__ = ["Candidate", "Example", "SelectionConfig", "SelectionResult", "select_passages"]


@dataclass(frozen=True)
class Candidate:
    """One candidate passage of a round: its id, LR in 0..100 and graded GAC (None when that stage did not run),
    its 1-based retriever rank and whether it contains a gold answer (None: not known)."""

    passage_id: str
    lr: float | None = None
    gac: float | None = None
    rank: int = 0
    contains_answer: bool | None = None


@dataclass
class SelectionConfig:
    """How positives and negatives are chosen (defaults: the paper and its release, plus the false-negative filter)."""

    use_gac: bool = field(default=True, metadata={"help": "select by global answer correctness (off: 'w/o GAC')"})
    use_lr: bool = field(default=True, metadata={"help": "select by local relevance (off: 'w/o LR')"})
    lr_threshold: float = field(default=60.0, metadata={"help": "a positive needs LR >= this"})
    gac_threshold: float | None = field(default=None, metadata={
        "help": "a candidate passes GAC when its value >= this; none: the GAC criterion's default"})
    positives: Literal["ties", "first"] = field(default="ties", metadata={
        "help": "ties: every passing candidate tied with the best (release); first: the best only (paper text)"})
    max_positives: int = field(default=3, metadata={"help": "at most this many tied positives (one row each)"})
    num_negatives: int = field(default=15, metadata={"help": "sampled negatives per row (N = 1 + this)"})
    negatives: Literal["filtered", "release"] = field(default="filtered", metadata={
        "help": "filtered: sampled per row from the candidates neither useful (passing GAC or LR) nor, with "
                "false_negative_filter, answer-bearing; release: the authors' release, sampled once per round from "
                "every candidate not tied with the best (set false_negative_filter false)"})
    false_negative_filter: bool = field(default=True, metadata={
        "help": "never sample a candidate that contains a gold answer as a negative (negatives filtered only)"})
    require_answer_in_positive: bool = field(default=False, metadata={
        "help": "a positive must contain a gold answer (rounds without such a candidate then skip GAC)"})
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
        if self.negatives not in ("filtered", "release"):
            raise ValueError(f"negatives must be 'filtered' or 'release', got {self.negatives!r}")
        if self.negatives == "release" and self.false_negative_filter:
            raise ValueError("negatives 'release' samples from every candidate not tied with the best, answer-bearing "
                             "ones included, as the authors' release: set false_negative_filter false with it")


@dataclass(frozen=True)
class Example:
    """One training row: a positive and its sampled negatives."""

    positive: Candidate
    negatives: tuple[Candidate, ...]


@dataclass(frozen=True)
class SelectionResult:
    """The round's examples (empty when dropped), the drop reason, and each candidate's role.

    ``roles`` maps a passage id to ``positive``, ``negative`` (sampled for some example), ``excluded`` (kept
    out of the negatives: useful, or containing a gold answer) or is missing (unused)."""

    examples: tuple[Example, ...]
    drop_reason: str | None
    roles: dict[str, str] = field(default_factory=dict)


def _value(candidate: Candidate, name: str) -> float:
    value = getattr(candidate, name)
    if value is None:
        raise ValueError(f"candidate {candidate.passage_id} has no {name.upper()} but selection uses it")
    return value


def _passes(candidate: Candidate, config: SelectionConfig, gac_threshold: float) -> tuple[bool, bool]:
    """(passes GAC, passes LR); a signal that is off passes."""
    gac_ok = not config.use_gac or _value(candidate, "gac") >= gac_threshold
    lr_ok = not config.use_lr or _value(candidate, "lr") >= config.lr_threshold
    return gac_ok, lr_ok


def select_passages(candidates: Sequence[Candidate], config: SelectionConfig, key: str,
                    gac_threshold: float | None = None) -> SelectionResult:
    """Positives and negatives of one round (see the module docstring); `key` (the round id) seeds sampling.

    `gac_threshold` overrides ``config.gac_threshold`` (the caller resolves the criterion's default); one of
    the two must be set when GAC is used."""
    config.validate()
    threshold = config.gac_threshold if gac_threshold is None else gac_threshold
    if config.use_gac and threshold is None:
        raise ValueError("selection by GAC needs a gac_threshold")
    if not candidates:
        return SelectionResult((), "no_candidates")
    checks = [_passes(c, config, threshold) for c in candidates]
    passing = [c for c, (g, l) in zip(candidates, checks) if g and l]
    if config.require_answer_in_positive:
        passing = [c for c in passing if c.contains_answer]
    if not passing:
        if config.use_gac and not any(g for g, _ in checks):
            reason = "no_gac_pass"
        elif not any(g and l for g, l in checks):
            reason = "no_lr_pass" if config.use_gac else "lr_below"
        else:
            reason = "no_answer_in_passing"
        return SelectionResult((), reason)
    sort_by = "lr" if config.use_lr else "gac"
    ranked = sorted(passing, key=lambda c: (-_value(c, sort_by), c.rank))
    best = _value(ranked[0], sort_by)
    tied = [c for c in ranked if _value(c, sort_by) == best]
    positives = tied[:config.max_positives] if config.positives == "ties" else tied[:1]
    if config.negatives == "release":
        return _release_negatives(candidates, positives, tied, config, key)
    useful = {c.passage_id for c, (g, l) in zip(candidates, checks)
              if (config.use_gac and g) or (config.use_lr and l)}
    roles: dict[str, str] = {c.passage_id: "positive" for c in positives}
    pool = []
    for candidate in candidates:
        if candidate.passage_id in roles:
            continue
        if candidate.passage_id in useful or (config.false_negative_filter and candidate.contains_answer):
            roles[candidate.passage_id] = "excluded"
        else:
            pool.append(candidate)
    if len(pool) < config.num_negatives:
        return SelectionResult((), "too_few_negatives", roles)
    examples = []
    for positive in positives:
        rng = random.Random(int(stable_hash([config.seed, key, positive.passage_id]), 16))
        negatives = tuple(rng.sample(pool, config.num_negatives))
        roles.update((n.passage_id, "negative") for n in negatives)
        examples.append(Example(positive, negatives))
    return SelectionResult(tuple(examples), None, roles)


def _release_negatives(candidates: Sequence[Candidate], positives: list[Candidate], tied: list[Candidate],
                       config: SelectionConfig, key: str) -> SelectionResult:
    """The release's negatives (module docstring, ``negatives="release"``): one seeded sample per round from every
    candidate not tied with the best, in ranking order, shared by every positive's row."""
    roles = {c.passage_id: "positive" for c in positives} | {c.passage_id: "excluded" for c in tied[len(positives):]}
    tied_ids = {c.passage_id for c in tied}
    pool = sorted((c for c in candidates if c.passage_id not in tied_ids),
                  key=lambda c: (-(c.gac or 0.0) if config.use_gac else 0.0,
                                 -(c.lr or 0.0) if config.use_lr else 0.0, c.rank))
    if len(pool) < config.num_negatives:
        return SelectionResult((), "too_few_negatives", roles)
    rng = random.Random(int(stable_hash([config.seed, key]), 16))
    negatives = tuple(pool[i] for i in sorted(rng.sample(range(len(pool)), config.num_negatives)))
    roles.update((n.passage_id, "negative") for n in negatives)
    return SelectionResult(tuple(Example(positive, negatives) for positive in positives), None, roles)
