"""The RL arithmetic (agent/rl/core.py) on hand-computed tiny tensors, and state masking."""

from __future__ import annotations

import math

import pytest
import torch

from agent.rl.core import (ADVANTAGE_ESTIMATORS, aggregate, entropy_from_logits, estimate_advantages, gae_advantages,
                           group_advantages, kl_estimate, kl_penalised_scores, masked_whiten, policy_loss, value_loss)


def t(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float)


def test_gae_with_gamma_and_lambda_one_is_the_return_minus_the_value():
    advantages, returns = gae_advantages(t([0, 0, 1]), t([0.5, 0.25, 0.75]), t([1, 1, 1]))
    assert torch.allclose(advantages, t([0.5, 0.75, 0.25]))
    assert torch.allclose(returns, t([1, 1, 1]))


def test_gae_matches_the_recursion_by_hand():
    # delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lambda A_{t+1}; gamma 0.9, lambda 0.8
    advantages, returns = gae_advantages(t([0, 0, 1]), t([0.2, 0.4, 0.6]), t([1, 1, 1]), gamma=0.9, lam=0.8)
    assert torch.allclose(advantages, t([0.46816, 0.428, 0.4]), atol=1e-6)
    assert torch.allclose(returns, t([0.66816, 0.828, 1.0]), atol=1e-6)


def test_gae_skips_inserted_tokens_as_if_they_were_not_there():
    rewards, values = t([0, 0, 1]), t([0.2, 0.4, 0.6])
    compact, _ = gae_advantages(rewards, values, t([1, 1, 1]), gamma=0.9, lam=0.8)
    # the same three generated tokens with an observation of two tokens after the first one
    spread_rewards = t([0, 0, 0, 0, 1])
    spread_values = t([0.2, 99.0, -7.0, 0.4, 0.6])
    advantages, returns = gae_advantages(spread_rewards, spread_values, t([1, 0, 0, 1, 1]), gamma=0.9, lam=0.8)
    assert torch.allclose(advantages[0, [0, 3, 4]], compact[0])
    assert advantages[0, 1] == advantages[0, 2] == returns[0, 1] == returns[0, 2] == 0


def test_a_reward_on_an_inserted_token_is_credited_to_the_last_generated_token_before_it():
    advantages, _ = gae_advantages(t([0, 0, 1]), t([0, 0, 0]), t([1, 1, 0]))
    assert torch.allclose(advantages, t([1, 1, 0]))


def test_group_advantages_normalise_within_each_group():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.3])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    advantages = group_advantages(scores, groups)
    expected = [0.5 / (std + 1e-6), -0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.5 / (std + 1e-6), 0, 0, 0]
    assert torch.allclose(advantages, torch.tensor(expected), atol=1e-6)
    assert torch.allclose(group_advantages(scores, groups, normalize_std=False),
                          torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0]))


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    log_r = math.log(2)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(log_r)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * log_r ** 2)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + log_r)
    assert kl_estimate(logp, ref, "low_var_kl").item() == pytest.approx(0.5 - 1 + log_r)
    far = kl_estimate(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl")
    assert far.item() == 10.0  # exp(30) clamped
    assert kl_estimate(ref, ref, "k3").item() == 0.0
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(logp, ref, "k4")


def test_kl_in_the_reward_comes_off_each_score_summed_over_the_generated_tokens():
    """GRPO with the KL in the reward (verl): score - kl_coef * sum_t k1_t over the generated tokens only."""
    half, quarter = math.log(0.5), math.log(0.25)
    scores = torch.tensor([1.0, 0.0])
    logprobs = t([half, half, 99.0], [quarter, half, half])
    ref = t([quarter, half, -99.0], [half, quarter, 7.0])
    mask = t([1, 1, 0], [1, 0, 0])  # row 0's third token and row 1's last two were inserted by the environment
    penalised = kl_penalised_scores(scores, logprobs, ref, mask, kl_coef=0.1)
    assert torch.allclose(penalised, torch.tensor([1.0 - 0.1 * math.log(2), 0.0 + 0.1 * math.log(2)]))
    assert torch.equal(kl_penalised_scores(scores, logprobs, ref, mask, kl_coef=0.0), scores)
    assert torch.equal(kl_penalised_scores(scores, logprobs, logprobs + 5 * (1 - mask), mask, kl_coef=0.1), scores)
    k3 = kl_penalised_scores(scores, logprobs, ref, mask, kl_coef=1.0, estimator="k3")
    assert torch.allclose(k3, scores - (kl_estimate(logprobs, ref, "k3") * mask).sum(dim=1))


def test_clipped_policy_loss_by_hand():
    ratios = torch.tensor([[1.5, 1.5, 0.5, 0.5]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    # per token: max(-A r, -A clip(r)): -1.2 (clipped), 1.5, -0.5, 0.8 (clipped)
    loss, stats = policy_loss(ratios.log(), old, advantages, mask, 0.2, 0.2)
    assert loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    assert stats["clip_frac"] == pytest.approx(0.5)
    # DAPO's clip-higher: eps_high 0.28 lets the first token's ratio grow to 1.28
    loss, _ = policy_loss(ratios.log(), old, advantages, mask, 0.2, 0.28)
    assert loss.item() == pytest.approx((-1.28 + 1.5 - 0.5 + 0.8) / 4)


def test_loss_aggregations_by_hand_and_micro_batches_sum_to_the_mini_batch():
    losses = t([1, 2, 100], [3, 100, 100])
    mask = t([1, 1, 0], [1, 0, 0])
    assert aggregate(losses, mask, "token-mean").item() == pytest.approx(6 / 3)
    assert aggregate(losses, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 3) / 2)
    assert aggregate(losses, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 3) / 2)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        whole = aggregate(losses, mask, mode)
        parts = sum(aggregate(losses[i:i + 1], mask[i:i + 1], mode, tokens=3.0, sequences=2.0) for i in range(2))
        assert parts.item() == pytest.approx(whole.item()), mode
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(losses, mask, "sum")


def test_value_loss_clips_around_the_rollout_values():
    values, old, returns, mask = t([2.0, 0.1]), t([0.0, 0.0]), t([1.0, 1.0]), t([1, 1])
    # token 1: unclipped (2-1)^2 = 1, clipped (0.5-1)^2 = 0.25 -> 1; token 2: 0.81 both ways
    loss, stats = value_loss(values, old, returns, mask, clip=0.5)
    assert loss.item() == pytest.approx(0.5 * (1 + 0.81) / 2)
    assert stats["vf_clip_frac"] == 0.0
    values = t([0.9, 0.1])  # clipped to 0.5 -> (0.5-1)^2 = 0.25 > (0.9-1)^2
    loss, stats = value_loss(values, old, returns, mask, clip=0.5)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.81) / 2)
    assert stats["vf_clip_frac"] == 0.5
    loss, _ = value_loss(values, old, returns, mask, clip=None)
    assert loss.item() == pytest.approx(0.5 * (0.01 + 0.81) / 2)


