"""The paper config's agent step on verl (configs/agentic_r_loop.yaml, ``loop.agent_trainer: verl``) against the
paper, Search-R1's own PPO script and verl 0.9.1's own checks.

Sources of the table below: "Agentic-R: Learning to Retrieve for Agentic Search" (arXiv 2601.11888), Appendix B
("paper"), and Search-R1's ``train_ppo.sh`` (github.com/PeterGriffinJin/Search-R1, ``train_ppo.sh`` at the
repository root, with the defaults of its vendored ``verl/trainer/config/ppo_trainer.yaml`` and
``verl/workers/fsdp_workers.py``; "sh"). Search-R1's verl divided the micro-batch sizes it was given over the GPUs
(``fsdp_workers.py``: ``ppo_micro_batch_size //= world_size``); verl 0.9 takes them per GPU. Every remaining
difference is in docs/paper-deviations.md. verl's ``validate_config`` is the one ``verl.trainer.main_ppo`` calls
before it starts anything; Hydra composes the config from the installed verl's own files (as
tests/agent/rl/verl/test_verl.py).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.rl.config import RLConfig
from agent.rl.verl import AGENT_LOOP_NAME, TOOL_AGENT_LOOP_NAME, VerlSettings, prepare_verl_run
from agent.rl.verl.validate import validate_verl_run
from agentic_retriever.app.config_loader import build_config
from agentic_retriever.app.loop.config import LoopConfig
from tests.agent.rl.verl.test_verl import URL, _compose

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
ACTOR, REF, ROLLOUT = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"

#: verl key -> the value the paper config must give it. Comment: where the value comes from.
PAPER_VALUES = {
    "data.train_batch_size": 512,                               # paper: "total batch size is 512"; sh: 512
    f"{ACTOR}.ppo_mini_batch_size": 256,                        # paper: "mini-batch size of 256"; sh: 256
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": 8,                 # paper: micro-batch 64; sh: 64 over 8 GPUs
    f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu": 16,         # sh: rollout.log_prob_micro_batch_size=128 over 8
    f"{REF}.log_prob_micro_batch_size_per_gpu": 16,             # sh: ref.log_prob_micro_batch_size=128 over 8
    "critic.ppo_micro_batch_size_per_gpu": 1,                   # sh: critic.ppo_micro_batch_size=8 over 8
    f"{ACTOR}.ppo_epochs": 1,                                   # sh: ppo_trainer.yaml ppo_epochs 1
    f"{ACTOR}.optim.lr": 1e-6,                                  # paper: 1e-6 for the policy; sh: 1e-6
    "critic.optim.lr": 1e-5,                                    # paper: 1e-5 for the value model; sh: 1e-5
    f"{ACTOR}.optim.lr_warmup_steps_ratio": 0.285,              # sh: actor lr_warmup_steps_ratio=0.285
    "critic.optim.lr_warmup_steps_ratio": 0.015,                # sh: critic lr_warmup_steps_ratio=0.015
    f"{ACTOR}.optim.weight_decay": 0.01,                        # sh: fsdp_workers.py AdamW weight_decay 1e-2
    "critic.optim.weight_decay": 0.01,                          # sh: fsdp_workers.py AdamW weight_decay 1e-2
    f"{ACTOR}.fsdp_config.param_offload": True,                 # paper: "FSDP with CPU offloading"; sh: true
    f"{ACTOR}.fsdp_config.optimizer_offload": True,             # sh: actor optimizer_offload=true
    f"{REF}.fsdp_config.param_offload": True,                   # sh: ref param_offload=True
    "critic.fsdp.param_offload": True,                          # sh: critic param_offload=true (grads with them)
    "critic.fsdp.optimizer_offload": True,                      # sh: critic optimizer_offload=true
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,  # paper: gradient checkpointing; sh: true
    "critic.model.enable_gradient_checkpointing": True,         # sh: critic enable_gradient_checkpointing=true
    "algorithm.adv_estimator": "gae",                           # paper: PPO with GAE; sh: gae
    "algorithm.gamma": 1.0,                                     # paper: gamma = 1
    "algorithm.lam": 1.0,                                       # paper: lambda = 1
    "algorithm.use_kl_in_reward": True,                         # sh: kl_ctrl in the reward, use_kl_loss False
    "algorithm.kl_ctrl.kl_coef": 0.001,                         # sh: kl_coef=0.001
    "algorithm.kl_penalty": "k1",                               # sh: kl_penalty kl (verl: kl and k1 are one)
    f"{ACTOR}.use_kl_loss": False,                              # sh: use_kl_loss False
    f"{ACTOR}.entropy_coeff": 0.001,                            # sh: ppo_trainer.yaml entropy_coeff 0.001
    f"{ACTOR}.clip_ratio_low": 0.2,                             # sh: clip_ratio 0.2
    f"{ACTOR}.clip_ratio_high": 0.2,                            # sh: clip_ratio 0.2
    "critic.cliprange_value": 0.5,                              # sh: cliprange_value 0.5
    f"{ACTOR}.grad_clip": 1.0,                                  # sh: grad_clip 1.0
    "critic.grad_clip": 1.0,                                    # sh: grad_clip 1.0
    f"{ACTOR}.loss_agg_mode": "token-mean",                     # sh: masked mean over the response tokens
    f"{ROLLOUT}.n": 1,                                          # sh: n_agent=1 (PPO: one sample a question)
    f"{ROLLOUT}.temperature": 1.0,                              # sh: temperature=1
    f"{ROLLOUT}.top_p": 0.95,                                   # sh: ppo_trainer.yaml rollout top_p 0.95
    f"{ROLLOUT}.name": "vllm",                                  # sh: rollout.name=vllm
    f"{ROLLOUT}.tensor_model_parallel_size": 1,                 # sh: tensor_model_parallel_size=1
    f"{ROLLOUT}.gpu_memory_utilization": 0.6,                   # sh: gpu_memory_utilization=0.6
    "trainer.critic_warmup": 0,                                 # sh: critic_warmup=0
    "trainer.n_gpus_per_node": 8,                               # sh: n_gpus_per_node=8
    "trainer.nnodes": 1,                                        # sh: nnodes=1
    "trainer.total_training_steps": 500,                        # paper: 500 steps (sh: 1005; deviations)
    "trainer.save_freq": 50,                                    # paper: every 50 steps (sh: 100; deviations)
    "trainer.use_v1": True,                                     # verl 0.9.1's default trainer, pinned
    "trainer.v1.trainer_mode": "sync",                          # on-policy PPO, as sh
}


def _questions(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"q{i}", "question": f"question number {i}?", "golden_answers": ["a"]})
                            + "\n" for i in range(count)))
    return path


def _config_run(tmp_path: Path, config: str, questions: int, model: str = "/models/qwen", **settings):
    """`prepare_verl_run` on a shipped config's ``loop.verl`` and ``agent_train`` sections, with `questions`
    synthetic training questions and the policy `model` (verl's validation reads its config): (the run, verl's
    composed config)."""
    path = CONFIGS / config
    loop, rl = build_config(LoopConfig, "loop", None, str(path)), build_config(RLConfig, "agent_train", None, str(path))
    run = prepare_verl_run(tmp_path / "verl", dataclasses.replace(loop.verl, **settings), rl, URL, model,
                           _questions(tmp_path / "train.jsonl", questions))
    return run, _compose((run.out_dir / "overrides.txt").read_text().splitlines())


def _validate(run) -> dict:
    """verl's own checks, called as ``verl.trainer.main_ppo.main`` calls them (`validate_verl_run`)."""
    pytest.importorskip("ray", reason="ray is not installed (the dev extra has it: verl's trainer imports it)")
    return validate_verl_run(run)


