"""The co-training loop's agent step on verl (agentic_retriever/loop/verl/).

The overrides are checked against verl 0.9.1's own config: Hydra's compose API composes ``ppo_trainer`` from the
installed package's ``verl/trainer/config`` folder (found with `importlib.util.find_spec`, which does not run
``verl/__init__.py`` and so needs none of verl's heavy dependencies; `make setup` installs verl with ``--no-deps``)
with our overrides; Hydra refuses a key verl does not define, so composing proves every name, and the composed
values are compared with ours. Without verl or hydra-core installed that test skips, saying which is missing.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pyarrow.parquet as pq
import pytest
import yaml

from agent.rl.config import RLConfig
from agentic_retriever.client import HttpRetrievalClient
from agentic_retriever.loop.verl import (REWARD_FILE, SearchTool, VerlRun, VerlSettings, prepare_verl_run,
                                         start_verl_run, wait_for_checkpoint)

URL = "http://127.0.0.1:8123"


def _qa(path: Path, rows: list[tuple[str, str, list[str]]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": a}) + "\n" for i, q, a in rows))
    return path


def _rl() -> RLConfig:
    return RLConfig(qa="unused.jsonl", algorithm="ppo", steps=7, prompts_per_step=16, samples_per_prompt=1,
                    mini_batch_size=8, micro_batch_size=2, actor_lr=3e-6, critic_lr=2e-5, kl_coef=0.002,
                    gamma=0.99, lam=0.95, reward="search_r1_format", reward_options={"lambda_f": 0.4})


@pytest.fixture
def run(tmp_path) -> VerlRun:
    train = _qa(tmp_path / "train.jsonl", [("q1", "capital of France", ["Paris"]), ("q2", "who wrote Hamlet?",
                                                                                     ["Shakespeare", "W. Shakespeare"])])
    val = _qa(tmp_path / "val.jsonl", [("v1", "largest planet", ["Jupiter"])])
    return prepare_verl_run(tmp_path / "verl", VerlSettings(overrides=["trainer.val_before_train=false"]), _rl(),
                            URL, "/models/agent_0", train, val)


def _verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (make setup installs verl==0.9.1 with --no-deps)")
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


def test_overrides_compose_with_verls_own_ppo_trainer_config(run):
    hydra = pytest.importorskip("hydra", reason="hydra-core is not installed (the dev extra has it)")
    overrides = (run.out_dir / "overrides.txt").read_text().splitlines()
    assert run.command[-len(overrides):] == overrides and run.command[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    with hydra.initialize_config_dir(config_dir=str(_verl_config_dir()), version_base=None):
        config = hydra.compose("ppo_trainer", overrides=overrides)
    actor = config.actor_rollout_ref.actor
    assert (actor.optim.lr, config.critic.optim.lr) == (3e-6, 2e-5)
    assert (config.algorithm.adv_estimator, config.algorithm.gamma, config.algorithm.lam) == ("gae", 0.99, 0.95)
    assert config.algorithm.use_kl_in_reward and config.algorithm.kl_ctrl.kl_coef == 0.002
    assert config.algorithm.kl_penalty == "k1" and not actor.use_kl_loss
    assert (config.data.train_batch_size, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu) == (16, 8, 2)
    reward = config.reward.custom_reward_function
    assert (reward.path, reward.name) == (str(REWARD_FILE), "compute_score")
    assert dict(reward.reward_kwargs) == {"reward": "search_r1_format", "lambda_f": 0.4}
    assert config.actor_rollout_ref.model.path == "/models/agent_0"
    turn = config.actor_rollout_ref.rollout.multi_turn
    assert turn.enable and turn.tool_config_path == str(run.out_dir / "search_tool.yaml")
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent"
    assert "hf_model" in actor.checkpoint.save_contents
    assert config.trainer.default_local_dir == str(run.checkpoint_root)
    assert config.trainer.total_training_steps == 7 and config.trainer.val_before_train is False  # extra, last
    assert config.data.train_files == str(run.out_dir / "train.parquet")


def test_parquet_rows_hold_the_fields_verl_reads(run):
    rows = pq.read_table(run.out_dir / "train.parquet").to_pylist()
    assert len(rows) == 2
    second = rows[1]
    assert second["prompt"][0]["role"] == "user"
    assert second["prompt"][0]["content"].startswith("Answer the given question.")
    assert second["prompt"][0]["content"].endswith("Question: who wrote Hamlet?\n")
    assert second["reward_model"] == {"style": "rule", "ground_truth": {"target": ["Shakespeare", "W. Shakespeare"]}}
    assert second["data_source"] and second["agent_name"] == "tool_agent"
    assert second["extra_info"]["index"] == 1 and second["extra_info"]["tools_kwargs"]["search"]["create_kwargs"]
    assert pq.read_table(run.out_dir / "val.parquet").to_pylist()[0]["extra_info"]["split"] == "test"


def test_search_tool_yaml_points_at_the_service_and_the_tool_speaks_its_api(run):
    tool_config = yaml.safe_load((run.out_dir / "search_tool.yaml").read_text())["tools"][0]
    assert tool_config["config"]["retrieval_service_url"] == URL and tool_config["config"]["topk"] == 3
    module, _, name = tool_config["class_name"].rpartition(".")
    tool_class = getattr(importlib.import_module(module), name)
    seen = []

    def service(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"result": [[{"document": {"id": "7", "contents": '"Paris"\nCapital.'},
                                                      "score": 0.9}]]})

    tool = tool_class(tool_config["config"], SimpleNamespace(function=SimpleNamespace(name="search")))
    tool._client = HttpRetrievalClient(URL, transport=httpx.MockTransport(service))
    assert isinstance(tool, SearchTool)
    assert tool.search(["capital of France"]) == '\n\n<information>Doc 1(Title: "Paris") Capital.</information>\n\n'
    assert seen == [("/retrieve", {"queries": ["capital of France"], "topk": 3, "return_scores": True})]
    tool._questions["row-1"] = "What is the capital of France?"   # what create() keeps from the row's create_kwargs
    assert "Paris" in tool.search(["capital"], tool._questions["row-1"])
    assert seen[-1][1]["questions"] == ["What is the capital of France?"]


def test_reward_file_loads_by_path_as_verl_loads_it_and_scores(run):
    lines = (run.out_dir / "overrides.txt").read_text().splitlines()
    path = next(line.split("=", 1)[1] for line in lines if line.startswith("reward.custom_reward_function.path="))
    spec = importlib.util.spec_from_file_location("custom_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    score = module.compute_score
    kwargs = {"reward": "search_r1_em"}
    truth = pq.read_table(run.out_dir / "train.parquet").to_pylist()[0]["reward_model"]["ground_truth"]
    right = score(data_source="x", solution_str="<think> a </think><answer> Paris </answer>", ground_truth=truth,
                  extra_info={}, **kwargs)
    wrong = score(data_source="x", solution_str="<think> a </think><answer> Lyon </answer>", ground_truth=truth,
                  extra_info={}, **kwargs)
    assert (right, wrong) == (1.0, 0.0)


def _fake_checkpoint(root: Path, step: int, weights: bool = True) -> Path:
    folder = root / f"global_step_{step}" / "actor" / "huggingface"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if weights:
        (folder / "model.safetensors").write_bytes(b"w")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


def test_wait_returns_the_hf_folder_of_the_finished_final_checkpoint(run):
    folder = _fake_checkpoint(run.checkpoint_root, run.final_step)
    assert wait_for_checkpoint(run, VerlSettings(poll_seconds=0.01, timeout_seconds=1)) == folder


def test_wait_times_out_naming_the_folder_and_command_on_an_incomplete_checkpoint(run):
    _fake_checkpoint(run.checkpoint_root, run.final_step, weights=False)
    with pytest.raises(TimeoutError, match="global_step_7") as error:
        wait_for_checkpoint(run, VerlSettings(poll_seconds=0.01, timeout_seconds=0.05))
    assert str(run.checkpoint_root) in str(error.value) and f"bash {run.launch_script}" in str(error.value)


def test_wait_fails_fast_with_the_log_tail_when_the_launched_command_exits_1(run):
    run.launch_script.write_text("echo loading model\necho 'CUDA out of memory' >&2\nexit 1\n")
    process = start_verl_run(run)
    with pytest.raises(RuntimeError, match="status 1") as error:
        wait_for_checkpoint(run, VerlSettings(poll_seconds=0.01, timeout_seconds=30), process)
    assert "CUDA out of memory" in str(error.value) and str(run.log_path) in str(error.value)


def test_launch_script_passes_every_override_through_the_shell_unchanged(tmp_path, run):
    """The fixture `run` wrote tmp_path/{train,val}.jsonl; a fake launcher records the argv the script gives it."""
    dump = "import json, sys; json.dump(sys.argv[1:], open('argv.json', 'w'))"
    settings = VerlSettings(launcher=f"{sys.executable} -c {shlex.quote(dump)}", overrides=["trainer.val_before_train=false"])
    fake = prepare_verl_run(tmp_path / "shell", settings, _rl(), URL, "/models/agent 0's copy",
                            tmp_path / "train.jsonl", tmp_path / "val.jsonl")
    assert fake.launch_script.stat().st_mode & 0o111
    subprocess.run([str(fake.launch_script)], check=True, cwd=tmp_path)
    argv = json.loads((fake.out_dir / "argv.json").read_text())
    assert argv == ["-m", "verl.trainer.main_ppo", *(fake.out_dir / "overrides.txt").read_text().splitlines()]
    assert "actor_rollout_ref.model.path='/models/agent 0\\'s copy'" in argv
