"""The RL trainer (agent/rl) on a tiny random-weight Llama and a fake retriever: log-prob passes, steps of
PPO and GRPO, dynamic sampling, the constant-reward control, checkpoint resume, export, the CLI."""

from __future__ import annotations

import itertools
import json
import math
from types import SimpleNamespace

import pytest
import torch

from agent.env import EnvConfig
from agent.rl import RLConfig, RLTrainer
from agent.rl.batch import Sample, collate, token_logprobs
from agent.rl.core import group_advantages
from agent.rl.rollout import questions_at
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.qa_sources import QARow
from tests.fakes import FakeClient, RecordingSummaryWriter

ROWS = [QARow(str(i), f"which city is number {i}?", (f"city {i}",)) for i in range(6)]


def config(tmp_path, tiny_causal_lm_dir, **overrides) -> RLConfig:
    settings = dict(agent=LLMConfig(model=tiny_causal_lm_dir), out=str(tmp_path / "run"), algorithm="grpo",
                    steps=2, prompts_per_step=2, samples_per_prompt=2, micro_batch_size=2, actor_lr=1e-3,
                    env=EnvConfig(max_turns=2, max_new_tokens_per_turn=12, temperature=1.0, max_context_tokens=400),
                    progress=False, reward="search_r1_format")
    settings.update(overrides)
    return RLConfig(**settings)


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_left_padded_batches_give_each_sequence_its_own_log_probs(tiny_causal_lm_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_dir).eval()
    samples = [Sample([5, 6, 7, 8, 9], [10, 11, 12], [1, 0, 1], group=0),
               Sample([5, 6], [20, 21, 22, 23, 24, 25], [1, 1, 0, 0, 1, 1], group=1)]
    with torch.no_grad():
        batched, _ = token_logprobs(model, collate(samples), temperature=0.7)
        for row, sample in enumerate(samples):
            ids = torch.tensor([sample.prompt_ids + sample.response_ids])
            logits = model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1:-1].float() / 0.7
            alone = logits.log_softmax(-1).gather(1, torch.tensor(sample.response_ids)[:, None]).squeeze(1)
            n = len(sample.response_ids)
            generated = torch.tensor(sample.mask, dtype=torch.bool)
            assert torch.allclose(batched[row, -n:][generated], alone[generated], atol=1e-4)
            assert torch.all(batched[row, -n:][~generated] == 0)  # inserted tokens are never projected


def test_collate_right_aligns_responses_and_masks():
    samples = [Sample([1, 2], [3], [1], group=0), Sample([1], [4, 5, 6], [1, 0, 1], group=0)]
    batch = collate(samples, pad_id=0)
    assert batch.input_ids.tolist() == [[0, 1, 2, 3], [1, 4, 5, 6]]
    assert batch.attention_mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]
    assert batch.response_ids.tolist() == [[0, 0, 3], [4, 5, 6]]
    assert batch.mask.tolist() == [[0, 0, 1], [1, 0, 1]]
    with pytest.raises(ValueError, match="mask has 1 entries for 2"):
        Sample([1], [2, 3], [1], group=0)


def test_question_stream_is_a_seeded_shuffle_per_epoch_and_a_function_of_its_position():
    first = questions_at(ROWS, 0, 0, 6)
    assert sorted(r.id for r in first) == sorted(r.id for r in ROWS)
    assert questions_at(ROWS, 0, 4, 4) == first[4:] + questions_at(ROWS, 0, 6, 2)
    assert [r.id for r in questions_at(ROWS, 1, 0, 6)] != [r.id for r in first]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_step_updates_the_policy_and_logs_every_metric(tmp_path, tiny_causal_lm_dir, algorithm):
    trainer = RLTrainer(config(tmp_path, tiny_causal_lm_dir, algorithm=algorithm,
                               samples_per_prompt=2 if algorithm == "grpo" else 1),
                        FakeClient(), ROWS, reward_fn=lambda r, gold: float(len(r.response_ids) % 3))
    before = weights(trainer.policy)
    metrics = trainer.step()
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())
    expected = {"reward", "em", "valid_format", "retrieval_hit", "kl", "entropy", "clip_frac", "pg_loss",
                "response_tokens", "generated_tokens", "masked_share", "searches", "seconds_generate",
                "seconds_logprobs", "seconds_update"}
    if algorithm == "ppo":
        expected |= {"value_loss", "vf_clip_frac", "critic_grad_norm"}
    assert expected <= set(metrics)
    # GRPO (KL in the loss, one mini-batch) takes the old log-probs from its update; PPO's KL in the reward needs them first
    assert metrics["on_policy"] == (1.0 if algorithm == "grpo" else 0.0)
    # the rollouts' KV caches (the generation backend's prefix cache) are not held through the passes and the update
    assert trainer.llm.prefix_cache is not None and len(trainer.llm.prefix_cache) == 0
    assert 0 < metrics["masked_share"] < 1  # the fake retriever's observations are masked
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # the first update starts at the reference
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert logged[0]["step"] == 1 and (tmp_path / "run" / "training_curves.png").stat().st_size > 0


