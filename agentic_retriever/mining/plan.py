"""What a mining run will cost, before it runs (`mine run --plan.only`): LLM requests and tokens per stage.

Utility mining ("Agentic-R: Learning to Retrieve for Agentic Search", arXiv 2601.11888, section 4.1.1) spends
its compute in three LLM stages, each counted here from the mining settings:

* ``sub_answers``: one scorer request per trajectory with a minable round (Figure 8), its prompt the whole
  trajectory; at most ``sub_answer_max_new_tokens`` generated;
* ``local_relevance``: listwise, ``ceil(num_candidates / lr_window)`` scorer requests per round (Figures 6-7),
  each holding a window of passages, at most ``lr_max_new_tokens`` generated (retries of an unparsable window
  come on top); pointwise, one scored pair per candidate;
* ``gac``: one agent continuation per candidate of a round (rollout GAC), each a request per turn it generates
  whose prompt holds the agent's prompt, the round's context, the passage and the turns before (a prefix cache
  prefills less); or one scored answer per candidate (likelihood GAC). Rounds whose best LR is below the
  threshold (``skip_hopeless_gac``) or without an answer-holding candidate skip it, so this is an upper bound.

Where the trajectories exist, the plan reads a sample of them (``plan.sample``): the minable rounds per trajectory
(`extract_rounds`, as mining cuts them), the prompts rendered from their real text, the agent's own
continuation after each round as the expected length of a GAC continuation; the passages shown in their
observations stand in for the candidates; a continuation is expected to write the turns the agent wrote after
that round. Before the rollouts, it reads the number of questions (``plan.qa`` or
``plan.questions``, times ``plan.samples``) and assumes ``plan.searches_per_question``, ``plan.passage_tokens``
and ``plan.turn_tokens``. Tokens are counted with the scorer's and the agent's tokenizers when they load, else
as characters / 4 (``tokens_counted_with`` says which). Sampling is by position (the first trajectories), and
every figure is scaled to the whole file.

`mine` records the plan of its own trajectories in mining_stats.json (``plan``), beside the measured ``cost``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import MiningConfig
from .environment import Trajectory, get_dialect
from .prompts import relevance_prompt, sub_answer_prompt
from .rounds import extract_rounds, search_queries

__all__ = ["PlanConfig", "llm_token_counter", "merge_plans", "plan_mining", "plan_table", "token_counter"]

log = logging.getLogger(__name__)

#: Tokens assumed per sub-answer ("<sub-answer> ... </sub-answer>") and per listwise score ("[3] 85, ").
SUB_ANSWER_TOKENS = 16
LR_SCORE_TOKENS = 6
#: Before any rollout: turns a GAC continuation generates (an answer, or one more search and then the answer).
GAC_TURNS = 1.5


@dataclass
class PlanConfig:
    """The plan of `mine run` (``mine_run.plan``): print it and stop, and what it assumes before any rollout."""

    only: bool = field(default=False, metadata={"help": "print the plan of this run and stop (loads no model)"})
    sample: int = field(default=200, metadata={"help": "trajectories read to measure rounds and prompt lengths"})
    qa: str = field(default="", metadata={"help": "without trajectories: the QA set to be rolled out (its size)"})
    questions: int = field(default=0, metadata={"help": "without trajectories or qa: the number of questions"})
    samples: int = field(default=1, metadata={"help": "without trajectories: trajectories per question"})
    searches_per_question: float = field(default=2.0, metadata={
        "help": "without trajectories: searches per trajectory (the paper's agents make about 1.5-2.5)"})
    passage_tokens: int = field(default=140, metadata={
        "help": "without trajectories: tokens per passage (wiki-18: 100 words and a title)"})
    turn_tokens: int = field(default=150, metadata={"help": "without trajectories: tokens the agent writes per turn"})


def token_counter(model: str) -> tuple[Callable[[str], int], str]:
    """(count, name): the model's tokenizer when it loads, else characters / 4."""
    if model:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model)
            return (lambda text: len(tokenizer.encode(text, add_special_tokens=False))), model
        except Exception as error:  # noqa: BLE001 - any failure to load falls back, and is said
            log.warning("plan: the tokenizer of %s did not load (%s); counting characters / 4", model, error)
    return (lambda text: math.ceil(len(text) / 4)), "characters / 4"