def test_entropy_of_uniform_and_of_a_certain_distribution():
    logits = torch.stack([torch.zeros(8), torch.tensor([50.0] + [0.0] * 7)])
    entropy = entropy_from_logits(logits)
    assert entropy[0].item() == pytest.approx(math.log(8))
    assert entropy[1].item() == pytest.approx(0.0, abs=1e-6)


def test_whitening_uses_only_unmasked_entries():
    values, mask = t([1.0, 3.0, 1000.0]), t([1, 1, 0])
    whitened = masked_whiten(values, mask)
    assert torch.allclose(whitened, t([-1.0, 1.0, 0.0]), atol=1e-4)


def test_changing_masked_tokens_changes_no_loss_and_no_gradient():
    """Search-R1's state masking: retrieved tokens' log-probs, values and advantages may be anything."""
    torch.manual_seed(0)
    mask = t([1, 0, 0, 1, 1, 0], [0, 1, 1, 0, 0, 0])
    old, ref, values = torch.randn(2, 6), torch.randn(2, 6), torch.randn(2, 6)
    rewards = torch.zeros(2, 6)
    rewards[0, 4], rewards[1, 2] = 1.0, 0.5
    noise = torch.randn(2, 6) * 5 * (1 - mask)  # only on masked positions

    def losses(logits_shift: torch.Tensor, masked_noise: torch.Tensor):
        logprobs = (torch.randn(2, 6, generator=torch.Generator().manual_seed(1)) + logits_shift).requires_grad_()
        advantages, returns = gae_advantages(rewards, values + masked_noise, mask, gamma=0.95, lam=0.9)
        total = torch.zeros(())
        for mode in ("token-mean", "seq-mean-token-mean"):
            pg, _ = policy_loss(logprobs, old + masked_noise, advantages, mask, 0.2, 0.28, mode)
            kl = aggregate(kl_estimate(logprobs, ref + masked_noise, "low_var_kl"), mask, mode)
            vf, _ = value_loss(logprobs, values + masked_noise, returns, mask, 0.5, mode)
            total = total + pg + kl + vf
        total.backward()
        assert torch.all(logprobs.grad[mask == 0] == 0)
        return total.detach(), logprobs.grad, advantages, returns

    base = losses(torch.zeros(2, 6), torch.zeros(2, 6))
    changed = losses(noise, noise)
    for a, b in zip(base, changed):
        assert torch.allclose(a, b, atol=1e-6)


def test_advantage_estimators_are_chosen_by_name_over_one_steps_tensors():
    """The trainer asks `estimate_advantages` by the algorithm's name; GRPO's is the group-normalised score on every
    generated token, GAE's puts the score on each row's last generated token."""
    scores, groups = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1])
    mask = t([0, 1, 1], [1, 1, 0], [1, 1, 1])
    last = torch.tensor([2, 1, 2])
    grpo, returns = estimate_advantages("grpo", scores, groups, mask, last, None, None)
    assert returns is None and torch.equal(grpo, group_advantages(scores, groups)[:, None] * mask)
    values = torch.zeros(3, 3)
    gae, gae_returns = estimate_advantages("gae", scores, groups, mask, last, values, None, whiten=False)
    rewards = torch.zeros(3, 3)
    rewards[0, 2], rewards[1, 1], rewards[2, 2] = 1.0, 0.0, 0.5
    assert torch.equal(gae, gae_advantages(rewards, values, mask)[0]) and gae_returns is not None
    with pytest.raises(ValueError, match="unknown advantage estimator 'rloo'; choose one of gae, grpo"):
        estimate_advantages("rloo", scores, groups, mask, last, None, None)
    with pytest.raises(ValueError, match="GAE needs the critic's values"):
        estimate_advantages("gae", scores, groups, mask, last, None, None)
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo"}