@pytest.mark.slow
def test_with_a_constant_reward_grpo_leaves_the_policy_where_kl_and_entropy_do(tmp_path, tiny_causal_lm_dir):
    """Group advantages of equal rewards are 0: with no KL and no entropy bonus the gradient is exactly 0 and the
    weights do not move at all. The KL to the reference adds only rounding at the start: the update's pass and the
    reference's pass see other batch shapes, whose matrix products need not agree to the last bit (they do not with
    MKL's AVX2 kernels), and Adam turns any non-zero gradient into a step of the learning rate. The entropy bonus
    moves the weights, with a gradient orders of magnitude above the KL's."""
    still = RLTrainer(config(tmp_path / "a", tiny_causal_lm_dir, reward="constant", entropy_coef=0.0, kl_coef=0.0),
                      FakeClient(), ROWS)
    before = weights(still.policy)
    assert still.step()["grad_norm"] == 0.0
    assert all(torch.equal(before[n], p) for n, p in still.policy.named_parameters())
    with_kl = RLTrainer(config(tmp_path / "b", tiny_causal_lm_dir, reward="constant", entropy_coef=0.0),
                        FakeClient(), ROWS)
    assert with_kl.config.kl_coef > 0
    kl_only = with_kl.step()["grad_norm"]
    pushed = RLTrainer(config(tmp_path / "c", tiny_causal_lm_dir, reward="constant", entropy_coef=0.01),
                       FakeClient(), ROWS)
    before = weights(pushed.policy)
    entropy_norm = pushed.step()["grad_norm"]
    assert any(not torch.equal(before[n], p) for n, p in pushed.policy.named_parameters())
    assert kl_only < 1e-3 * entropy_norm, (kl_only, entropy_norm)


@pytest.mark.slow
def test_dynamic_sampling_keeps_only_groups_whose_rewards_differ(tmp_path, tiny_causal_lm_dir):
    alternate = itertools.cycle([0.0, 1.0])

    def reward(response, golden):  # questions 0-2 always score 0; the others alternate within their group
        return 0.0 if golden[0] in ("city 0", "city 1", "city 2") else next(alternate)

    trainer = RLTrainer(config(tmp_path, tiny_causal_lm_dir, dynamic_sampling=True, dynamic_sampling_max_batches=3,
                               dynamic_sampling_filter="score", prompts_per_step=2), FakeClient(), ROWS, reward_fn=reward)
    samples, kept = trainer.collect()
    assert kept == len({s.group for s in samples}) == 2  # 3 of the 6 questions qualify
    for group in {s.group for s in samples}:
        assert len({s.score for s in samples if s.group == group}) == 2
    assert trainer.state.cursor in (2, 4, 6)  # one to three batches of two questions


