"""The arithmetic of policy-gradient RL for a search agent, on padded [batch, response tokens] tensors.

Every function takes a ``mask`` parallel to its token tensors: 1 where the agent generated the token, 0 for
padding and for what the environment inserted (``<information>`` blocks, invalid-action messages). That is
Search-R1's state masking ("An Empirical Study on Reinforcement Learning for Reasoning-Search Interleaved LLM
Agents", arXiv 2505.15117, section 2): masked tokens never enter a loss, a KL, an advantage or a value target,
so their log-probabilities and values can be anything (``tests/agent/rl/test_rl_core.py`` proves it by changing them).

Estimators and losses (names as in verl, whose Search-R1 and DAPO recipes these follow; DAPO is arXiv
2503.14476, GRPO comes from "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
Models", arXiv 2402.03300):

- `gae_advantages`: GAE(gamma, lambda) for PPO, run over the generated tokens only;
- `group_advantages`: GRPO's group-normalised outcome, (r - mean) / (std + eps) over the n samples of a prompt;
- `kl_penalised_scores`: GRPO with the KL in the reward: each sequence's score minus kl_coef x its summed KL;
- `kl_estimate`: k1 (``log p - log q``, PPO's in-reward penalty), k2, k3 / ``low_var_kl`` (GRPO's loss term);
- `policy_loss`: the clipped surrogate with decoupled eps_low / eps_high (DAPO; equal for PPO and GRPO);
- `value_loss`: the clipped value loss of PPO's critic;
- `aggregate`: token-mean (DAPO), seq-mean-token-mean (GRPO's paper) or seq-mean-token-sum.

The advantage estimators are chosen by name from `ADVANTAGE_ESTIMATORS` (as verl's ``core_algos`` does), all with
one signature over a step's padded tensors (`estimate_advantages`): ``gae`` (PPO) and ``grpo``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch

__all__ = ["ADVANTAGE_ESTIMATORS", "LossAggregation", "KLEstimator", "aggregate", "entropy_from_logits",
           "estimate_advantages", "gae_advantages", "group_advantages", "kl_estimate", "kl_penalised_scores",
           "masked_mean", "masked_whiten", "policy_loss", "register_advantage", "RewardKL", "value_loss"]

LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (0 when nothing is unmasked)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`values` shifted and scaled to mean 0, variance 1 over the unmasked entries (PPO's advantage whitening)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                   lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over each row's generated tokens; returns
    (advantages, returns), both zero at masked positions.

    The recursion skips masked tokens: an inserted observation is part of the environment's transition
    between two of the agent's tokens, not a step of its own, so the value of an inserted token never
    enters and a reward placed on a masked position is credited to the last generated token before it. With Search-R1's
    gamma = lambda = 1 this equals verl's recursion over all response tokens; with lambda < 1 it does not
    discount across observations the agent did not write.
    """
    mask = mask.to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    carried = torch.zeros_like(rewards[:, 0])  # rewards of masked positions since the last generated token
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        reward = rewards[:, t] + carried
        delta = reward + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage * m
        next_value = torch.where(m.bool(), values[:, t], next_value)
        next_advantage = torch.where(m.bool(), advantage, next_advantage)
        carried = torch.where(m.bool(), torch.zeros_like(carried), reward)
    returns = (advantages + values) * mask
    return advantages, returns