@pytest.fixture(scope="module")
def paper(tmp_path_factory, tiny_causal_lm_dir):
    """The paper config's run on 1,300 questions (2 steps an epoch), a tiny model standing in for Qwen2.5-7B."""
    return _config_run(tmp_path_factory.mktemp("paper"), "agentic_r_loop.yaml", 1300, tiny_causal_lm_dir,
                       val_questions=256)


@pytest.mark.parametrize("key", sorted(PAPER_VALUES))
def test_the_paper_config_gives_verl_the_papers_and_search_r1s_values(paper, key):
    from omegaconf import OmegaConf

    assert OmegaConf.select(paper[1], key) == PAPER_VALUES[key]


def test_the_paper_config_passes_verls_own_validation_at_8_gpus(paper):
    checked = _validate(paper[0])
    assert checked == {"gpus": 8, "train_batch_size": 512, "ppo_mini_batch_size": 256,
                       "ppo_micro_batch_size_per_gpu": 8, "total_training_steps": 500,
                       "total_epochs": checked["total_epochs"], "use_v1": True}


def test_the_paper_config_gives_verl_the_papers_budgets(paper):
    """4,096 tokens in all, at most 500 generated and 500 retrieved per turn (Appendix B), five searches of top 3."""
    run, config = paper
    assert config.data.max_prompt_length + config.data.max_response_length == 4096
    assert config.data.max_response_length >= 3 * (500 + 500)  # room for several searches, not one
    entry, tool_loop = yaml.safe_load((run.out_dir / "agent_loop.yaml").read_text())  # ours, then the tool loop's
    assert entry["name"] == AGENT_LOOP_NAME and tool_loop["name"] == TOOL_AGENT_LOOP_NAME
    assert entry["env"] == {"dialect": "search_r1", "max_turns": 5, "topk": 3, "max_new_tokens_per_turn": 500,
                            "observation_max_tokens": 500, "max_context_tokens": 4096}
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_LOOP_NAME