@pytest.mark.slow
def test_resume_after_a_kill_gives_the_same_next_step(tmp_path, tiny_causal_lm_dir):
    whole = RLTrainer(config(tmp_path / "whole", tiny_causal_lm_dir, save_steps=1), FakeClient(), ROWS)
    whole.train()
    # the step-1 checkpoint is gone once the policy is exported: a finished run never resumes
    assert (whole.out / "policy" / "rl_manifest.json").is_file() and not (whole.out / "checkpoints").exists()
    first = RLTrainer(config(tmp_path / "cut", tiny_causal_lm_dir, save_steps=1, steps=2), FakeClient(), ROWS)
    first.step()  # the run is killed after step 1's checkpoint
    from agent.rl.checkpoint import save_checkpoint

    save_checkpoint(first.out / "checkpoints", first.state, first._modules())
    resumed = RLTrainer(config(tmp_path / "cut", tiny_causal_lm_dir, save_steps=1, steps=2), FakeClient(), ROWS)
    assert resumed.resume() and resumed.state.step == 1
    resumed.step()
    for (name, a), b in zip(whole.policy.named_parameters(), resumed.policy.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert whole.state.history[1]["reward"] == resumed.state.history[1]["reward"]
    assert whole.state.cursor == resumed.state.cursor


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "precision"), [("grpo", "fp32"), ("ppo", "bf16")])
def test_lora_trains_adapters_against_the_base_and_exports_a_merged_model(tmp_path, tiny_causal_lm_dir, algorithm,
                                                                         precision):
    from transformers import AutoModelForCausalLM

    trainer = RLTrainer(config(tmp_path, tiny_causal_lm_dir, lora=True, steps=1, lora_r=4, algorithm=algorithm,
                               agent=LLMConfig(model=tiny_causal_lm_dir, precision=precision), samples_per_prompt=2),
                        FakeClient(), ROWS,
                        reward_fn=lambda r, gold: float(sum(r.response_ids) % 2))
    assert trainer.bf16 == (precision == "bf16")
    assert trainer.reference is None  # the reference is the policy with its adapters off
    path = trainer.train()
    model = AutoModelForCausalLM.from_pretrained(path)
    assert not any("lora" in name for name, _ in model.named_parameters())
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_causal_lm_dir).named_parameters())
    assert any(not torch.equal(p, initial[name]) for name, p in model.named_parameters())  # adapters merged in
    manifest = json.loads((path / "rl_manifest.json").read_text())
    assert manifest["steps"] == 1 and manifest["settings"]["lora"] is True
    assert trainer.train() == path  # a finished run is not trained again


def grpo_samples() -> list[Sample]:
    """Two groups of two; policy and reference log-probabilities differ on the generated tokens, and wildly on
    the inserted ones (which must not count)."""
    half, quarter = math.log(0.5), math.log(0.25)
    rows = [([1, 1, 0], 1.0, [half, half, 9.0], [quarter, half, -9.0]),   # sum k1 = log 2
            ([1, 0, 1], 1.0, [half, 3.0, half], [half, -3.0, half]),      # sum k1 = 0
            ([1, 1], 0.0, [quarter, quarter], [half, half]),              # sum k1 = -2 log 2
            ([1, 0], 1.0, [half, 5.0], [quarter, -5.0])]                  # sum k1 = log 2
    return [Sample([7], [3] * len(mask), mask, group=i // 2, score=score, old_logprobs=torch.tensor(old),
                   ref_logprobs=torch.tensor(ref)) for i, (mask, score, old, ref) in enumerate(rows)]


def grpo_advantages(tmp_path, **overrides) -> list[float]:
    """Per-sequence advantages of `RLTrainer.advantages` (it reads only the config) under `overrides`."""
    samples = grpo_samples()
    settings = RLConfig(qa="qa.jsonl", out=str(tmp_path), algorithm="grpo", samples_per_prompt=2, **overrides)
    RLTrainer.advantages(SimpleNamespace(config=settings), samples)
    firsts = []
    for sample in samples:
        generated = sample.advantages[torch.tensor(sample.mask, dtype=torch.bool)]
        assert torch.all(generated == generated[0]) and torch.all(sample.advantages[~torch.tensor(sample.mask,
                                                                                                  dtype=torch.bool)] == 0)
        firsts.append(generated[0].item())
    return firsts


def test_grpo_with_the_kl_in_the_reward_normalises_the_penalised_scores(tmp_path):
    scores, groups = torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])
    summed_k1 = torch.tensor([math.log(2), 0.0, -2 * math.log(2), math.log(2)])
    no_kl = grpo_advantages(tmp_path, kl_placement="loss", kl_coef=0.5)
    assert no_kl == pytest.approx(group_advantages(scores, groups).tolist())
    assert grpo_advantages(tmp_path, kl_placement="reward", kl_coef=0.0) == pytest.approx(no_kl)
    in_reward = grpo_advantages(tmp_path, kl_placement="reward", kl_coef=0.5)
    assert in_reward == pytest.approx(group_advantages(scores - 0.5 * summed_k1, groups).tolist())
    assert in_reward[0] < 0 < in_reward[1], "equal scores: the sequence further from the reference loses"
    assert in_reward != pytest.approx(no_kl)
    assert grpo_advantages(tmp_path, kl_placement="reward", kl_coef=0.1) != pytest.approx(in_reward)


