"""Rewards for search agents: pure functions of (response, golden answers), registered by name.

A response is its text (prompt excluded) or an object carrying it (`agent.trajectory.Trajectory`,
`agent.env.Rollout`); golden answers are a string or a list of alternatives. `get_reward(name, **options)`
returns ``reward(response, golden) -> float``; `agent.rl.verl.reward` exposes each with verl's
``compute_score(data_source, solution_str, ground_truth, extra_info)`` signature.

Registered (the empirical study, "An Empirical Study on Reinforcement Learning for Reasoning-Search
Interleaved LLM Agents", arXiv 2505.15117; docs/rl.md, "Rewards"):

=============================  ===================================================================
``search_r1_em``               Eq. 2: EM of the last ``<answer>`` with a golden answer (1 / 0)
``search_r1_valid_format``     f_format: the ``is_valid_sequence`` state machine (1 / 0)
``search_r1_retrieval_hit``    f_ret: a golden answer is in an ``<information>`` block (1 / 0)
``search_r1_format``           Eq. 3, release variant (1, 1-lambda_f, lambda_f, 0.1 or 0)
``search_r1_format_paper``     Eq. 3, paper variant (1, 1-lambda_f, lambda_f, 0)
``search_r1_retrieval``        Eq. 4, release variant (Eq. 3 + lambda_r for a retrieved gold)
``search_r1_retrieval_paper``  Eq. 4, paper variant
``constant``                   the same value for every response (a control for RL runs)
``qagent_valid_format``        QAgent's r_fmt: plan before every search, reflection after every information (1 / 0)
``qagent_hit``                 QAgent's Hit: a golden answer in the response text (1 / 0)
``qagent_stage1``              QAgent's stage 1 (Eq. 7): r_fmt x strict EM (1 / 0)
``when_to_search_format``      "Learning when to search"'s r_f (Eq. 6): the reflect dialect's shapes (1 / -1)
=============================  ===================================================================

The same table (`REWARDS`, `agent.rewards.registry`) holds the rewards that read more than the response, each
entry saying what it needs: QAgent's stage 2 (``qagent_stage2``, "QAgent: A modular Search Agent with Interactive
Query Understanding", arXiv 2510.08383, Eq. 10; `agent.rewards.qagent`) reads a frozen generator's answer; s3's
gains (``s3_gbr``, ``s3_gbr_paper``; `agent.rewards.gbr`) a frozen generator's accuracies; the stage rewards of
"Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with Reasoning Language Models"
(``when_to_search_stage1``, ``when_to_search_stage2``, Eqs. 10-12; `agent.rewards.when_to_search`) an LLM judge's
verdict and the query embeddings.

    from agent.rewards import get_reward
    get_reward("search_r1_retrieval", lambda_f=0.4)(trajectory, trajectory.golden_answers)
"""

from __future__ import annotations

from .base import Response, response_text
from .format_reward import (
    SearchR1Judgement,
    format_reward,
    format_reward_paper,
    judge,
    retrieval_reward,
    retrieval_reward_paper,
    shaped_reward,
)
from .gbr import gain_beyond_rag, gain_beyond_rag_paper
from .outcome import constant_reward, em_reward, extract_answer
from .qagent import hit_reward, qagent_stage1_reward
from .qagent_format import FormatCheck, check_format
from .registry import KINDS, REWARDS, RegisteredReward, get_reward, register, reward_entry, reward_options
from .retrieval import gold_in_information, information_blocks, retrieval_hit_reward
from .sequence import (
    QWEN_ASSISTANT_MARKER,
    SequenceCheck,
    is_valid_sequence,
    search_r1_valid_format_reward,
)
from .when_to_search import format_reward as when_to_search_format_reward

__all__ = ["KINDS", "QWEN_ASSISTANT_MARKER", "REWARDS", "FormatCheck", "RegisteredReward", "Response",
           "SearchR1Judgement", "SequenceCheck", "check_format", "constant_reward", "em_reward", "hit_reward",
           "qagent_stage1_reward", "extract_answer", "format_reward", "format_reward_paper", "gain_beyond_rag",
           "gain_beyond_rag_paper", "get_reward",
           "gold_in_information", "information_blocks", "is_valid_sequence", "judge", "register", "response_text",
           "retrieval_hit_reward", "retrieval_reward", "retrieval_reward_paper", "reward_entry", "reward_options",
           "shaped_reward", "search_r1_valid_format_reward", "when_to_search_format_reward"]