def test_the_quickstart_sizes_pass_verls_own_validation_on_one_gpu(tmp_path, tiny_causal_lm_dir):
    """configs/loop_quickstart.yaml's agent step (8 questions a step, micro-batch 1) moved to verl on one GPU."""
    run, config = _config_run(tmp_path, "loop_quickstart.yaml", 40, tiny_causal_lm_dir, val_questions=8,
                              n_gpus_per_node=1)
    assert (config.data.train_batch_size, config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu) == (8, 1)
    assert _validate(run)["gpus"] == 1


def test_epochs_let_verls_loop_reach_the_last_step_on_a_small_set(tmp_path):
    """verl's V1 loop stops at ``epoch >= total_epochs`` with ``len(train) // train_batch_size`` steps an epoch,
    counted here by verl's own dataset over the written parquet: 23 questions of 4 a step, 11 steps."""
    pytest.importorskip("ray", reason="ray is not installed (the dev extra has it: verl's package imports it)")
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from tests.fakes import load_smollm2_tokenizer

    rl = RLConfig(qa="unused", algorithm="ppo", steps=11, prompts_per_step=4, samples_per_prompt=1, micro_batch_size=1)
    run = prepare_verl_run(tmp_path / "verl", VerlSettings(n_gpus_per_node=1, val_questions=2), rl, URL, "/m",
                           _questions(tmp_path / "train.jsonl", 25))
    config = _compose((run.out_dir / "overrides.txt").read_text().splitlines())
    tokenizer = load_smollm2_tokenizer()
    dataset = RLHFDataset(data_files=[str(run.out_dir / "train.parquet")], tokenizer=tokenizer, config=config.data)
    per_epoch = len(dataset) // config.data.train_batch_size
    assert (len(dataset), per_epoch) == (23, 5)
    assert config.trainer.total_epochs == run.total_epochs == 3  # 3 x 5 >= 11 > 2 x 5
    assert config.trainer.total_epochs * per_epoch >= config.trainer.total_training_steps == 11


@pytest.mark.parametrize("change, refused", [
    ({"micro_batch_size": 12}, "agent_train.micro_batch_size=12"),
    ({"prompts_per_step": 4, "mini_batch_size": 4}, "agent_train.prompts_per_step x samples_per_prompt=4"),
    ({"mini_batch_size": 64, "micro_batch_size": 128}, "the actor's micro-batch of 16 sequences per GPU does not "
                                                       "divide its mini-batch of 8"),
    ({"warmup_steps": 10}, "warmup_steps=10 with verl.actor_warmup_ratio"),
])
def test_sizes_that_do_not_divide_over_the_gpus_are_refused_by_name(tmp_path, change, refused):
    path = CONFIGS / "agentic_r_loop.yaml"
    loop, rl = build_config(LoopConfig, "loop", None, str(path)), build_config(RLConfig, "agent_train", None, str(path))
    with pytest.raises(ValueError, match=refused.replace("(", r"\(").replace(")", r"\)")):
        prepare_verl_run(tmp_path / "verl", loop.verl, dataclasses.replace(rl, **change), URL, "/m",
                         _questions(tmp_path / "train.jsonl", 4))
    assert not (tmp_path / "verl").exists()


def test_unset_log_prob_and_critic_sizes_fall_back_to_the_global_micro_batch(tmp_path):
    """The log-prob and critic sizes fall back to agent_train.micro_batch_size (64 over 8 GPUs) when unset."""
    _, config = _config_run(tmp_path, "agentic_r_loop.yaml", 1300, val_questions=256, log_prob_micro_batch_size=None,
                            critic_micro_batch_size=None)
    assert config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 8
    assert config.critic.ppo_micro_batch_size_per_gpu == 8