@pytest.mark.slow
def test_grpo_with_the_kl_in_the_reward_pulls_a_drifted_policy_under_a_constant_reward(tmp_path, tiny_causal_lm_dir):
    """A constant reward gives GRPO nothing to learn from; with the KL in the reward, a policy that has drifted from
    its reference still gets non-zero advantages (the samples' KL differs) and moves."""
    trainer = RLTrainer(config(tmp_path, tiny_causal_lm_dir, reward="constant", entropy_coef=0.0,
                               kl_placement="reward", kl_coef=0.5), FakeClient(), ROWS)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trainer.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    samples, _ = trainer.collect()
    trainer.score(samples)
    assert any(not torch.allclose(s.old_logprobs, s.ref_logprobs) for s in samples)
    trainer.advantages(samples)
    assert any(s.advantages.abs().max() > 0 for s in samples)
    before = weights(trainer.policy)
    trainer.update(samples)
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())


def test_settings_that_cannot_work_are_refused(tmp_path, tiny_causal_lm_dir):
    with pytest.raises(ValueError, match="samples_per_prompt must be at least 2"):
        RLTrainer(config(tmp_path, tiny_causal_lm_dir, samples_per_prompt=1), FakeClient(), ROWS)
    with pytest.raises(ValueError, match="at least one training question"):
        RLTrainer(config(tmp_path, tiny_causal_lm_dir), FakeClient(), [])


@pytest.mark.slow
def test_agent_train_cli_runs_ppo_from_a_config_file(tmp_path, tiny_causal_lm_dir, monkeypatch):
    from agentic_retriever.app.cli import main

    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": r.id, "question": r.question, "golden_answers": list(r.golden_answers)})
                          + "\n" for r in ROWS))
    monkeypatch.setattr("agent.rl.job.open_client", lambda retrieval: FakeClient())
    code = main(["agent", "train", "--config", "configs/search_r1_quickstart.yaml", "--qa", str(qa),
                 "--agent.model", tiny_causal_lm_dir, "--out", str(tmp_path / "ppo"), "--algorithm", "ppo",
                 "--steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "1",
                 "--env.max-new-tokens-per-turn", "8", "--gradient-checkpointing", "--no-progress"])
    assert code == 0
    assert (tmp_path / "ppo" / "policy" / "rl_manifest.json").is_file()


@pytest.mark.slow
def test_evaluate_is_seeded_and_does_not_train(tmp_path, tiny_causal_lm_dir):
    trainer = RLTrainer(config(tmp_path, tiny_causal_lm_dir), FakeClient(), ROWS,
                        reward_fn=lambda r, gold: float(sum(r.response_ids) % 997))
    before = weights(trainer.policy)
    first = trainer.evaluate(ROWS[:2], samples_per_prompt=2, seed=3)
    assert first == trainer.evaluate(ROWS[:2], samples_per_prompt=2, seed=3)
    assert first != trainer.evaluate(ROWS[:2], samples_per_prompt=2, seed=4)
    assert all(torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())
    assert trainer.state.step == 0 and trainer.state.cursor == 0


@pytest.mark.slow
def test_micro_batches_accumulate_to_the_same_update_as_one_pass(tmp_path, tiny_causal_lm_dir):
    def reward(response, golden):
        return float(sum(response.response_ids) % 5)

    updated = []
    for micro in (1, 4):
        trainer = RLTrainer(config(tmp_path / str(micro), tiny_causal_lm_dir, micro_batch_size=micro,
                                   loss_aggregation="seq-mean-token-mean"), FakeClient(), ROWS, reward_fn=reward)
        metrics = trainer.step()
        gradients = {name: p.grad.clone() for name, p in trainer.policy.named_parameters() if p.grad is not None}
        updated.append((gradients, metrics))
    (one, m1), (four, m4) = updated
    assert one.keys() == four.keys() and len(one) > 0
    for name in one:
        assert torch.allclose(one[name], four[name], atol=1e-7, rtol=1e-4), name
    assert any(g.abs().sum() > 0 for g in one.values())
    assert m1["pg_loss"] == pytest.approx(m4["pg_loss"], abs=1e-6)