def group_advantages(scores: torch.Tensor, groups: torch.Tensor, normalize_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO's outcome advantage per sequence: its score minus its group's mean, divided by the group's
    standard deviation + `eps` when `normalize_std` (Dr. GRPO leaves the division out). `groups` holds a
    group id per sequence (the samples of one prompt); a group of one gets advantage 0."""
    advantages = torch.zeros_like(scores)
    for group in torch.unique(groups):
        members = groups == group
        if members.sum() < 2:
            continue
        group_scores = scores[members]
        centred = group_scores - group_scores.mean()
        advantages[members] = centred / (group_scores.std() + eps) if normalize_std else centred
    return advantages


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probabilities (Schulman,
    "Approximating KL divergence"): k1 = log r, k2 = (log r)^2 / 2, k3 = exp(-log r) - 1 + log r with
    log r = log p - log q. ``low_var_kl`` is k3 clamped to [-10, 10], verl's GRPO default."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    if estimator in ("k3", "low_var_kl"):
        kl = torch.exp(-log_ratio) - 1 + log_ratio
        return kl.clamp(-10, 10) if estimator == "low_var_kl" else kl
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2, k3 or low_var_kl")


def kl_penalised_scores(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor,
                        kl_coef: float, estimator: KLEstimator = "k1") -> torch.Tensor:
    """Per-sequence rewards with the KL to the reference in the reward, for an outcome-advantage estimator
    (GRPO with ``kl_placement: reward``): ``score - kl_coef * sum_t KL_t`` over each row's generated tokens.

    verl does the same: its in-reward penalty makes token rewards ``score_t - beta * kl_t`` (k1 by default), and
    GRPO's outcome advantage sums a row's token rewards before normalising within the group. `scores` is
    [rows]; the token tensors are [rows, R] with `mask` 1 on generated tokens."""
    kl = kl_estimate(logprobs, ref_logprobs, estimator) * mask.to(logprobs.dtype)
    return scores - kl_coef * kl.sum(dim=-1).to(scores.dtype)


class RewardKL(NamedTuple):
    """The KL to the reference when it goes into the reward: the sampled tokens' log-probabilities under the
    rollout policy and the reference, its weight and its estimator (`kl_estimate`)."""

    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    coef: float
    estimator: KLEstimator


#: Advantage estimators by name: ``estimator(scores, groups, mask, last, values, kl, **options) -> (advantages,
#: returns or None)``, over one step's tensors right-aligned like `agent.rl.batch.collate`'s: `scores` [rows] the
#: sequences' rewards, `groups` [rows] their prompts, `mask` [rows, R], `last` [rows] the position of each row's
#: last generated token, `values` [rows, R] the critic's (None without one), `kl` the KL in the reward (None:
#: none there).
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {}


def register_advantage(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under `name` (a name is taken once)."""
    def decorate(fn: Callable) -> Callable:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"an advantage estimator named {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn
    return decorate


def estimate_advantages(name: str, *args, **options) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The advantages (and returns) of the estimator registered as `name` (see `ADVANTAGE_ESTIMATORS`)."""
    try:
        estimator = ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of "
                         f"{', '.join(sorted(ADVANTAGE_ESTIMATORS))}") from None
    return estimator(*args, **options)


@register_advantage("gae")
def _gae(scores: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor, last: torch.Tensor,
         values: torch.Tensor | None, kl: RewardKL | None, *, gamma: float = 1.0, lam: float = 1.0,
         whiten: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's: the score on each row's last generated token, minus the weighted KL on every generated token, then
    `gae_advantages` over the critic's values (whitened over the batch when `whiten`)."""
    if values is None:
        raise ValueError("GAE needs the critic's values")
    rewards = torch.zeros_like(mask)
    if kl is not None:
        rewards -= kl.coef * kl_estimate(kl.logprobs, kl.ref_logprobs, kl.estimator) * mask
    rewards[torch.arange(len(scores)), last] += scores.to(rewards.dtype)
    advantages, returns = gae_advantages(rewards, values, mask, gamma, lam)
    return (masked_whiten(advantages, mask) if whiten else advantages), returns


@register_advantage("grpo")
def _grpo(scores: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor, last: torch.Tensor,
          values: torch.Tensor | None, kl: RewardKL | None, *, normalize_std: bool = True) -> tuple[torch.Tensor, None]:
    """GRPO's: each sequence's score (`kl_penalised_scores` when the KL is in the reward), normalised within its
    group (`group_advantages`), on every generated token of the sequence."""
    if kl is not None:
        scores = kl_penalised_scores(scores, kl.logprobs, kl.ref_logprobs, mask, kl.coef, kl.estimator)
    return group_advantages(scores, groups, normalize_std)[:, None].to(mask.dtype) * mask, None


def aggregate(losses: torch.Tensor, mask: torch.Tensor, mode: LossAggregation, tokens: float | None = None,
              sequences: float | None = None) -> torch.Tensor:
    """Reduce per-token losses to one number.

    ``token-mean``: sum over unmasked tokens / `tokens` (every token weighs the same, DAPO); ``seq-mean-token-
    mean``: each row's token mean, summed / `sequences` (every sequence weighs the same, GRPO's paper);
    ``seq-mean-token-sum``: each row's token sum, summed / `sequences`. `tokens` and `sequences` default to this
    batch's own counts; pass the counts of the whole mini-batch when this batch is one micro-batch of it, so
    that accumulating micro-batches gives exactly the mini-batch's loss.
    """
    mask = mask.to(losses.dtype)
    if mode == "token-mean":
        return (losses * mask).sum() / (tokens if tokens is not None else mask.sum().clamp(min=1))
    row_sums = (losses * mask).sum(dim=1)
    if mode == "seq-mean-token-mean":
        rows = row_sums / mask.sum(dim=1).clamp(min=1)
    elif mode == "seq-mean-token-sum":
        rows = row_sums
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}")
    return rows.sum() / (sequences if sequences is not None else max(losses.shape[0], 1))


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.2, mode: LossAggregation = "token-mean",
                tokens: float | None = None, sequences: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (Schulman et al. 2017, Eq. 7), ratio clipped to [1 - clip_low, 1 + clip_high]
    (DAPO's decoupled clip when they differ). Returns the loss and {clip_frac, approx_kl} over unmasked tokens."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    losses = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        stats = {"clip_frac": masked_mean((clipped > unclipped).float(), mask).item(),
                 "approx_kl": masked_mean(0.5 * log_ratio ** 2, mask).item()}
    return aggregate(losses, mask, mode, tokens, sequences), stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.5, mode: LossAggregation = "token-mean", tokens: float | None = None,
               sequences: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's critic loss: 0.5 * max((V - R)^2, (V_clipped - R)^2) with V_clipped within `clip` of the rollout's
    value (no clipping when `clip` is None). Returns the loss and {vf_clip_frac}."""
    unclipped = (values - returns) ** 2
    if clip is None:
        losses = unclipped
        clip_frac = 0.0
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (clipped_values - returns) ** 2
        losses = torch.maximum(unclipped, clipped)
        clip_frac = masked_mean((clipped > unclipped).float(), mask).item()
    return 0.5 * aggregate(losses, mask, mode, tokens, sequences), {"vf_clip_frac": clip_frac}


def entropy_from_logits(logits: torch.Tensor, log_normaliser: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy of the next-token distribution at every position: logsumexp(z) - sum softmax(z) * z
    (`log_normaliser`: logsumexp(z) when the caller has it already)."""
    logits = logits.float()
    if log_normaliser is None:
        log_normaliser = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - log_normaliser.unsqueeze(-1))
    return log_normaliser - (probs * logits).sum(dim=-1)