def test_verls_own_entry_point_reads_the_paper_runs_command_as_the_v1_trainer_with_per_gpu_sizes(paper):
    """The run's command through ``verl.trainer.main_ppo`` itself, with Hydra's ``--cfg job`` (print the composed
    config, start nothing): the shell-free argv verl gets from launch.sh parses to the pinned trainer path."""
    pytest.importorskip("ray", reason="ray is not installed (the dev extra has it: verl's package imports it)")
    run, _ = paper
    python, *command = run.command
    assert python == sys.executable and command[:2] == ["-m", "verl.trainer.main_ppo"]  # {python}: the loop's own
    printed = subprocess.run([sys.executable, *command, "--cfg", "job"], capture_output=True, text=True, timeout=300,
                             cwd=run.out_dir)
    assert printed.returncode == 0, printed.stderr[-2000:]
    config = yaml.safe_load(printed.stdout)
    assert config["trainer"]["use_v1"] is True and config["trainer"]["v1"]["trainer_mode"] == "sync"
    assert config["trainer"]["total_epochs"] == run.total_epochs == 250  # 1,044 training rows: 2 steps of 512 an epoch
    assert config["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] == 8


def test_every_agent_of_the_paper_loop_starts_from_the_base_model():
    """Section 5.1: "we initialize the search agent with Qwen2.5-7B-Base"; the release's train_ppo.sh starts actor
    and critic from BASE_MODEL in every iteration (agent_init initial: Agent_i from the initial agent)."""
    loop = build_config(LoopConfig, "loop", None, str(CONFIGS / "agentic_r_loop.yaml"))
    rl = build_config(RLConfig, "agent_train", None, str(CONFIGS / "agentic_r_loop.yaml"))
    assert loop.agent_init == "initial" and rl.agent.model == "Qwen/Qwen2.5-7B"


def test_the_paper_configs_commands_run_with_the_loops_own_interpreter(monkeypatch):
    """torchrun, the 72B scorer's vLLM server and verl's launcher as `{python} -m ...`: with an unactivated venv, PATH's
    `torchrun` or `vllm` belongs to another interpreter or to none."""
    from agentic_retriever.app.loop.processes import step_server_specs
    from agentic_retriever.base.sessions import command_words

    monkeypatch.setattr(sys, "executable", "/opt/loop-venv/bin/python")
    loop = build_config(LoopConfig, "loop", None, str(CONFIGS / "agentic_r_loop.yaml"))
    (scorer,) = step_server_specs(loop.step_servers, ["mining"])
    assert command_words(loop.retriever_launcher)[:3] == ["/opt/loop-venv/bin/python", "-m", "torch.distributed.run"]
    assert command_words(scorer.command)[:3] == ["/opt/loop-venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert command_words(loop.verl.launcher) == ["/opt/loop-venv/bin/python"]


def test_the_paper_run_keeps_one_checkpoint_so_an_iteration_fits_on_disk(tmp_path):
    """verl keeps every save unless told (max_*_ckpt_to_keep null): 10 saves of a 7B actor and critic, about 213 GB
    each, would need 2.1 TB an iteration; keeping one holds two at most (the old one until the new is written)."""
    from agent.rl.verl.disk import checkpoint_disk_bytes, save_count

    run, config = _config_run(tmp_path, "agentic_r_loop.yaml", 1300)
    assert config.trainer.max_actor_ckpt_to_keep == config.trainer.max_critic_ckpt_to_keep == 1
    saves = save_count(run.final_step, config.trainer.save_freq)
    assert saves == 10  # steps 50, 100, ..., 500
    qwen_7b = 7_615_616_512
    assert checkpoint_disk_bytes(qwen_7b, True, saves, keep=None) / 1e12 == pytest.approx(2.13, abs=0.01)
    assert checkpoint_disk_bytes(qwen_7b, True, saves, keep=1) / 1e9 == pytest.approx(426.5, abs=0.5)


def test_save_count_counts_verls_periodic_saves_and_the_last_step():
    from agent.rl.verl.disk import save_count

    assert [save_count(7, 3), save_count(6, 3), save_count(2, 50)] == [3, 2, 1]


def test_parameter_count_reads_the_safetensors_headers(tiny_causal_lm_dir):
    from transformers import AutoModelForCausalLM

    from agent.rl.verl.disk import parameter_count

    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_dir)
    assert parameter_count(tiny_causal_lm_dir) == sum(p.numel() for p in model.parameters())
    assert parameter_count("Qwen/Qwen2.5-7B") is None