def test_the_on_policy_shortcut_holds_only_where_it_is_exact(tmp_path):
    def settings(**overrides) -> RLConfig:
        return RLConfig(qa="qa.jsonl", out=str(tmp_path), **overrides)

    assert settings(algorithm="grpo").on_policy(16)
    assert settings(algorithm="grpo", mini_batch_size=16).on_policy(16)
    assert not settings(algorithm="grpo", mini_batch_size=8).on_policy(16)  # the second mini-batch is off-policy
    assert not settings(algorithm="grpo", ppo_epochs=2).on_policy(16)  # so is the second epoch
    assert not settings(algorithm="grpo", kl_placement="reward").on_policy(16)  # the advantages read them first
    assert not settings(algorithm="ppo").on_policy(16)  # PPO's k1 in the reward
    assert settings(algorithm="ppo", kl_coef=0.0).on_policy(16)
    assert settings(algorithm="grpo", kl_placement="reward", kl_coef=0.0).on_policy(16)


@pytest.mark.slow
def test_an_on_policy_update_equals_the_update_with_a_separate_old_log_prob_pass(tmp_path, tiny_causal_lm_dir):
    """The shortcut skips the rollout policy's pass; the loss, every statistic but the ratio's and every gradient
    are those of the update that reads the old log-probabilities from a pass of their own."""
    def reward(response, golden):
        return float(sum(response.response_ids) % 5)

    results = []
    for on_policy in (False, True):
        trainer = RLTrainer(config(tmp_path / str(on_policy), tiny_causal_lm_dir, micro_batch_size=3, entropy_coef=0.01,
                                   kl_coef=0.1), FakeClient(), ROWS, reward_fn=reward)
        torch.manual_seed(1)
        with torch.no_grad():  # a policy away from its reference, so the KL loss has a gradient too
            for p in trainer.policy.parameters():
                p.add_(0.02 * torch.randn_like(p))
        samples, _ = trainer.collect()
        trainer.score(samples, rollout_policy=not on_policy)
        assert all((s.old_logprobs is None) == on_policy and s.ref_logprobs is not None for s in samples)
        trainer.advantages(samples)
        gradients = {}
        stepped = trainer._step

        def step(model, optimizer, schedule):
            gradients.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            return stepped(model, optimizer, schedule)

        trainer._step = step
        results.append((trainer.update(samples, on_policy=on_policy), gradients, weights(trainer.policy)))
    (separate, separate_grads, separate_after), (shortcut, shortcut_grads, shortcut_after) = results
    for name in ("pg_loss", "kl", "entropy", "grad_norm"):
        assert shortcut[name] == pytest.approx(separate[name], rel=1e-5, abs=1e-7), name
    assert shortcut["clip_frac"] == shortcut["approx_kl"] == 0.0  # ratio exactly 1
    assert separate["approx_kl"] < 1e-10
    assert separate_grads.keys() == shortcut_grads.keys() and any(g.abs().sum() > 0 for g in shortcut_grads.values())
    for name, gradient in separate_grads.items():
        assert torch.allclose(shortcut_grads[name], gradient, atol=1e-7, rtol=1e-4), name
        assert torch.allclose(shortcut_after[name], separate_after[name], atol=1e-7), name


def test_an_on_policy_update_is_refused_where_it_would_not_be_exact(tmp_path, tiny_causal_lm_dir):
    trainer = RLTrainer(config(tmp_path, tiny_causal_lm_dir, ppo_epochs=2), FakeClient(), ROWS)
    with pytest.raises(ValueError, match="an on-policy update needs one epoch"):
        trainer.update([Sample([1], [2], [1], group=0)], on_policy=True)


# -------------------------------------------------------------- report_to: TensorBoard / W&B of the agent's trainers