def llm_token_counter(llm) -> tuple[Callable[[str], int], str]:
    """(count, name) from a loaded LLM's tokenizer (the mining run's own), else characters / 4."""
    tokenizer = getattr(llm, "tokenizer", None) if llm is not None else None
    if tokenizer is None:
        return token_counter("")
    return (lambda text: len(tokenizer.encode(text, add_special_tokens=False))), llm.name


def _observed_passages(trajectories: Sequence[Trajectory]) -> list[str]:
    """The passages the sample's observations show (``Doc i(Title: ...) text``), as the scorer would see them."""
    found = []
    for trajectory in trajectories:
        for turn in trajectory.turns:
            found += [p.strip() for p in re.split(r"Doc \d+\(Title: ", turn.observation)[1:] if p.strip()]
    return found


def _stage(requests: float, prompt: float, completion_max: float, completion: float | None = None) -> dict[str, float]:
    return {"requests": round(requests), "prompt_tokens": round(prompt),
            "completion_tokens": round(completion if completion is not None else completion_max),
            "completion_tokens_max": round(completion_max)}


def plan_mining(config: MiningConfig, trajectories: Sequence[Trajectory], total: int, plan: PlanConfig,
                scorer_tokens: Callable[[str], int], agent_tokens: Callable[[str], int],
                counted_with: dict[str, str]) -> dict[str, Any]:
    """The plan of mining `total` trajectories, measured on `trajectories` (a sample of them; none before the
    rollouts: then `total` is the number to come and `plan`'s assumptions stand in)."""
    selection = config.resolved_selection()
    rollout_gac = selection.use_gac and config.gac_mode == "rollout"
    dialect = get_dialect(config.env.dialect)
    c, window = config.num_candidates, config.lr_window
    windows = -(-c // window)
    sub_prompt = lr_prompt = gac_prompt = gac_first = gac_out = gac_turns = 0.0
    rounds = with_rounds = queries = 0
    if trajectories:
        passages = _observed_passages(trajectories) or ["(no passage shown)"]
        for trajectory in trajectories:
            cut, _ = extract_rounds(trajectory, config.round_index_limit, config.env.max_turns if rollout_gac else None)
            if not cut:
                continue
            with_rounds += 1
            queries += len(search_queries(trajectory))
            sub_prompt += scorer_tokens(sub_answer_prompt(trajectory.question, trajectory.golden_answers,
                                                          trajectory.response_text))
            for k, rnd in enumerate(cut):
                rounds += 1
                shown = [passages[(k * window + j) % len(passages)] for j in range(min(window, c))]
                lr_prompt += windows * scorer_tokens(relevance_prompt(rnd.query, shown, "an answer"))
                # a continuation generates the turns the agent itself wrote after this round, each turn a request
                # whose prompt holds the agent's prompt, the context, the passage and the turns before it
                later = [t for t in trajectory.turns[rnd.turn_index + 1:] if t.text]
                prompt = agent_tokens(dialect.build_prompt(rnd.question) + rnd.context) \
                    + agent_tokens(passages[k % len(passages)])
                gac_first += c * prompt
                for j in range(max(1, len(later))):
                    gac_prompt += c * prompt
                    if j < len(later):
                        prompt += agent_tokens(later[j].text + later[j].observation)
                        gac_out += c * agent_tokens(later[j].text)
                gac_turns += c * max(1, len(later))
        scale = total / len(trajectories)
        basis = {"measured_on_trajectories": len(trajectories)}
    else:
        per = min(plan.searches_per_question, config.round_index_limit - 1)
        with_rounds, queries, rounds = 1, plan.searches_per_question, per
        question = "q " * 10
        sub_prompt = scorer_tokens(sub_answer_prompt(question, ["a"], "")) + plan.turn_tokens * (1 + per) \
            + plan.passage_tokens * config.env.topk * per
        lr_prompt = per * windows * (scorer_tokens(relevance_prompt(question, [""] * min(window, c), "a"))
                                     + min(window, c) * plan.passage_tokens)
        context = plan.turn_tokens * (1 + per) / 2 + plan.passage_tokens * config.env.topk * (per - 1) / 2
        first = agent_tokens(dialect.build_prompt(question)) + context + plan.passage_tokens
        gac_turns, gac_first = per * c * GAC_TURNS, per * c * first
        gac_prompt = gac_turns * first + per * c * (GAC_TURNS - 1) * (plan.turn_tokens + plan.passage_tokens)
        gac_out = gac_turns * plan.turn_tokens
        scale = total
        basis = {"assumed": {"searches_per_question": plan.searches_per_question,
                             "passage_tokens": plan.passage_tokens, "turn_tokens": plan.turn_tokens}}
    stages: dict[str, dict[str, float]] = {"candidates": {"requests": round(rounds * scale)}}
    if config.needs_scorer_llm and config.use_sub_answers:
        stages["sub_answers"] = _stage(with_rounds * scale, sub_prompt * scale,
                                       with_rounds * scale * config.sub_answer_max_new_tokens,
                                       min(queries * SUB_ANSWER_TOKENS, with_rounds * config.sub_answer_max_new_tokens)
                                       * scale)
    if selection.use_lr and config.lr_scorer == "listwise":
        stages["local_relevance"] = _stage(rounds * windows * scale, lr_prompt * scale,
                                           rounds * windows * scale * config.lr_max_new_tokens,
                                           rounds * c * LR_SCORE_TOKENS * scale)
    elif selection.use_lr and config.lr_scorer == "pointwise":
        per_pair = lr_prompt / max(1, windows * min(window, c))
        stages["local_relevance"] = _stage(rounds * c * scale, per_pair * rounds * c * scale, 0)
    if selection.use_gac and rollout_gac:
        stages["gac"] = {**_stage(gac_turns * scale, gac_prompt * scale,
                                  rounds * c * scale * config.env.max_new_tokens_per_turn * config.env.max_turns,
                                  gac_out * scale), "continuations": round(rounds * c * scale)}
    elif selection.use_gac:  # answer likelihood: one scored (prompt, answer) pair per candidate
        stages["gac"] = {**_stage(rounds * c * scale, gac_first * scale, 0), "continuations": round(rounds * c * scale)}
    return {"trajectories": total, "rounds": round(rounds * scale),
            "rounds_per_trajectory": round(rounds / max(1, len(trajectories) or 1), 3), **basis,
            "tokens_counted_with": counted_with, "stages": stages,
            "gac_is_upper_bound": bool(selection.use_gac and config.skip_hopeless_gac)}


def merge_plans(plans: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The plan of several shards: their counts summed (the first shard's description kept)."""
    plans = [p for p in plans if p]
    if not plans:
        return {}
    merged = {**plans[0], "trajectories": sum(p["trajectories"] for p in plans),
              "rounds": sum(p["rounds"] for p in plans), "stages": {}}
    merged["rounds_per_trajectory"] = round(merged["rounds"] / max(1, merged["trajectories"]), 3)
    if "measured_on_trajectories" in merged:
        merged["measured_on_trajectories"] = sum(p.get("measured_on_trajectories", 0) for p in plans)
    for stage in plans[0]["stages"]:
        merged["stages"][stage] = {key: sum(p["stages"].get(stage, {}).get(key, 0) for p in plans)
                                   for key in plans[0]["stages"][stage]}
    return merged


def plan_table(plan: dict[str, Any]) -> str:
    """The plan as a Markdown table for the shell and the docs."""
    lines = [f"{plan['trajectories']:,} trajectories, {plan['rounds']:,} rounds "
             f"({plan['rounds_per_trajectory']} per trajectory"
             + (f", measured on {plan['measured_on_trajectories']:,}" if "measured_on_trajectories" in plan
                else f", assumed: {plan['assumed']}") + f"); tokens counted with {plan['tokens_counted_with']}", "",
             "| stage | requests | prompt tokens | generated tokens (expected) | generated tokens (at most) |",
             "|---|---|---|---|---|"]
    for stage, s in plan["stages"].items():
        if stage == "candidates":
            lines.append(f"| candidates (retrieval queries) | {s['requests']:,} | | | |")
            continue
        label = f"{stage} ({s['continuations']:,} continuations)" if "continuations" in s else stage
        lines.append(f"| {label} | {s['requests']:,} | {s['prompt_tokens']:,} | {s['completion_tokens']:,} | "
                     f"{s['completion_tokens_max']:,} |")
    if plan["gac_is_upper_bound"]:
        lines.append("\nGAC is an upper bound: rounds whose best LR is under the threshold skip it (skip_hopeless_gac).")
    return "\n".join(lines) + "\n"
