"""The settings of utility mining: `MiningConfig`, its defaults (the paper, "Agentic-R: Learning to Retrieve for
Agentic Search", and the authors' release; the agent environment GAC continues trajectories in: at most 5
turns) and its checks.

Each setting is explained where it acts (the stage modules of this package) and in docs/mining.md; the
deviations from the paper are listed in docs/paper-deviations.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from .environment import EnvConfig
from .gac import DEFAULT_GAC_THRESHOLDS, GAC_CRITERIA
from .selection import SelectionConfig

__all__ = ["MiningConfig"]


def _agentic_r_env() -> EnvConfig:
    return EnvConfig(max_turns=5)


@dataclass
class MiningConfig:
    """Settings of utility mining (defaults: the paper and its release; see the package modules for each)."""

    dataset: str = field(default="", metadata={"help": "the rows' 'dataset' field; empty: the trajectory file's name"})
    retriever_id: str = field(default="", metadata={
        "help": "name of the candidate retriever R_{i-1} in the cache keys when its client cannot describe its "
                "content (no identity(); index folders and services can); empty: each trajectory's 'retriever'"})
    num_candidates: int = field(default=20, metadata={"help": "candidate passages per round (paper: 20)"})
    round_index_limit: int = field(default=5, metadata={"help": "rounds with 1-based index >= this are skipped"})
    retrieval_batch_rounds: int = field(default=1024, metadata={"help": "rounds per retrieval call"})
    use_sub_answers: bool = field(default=True, metadata={
        "help": "generate sub-answers (Figure 8) and score with Figure 6 where one exists"})
    sub_answer_max_new_tokens: int = field(default=256, metadata={"help": "tokens of a sub-answer generation"})
    lr_scorer: Literal["listwise", "pointwise", "retriever", "none"] = field(default="listwise", metadata={
        "help": "listwise: Figures 6/7 (paper); pointwise: likelihood scorer for small models (deviation); "
                "retriever: 100 x the retriever's cosine (a baseline); none: no LR (the 'w/o LR' ablation)"})
    lr_window: int = field(default=10, metadata={"help": "passages per listwise prompt (release 10; paper text 20)"})
    lr_retries: int = field(default=1, metadata={"help": "new tries of a listwise window that does not parse"})
    lr_retry_temperature: float = field(default=0.7, metadata={"help": "sampling temperature of a retry"})
    lr_max_new_tokens: int = field(default=128, metadata={"help": "tokens of one listwise answer"})
    pointwise_mode: Literal["judgement", "query_likelihood"] = field(default="judgement", metadata={
        "help": "pointwise LR: p(Yes) of a relevance judgement, or the query's likelihood given the passage"})
    lr_scale: Literal["absolute", "round_posterior"] = field(default="absolute", metadata={
        "help": "query_likelihood LR: 100 exp(mean log p(q|d)) (absolute), or 100 p(d | q) over the round's "
                "candidates with a uniform prior (round_posterior: calibrated, so a threshold means something)"})
    scorer_batch_prompts: int = field(default=512, metadata={"help": "scorer prompts per generate/score call"})
    gac_mode: Literal["rollout", "answer_likelihood"] = field(default="rollout", metadata={
        "help": "rollout: continue the agent, EM of its answer (paper); answer_likelihood: p(gold) (REPLUG-style)"})
    gac_metric: Literal["em", "contains"] = field(default="em", metadata={
        "help": "rollout GAC: exact match (paper) or contains-match on word boundaries"})
    answer_lead: str = field(default="<answer>", metadata={"help": "answer_likelihood: text before the gold"})
    gac_criterion: Literal["sequence", "per_token", "gain", "part_gain"] = field(default="gain", metadata={
        "help": "answer_likelihood: graded GAC = p(gold), its per-token geometric mean, the per-token log-prob "
                "gain over no passage, or that gain for the best part of a list answer (see mining/gac.py)"})
    gac_target: Literal["final", "sub_question"] = field(default="final", metadata={
        "help": "the gold GAC scores: the question's final answer (paper), or the answer of the leaf sub-question the "
                "round's query pursues (multi-hop questions; needs sub_questions; mining/sub_questions.py)"})
    sub_questions: str = field(default="", metadata={
        "help": "leaf QA rows with parent_id (the decomposition of the mined questions) for gac_target sub_question"})
    gac_batch_pairs: int = field(default=1024, metadata={"help": "(round, candidate) continuations per rollout call"})
    skip_hopeless_gac: bool = field(default=True, metadata={
        "help": "no GAC for rounds whose best LR is below the threshold (same rows, less compute)"})
    plot: bool = field(default=True, metadata={"help": "draw mining_stats.png"})
    progress: bool = field(default=True, metadata={"help": "progress bars"})
    env: EnvConfig = field(default_factory=_agentic_r_env)
    selection: SelectionConfig = field(default_factory=SelectionConfig)

    def validate(self) -> None:
        for name in ("num_candidates", "round_index_limit", "retrieval_batch_rounds", "sub_answer_max_new_tokens",
                     "lr_window", "lr_max_new_tokens", "scorer_batch_prompts", "gac_batch_pairs"):
            if getattr(self, name) < 1:
                raise ValueError(f"MiningConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.lr_retries < 0:
            raise ValueError(f"MiningConfig.lr_retries must be >= 0, got {self.lr_retries}")
        for name, choices in (("lr_scorer", ("listwise", "pointwise", "retriever", "none")),
                              ("gac_mode", ("rollout", "answer_likelihood")),
                              ("gac_target", ("final", "sub_question")),
                              ("gac_criterion", GAC_CRITERIA),
                              ("lr_scale", ("absolute", "round_posterior")),
                              ("gac_metric", ("em", "contains")), ("pointwise_mode", ("judgement", "query_likelihood"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"MiningConfig.{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.gac_target == "sub_question" and not self.sub_questions:
            raise ValueError("gac_target sub_question needs sub_questions (the leaf QA rows of the mined questions)")
        self.resolved_selection().validate()

    def resolved_selection(self) -> SelectionConfig:
        """The selection settings with the GAC threshold of the GAC criterion filled in, and LR off when
        ``lr_scorer`` is ``none``."""
        selection = self.selection
        if self.lr_scorer == "none":
            selection = replace(selection, use_lr=False)
        if selection.gac_threshold is None:
            criterion = "rollout" if self.gac_mode == "rollout" else self.gac_criterion
            selection = replace(selection, gac_threshold=DEFAULT_GAC_THRESHOLDS[criterion])
        return selection

    @property
    def needs_scorer_llm(self) -> bool:
        """Whether LR (or the sub-answers) needs the scorer LLM."""
        return self.resolved_selection().use_lr and self.lr_scorer in ("listwise", "pointwise")