@pytest.fixture
def fake_loggers(monkeypatch):
    """TensorBoard and W&B 'installed' as recording fakes; returns (writers made, W&B runs started)."""
    import sys
    import types

    import agentic_retriever.base.curves as curves

    writers, runs = [], []
    tensorboard = types.ModuleType("torch.utils.tensorboard")
    tensorboard.SummaryWriter = lambda *args, **kwargs: RecordingSummaryWriter(writers, *args, **kwargs)
    wandb = types.ModuleType("wandb")

    def init(**kwargs):
        run = SimpleNamespace(kwargs=kwargs, logged=[], finished=False)
        run.log = lambda data, step=None: run.logged.append((data, step))
        run.finish = lambda: setattr(run, "finished", True)
        runs.append(run)
        return run

    wandb.init = init
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", tensorboard)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setattr(curves, "integration_installed", lambda name: name in ("tensorboard", "wandb"))
    monkeypatch.setattr("transformers.integrations.integration_utils.is_tensorboard_available", lambda: True)
    return writers, runs


@pytest.mark.slow
def test_rl_steps_log_their_metrics_to_tensorboard_and_wandb(tmp_path, tiny_causal_lm_dir, fake_loggers):
    writers, runs = fake_loggers
    trainer = RLTrainer(config(tmp_path, tiny_causal_lm_dir, steps=2, report_to=["tensorboard", "wandb"]),
                        FakeClient(), ROWS, reward_fn=lambda r, gold: float(len(r.response_ids) % 3))
    trainer.train()
    (writer,), (run,) = writers, runs
    assert writer.log_dir == str(tmp_path / "run" / "logs") and writer.purge_step == 1 and writer.closed
    history = trainer.state.history
    for step, metrics in enumerate(history, start=1):
        logged = {tag: value for tag, value, at in writer.scalars if at == step}
        assert logged["train/reward"] == pytest.approx(metrics["reward"])
        assert {f"train/{name}" for name in metrics if name != "step"} == set(logged)  # every scalar, no "step"
        assert run.logged[step - 1] == (logged, step)  # W&B gets the same scalars at the same step
    assert run.kwargs["dir"] == str(tmp_path / "run" / "logs") and run.kwargs["config"]["steps"] == 2
    assert run.kwargs["project"] == "agentic-retriever" and run.finished
    assert [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").open()] == [1, 2]  # as before


def test_rl_without_the_asked_for_package_names_it_before_loading_models(tmp_path, tiny_causal_lm_dir, monkeypatch):
    import agentic_retriever.base.curves as curves

    monkeypatch.setattr(curves, "integration_installed", lambda name: False)
    monkeypatch.setattr("agent.rl.trainer.load_policy", lambda *a, **k: pytest.fail("loaded the policy first"))
    with pytest.raises(ImportError, match=r"report_to wandb needs the wandb package: pip install 'agentic-retriever\[wandb\]'"):
        RLTrainer(config(tmp_path, tiny_causal_lm_dir, report_to=["wandb"]), FakeClient(), ROWS)
    with pytest.raises(ImportError, match=r"pip install 'agentic-retriever\[tensorboard\]'"):
        RLTrainer(config(tmp_path, tiny_causal_lm_dir, report_to=["tensorboard"]), FakeClient(), ROWS)


def test_the_warm_start_hands_report_to_to_the_hf_trainer_with_logs_beside_the_model(tmp_path, tiny_causal_lm_dir,
                                                                                    fake_loggers):
    from agent.sft.train import SFTConfig, SFTExample, train_sft

    writers, _ = fake_loggers
    examples = [SFTExample(str(i), "Q?\n", [(f"<answer> {i} </answer>", True)]) for i in range(2)]
    out = train_sft(SFTConfig(epochs=1, batch_size=1, logging_steps=1, report_to=["tensorboard"]),
                    LLMConfig(model=tiny_causal_lm_dir), examples, tmp_path / "agent")
    (writer,) = writers
    assert writer.log_dir == str(tmp_path / "agent.logs") and writer.closed
    assert json.loads(writer.texts["args"])["report_to"] == ["tensorboard"]  # the TrainingArguments it was given
    assert sorted(step for tag, _, step in writer.scalars if tag == "train/loss") == [1, 2]
    manifest = json.loads((out / "sft_manifest.json").read_text())
    assert manifest["report_to"] == ["tensorboard"] and (out / "metrics.jsonl").is_file()
