"""The co-training loop's agent step on verl (agent/rl/verl/): the run folder, its overrides, the
validation slice, the paper's budgets, the hermes tool path, the reward file and the checkpoint pickup.

The overrides are checked against verl 0.9.1's own config: Hydra's compose API composes ``ppo_trainer`` from the
installed package's ``verl/trainer/config`` folder (found with `importlib.util.find_spec`, which does not run
``verl/__init__.py`` and so needs none of verl's heavy dependencies; `make setup` installs verl with ``--no-deps``)
with our overrides; Hydra refuses a key verl does not define, so composing proves every name, and the composed
values are compared with ours. Without verl or hydra-core installed those tests skip, saying which is missing.
verl's agent-loop machinery running our loop: tests/agent/rl/verl/test_verl_agent_loop.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pyarrow.parquet as pq
import pytest
import yaml

from agent.dialects import SearchR1Dialect
from agent.env import EnvConfig
from agent.rl.config import RLConfig, SecondStage
from agent.rl.verl.validate import compose_verl_config
from agentic_retriever.base.client import API_KEY_ENV, HttpRetrievalClient
from agent.rl.verl import (AGENT_LOOP_NAME, REWARD_FILE, TOOL_AGENT_LOOP_NAME, SearchTool, VerlRun, VerlSettings,
                                         prepare_verl_run, start_verl_run, wait_for_checkpoint)

URL = "http://127.0.0.1:8123"
TRAIN = [("q1", "capital of France", ["Paris"]), ("q2", "who wrote Hamlet?", ["Shakespeare", "W. Shakespeare"]),
         ("q3", "largest planet", ["Jupiter"]), ("q4", "Largest planet?", ["Jupiter"])]


def _qa(path: Path, rows: list[tuple[str, str, list[str]]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": a}) + "\n" for i, q, a in rows))
    return path


def _rl() -> RLConfig:
    return RLConfig(qa="unused.jsonl", algorithm="ppo", steps=7, prompts_per_step=2, samples_per_prompt=1,
                    mini_batch_size=2, micro_batch_size=2, actor_lr=3e-6, critic_lr=2e-5, kl_coef=0.002,
                    gamma=0.99, lam=0.95, reward="search_r1_format", reward_options={"lambda_f": 0.4})


def _settings(**settings) -> VerlSettings:
    """Two GPUs: `_rl`'s step, mini-batch and micro-batch of 2 sequences are 1 per GPU."""
    return VerlSettings(**{"n_gpus_per_node": 2} | settings)


@pytest.fixture
def run(tmp_path) -> VerlRun:
    settings = _settings(val_questions=1, overrides=["trainer.val_before_train=false"])
    return prepare_verl_run(tmp_path / "verl", settings, _rl(), URL, "/models/agent_0", _qa(tmp_path / "train.jsonl", TRAIN))


def _compose(overrides: list[str]):
    if importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed (make setup installs verl==0.9.1 with --no-deps)")
    pytest.importorskip("hydra", reason="hydra-core is not installed (the dev extra has it)")
    return compose_verl_config(overrides)


def test_overrides_compose_with_verls_own_ppo_trainer_config(run):
    overrides = (run.out_dir / "overrides.txt").read_text().splitlines()
    assert run.command[-len(overrides):] == overrides and run.command[:3] == [sys.executable, "-m", "verl.trainer.main_ppo"]
    config = _compose(overrides)
    actor = config.actor_rollout_ref.actor
    assert (actor.optim.lr, config.critic.optim.lr) == (3e-6, 2e-5)
    assert (config.algorithm.adv_estimator, config.algorithm.gamma, config.algorithm.lam) == ("gae", 0.99, 0.95)
    assert config.algorithm.use_kl_in_reward and config.algorithm.kl_ctrl.kl_coef == 0.002
    assert config.algorithm.kl_penalty == "k1" and not actor.use_kl_loss
    assert (config.data.train_batch_size, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu) == (2, 2, 1)
    reward = config.reward.custom_reward_function
    assert (reward.path, reward.name) == (str(REWARD_FILE), "compute_score")
    assert dict(reward.reward_kwargs) == {"reward": "search_r1_format", "lambda_f": 0.4}
    assert config.actor_rollout_ref.model.path == "/models/agent_0"
    agent = config.actor_rollout_ref.rollout.agent  # our agent loop, not verl's hermes tool loop
    assert agent.default_agent_loop == AGENT_LOOP_NAME
    assert agent.agent_loop_config_path == str(run.out_dir / "agent_loop.yaml")
    assert config.actor_rollout_ref.rollout.multi_turn.tool_config_path is None
    assert "hf_model" in actor.checkpoint.save_contents
    assert config.trainer.default_local_dir == str(run.checkpoint_root)
    assert config.trainer.total_training_steps == 7 and config.trainer.val_before_train is False  # extra, last
    assert {"trainer.use_v1=true", "trainer.v1.trainer_mode=sync"} <= set(overrides)  # pinned, not verl's default
    assert config.data.train_files == str(run.out_dir / "train.parquet")
    assert config.data.val_files == str(run.out_dir / "val.parquet")


def test_parquet_rows_hold_the_fields_verl_reads_and_name_our_agent_loop(run):
    rows = pq.read_table(run.out_dir / "train.parquet").to_pylist() + pq.read_table(run.out_dir / "val.parquet").to_pylist()
    hamlet = next(row for row in rows if row["extra_info"]["id"] == "q2")
    assert hamlet["prompt"] == [{"role": "user", "content": SearchR1Dialect().build_prompt("who wrote Hamlet?")}]
    assert hamlet["reward_model"] == {"style": "rule", "ground_truth": {"target": ["Shakespeare", "W. Shakespeare"]}}
    assert hamlet["extra_info"]["question"] == "who wrote Hamlet?" and "tools_kwargs" not in hamlet["extra_info"]
    assert {row["agent_name"] for row in rows} == {AGENT_LOOP_NAME} and all(row["data_source"] for row in rows)
    loop = yaml.safe_load((run.out_dir / "agent_loop.yaml").read_text())
    assert loop == [{"name": AGENT_LOOP_NAME, "_target_": "agent.rl.verl.agent_loop.DialectAgentLoop",
                     "_convert_": "all", "retrieval_service_url": URL, "timeout": 60.0,
                     "env": {"dialect": "search_r1", "max_turns": 4, "topk": 3, "max_new_tokens_per_turn": 512,
                             "observation_max_tokens": 500, "max_context_tokens": 4096}},
                    {"name": TOOL_AGENT_LOOP_NAME, "_target_": "agent.rl.verl.agent_loop.SearchToolAgentLoop"}]


def test_validation_holds_out_training_questions_whole(run):
    train = pq.read_table(run.out_dir / "train.parquet").to_pylist()
    val = pq.read_table(run.out_dir / "val.parquet").to_pylist()
    assert len(train) + len(val) == len(TRAIN) and {row["extra_info"]["split"] for row in val} == {"heldout"}
    val_ids = {row["extra_info"]["id"] for row in val}
    assert val_ids in ({"q1"}, {"q2"}, {"q3", "q4"})  # "largest planet" and "Largest planet?" go together
    assert not val_ids & {row["extra_info"]["id"] for row in train}


def _fake_checkpoint(root: Path, step: int, weights: bool = True) -> Path:
    folder = root / f"global_step_{step}" / "actor" / "huggingface"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if weights:
        (folder / "model.safetensors").write_bytes(b"w")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


def test_the_loops_verl_step_validates_on_training_questions_not_on_the_dev_set(tmp_path):
    """The loop's agent step on verl (`steps.train_agent_on_verl`, as the runner calls it) with a dev set in
    loop.eval: verl's validation rows come from agent_train.qa, none from the dev set."""
    from agentic_retriever.app.loop.config import LoopConfig, LoopEvalConfig, LoopJob
    from agentic_retriever.app.loop.steps import train_agent_on_verl

    rows = TRAIN + [("q5", "tallest mountain", ["Everest"]), ("q6", "fastest animal", ["cheetah"])]
    train = _qa(tmp_path / "train.jsonl", rows)
    dev = _qa(tmp_path / "dev.jsonl", [("d1", "Who painted the Mona Lisa?", ["Leonardo da Vinci"])])
    settings = _settings(val_questions=2, poll_seconds=0.01, timeout_seconds=5)
    job = LoopJob(loop=LoopConfig(verl=settings, eval=LoopEvalConfig(agent_qa=str(dev))),
                  agent_train=dataclasses.replace(_rl(), qa=str(train)), rollout=None, mine=None, train=None, index=None)
    _fake_checkpoint(tmp_path / "agent" / "checkpoints", 7)
    summary = train_agent_on_verl(job, "/models/agent_0", URL, tmp_path / "agent")
    val = pq.read_table(tmp_path / "agent" / "val.parquet").to_pylist()
    assert summary["trainer"] == "verl" and len(val) >= 2
    assert {row["extra_info"]["id"] for row in val} <= {qid for qid, _, _ in rows}


@pytest.mark.parametrize("change, refused", [
    ({"reward": "s3_gbr"}, "reward=s3_gbr"),
    ({"stage2": SecondStage(reward="qagent_stage2", after_step=3)}, "stage2.reward=qagent_stage2"),
    ({"env": EnvConfig(max_new_tokens_per_turn=4000)}, "max_new_tokens_per_turn=4000"),
])
def test_settings_verl_cannot_run_are_refused_by_name_before_anything_is_written(tmp_path, change, refused):
    with pytest.raises(ValueError, match=re.escape(refused)):
        prepare_verl_run(tmp_path / "verl", _settings(), dataclasses.replace(_rl(), **change), URL, "/m",
                         _qa(tmp_path / "train.jsonl", TRAIN))
    assert not (tmp_path / "verl").exists()


def test_the_tool_loop_refuses_a_dialect_other_than_search_r1(tmp_path):
    with pytest.raises(ValueError, match="env.dialect=qagent with agent_loop tool_agent"):
        prepare_verl_run(tmp_path / "verl", _settings(agent_loop="tool_agent"),
                         dataclasses.replace(_rl(), env=EnvConfig(dialect="qagent")), URL, "/m",
                         _qa(tmp_path / "train.jsonl", TRAIN))


def test_the_tool_loop_writes_verls_tool_config_and_the_question_for_create(tmp_path):
    tool_run = prepare_verl_run(tmp_path / "verl", _settings(agent_loop="tool_agent", val_questions=1), _rl(), URL,
                                "/m", _qa(tmp_path / "train.jsonl", TRAIN))
    config = _compose((tool_run.out_dir / "overrides.txt").read_text().splitlines())
    turn = config.actor_rollout_ref.rollout.multi_turn
    agent = config.actor_rollout_ref.rollout.agent  # verl's tool loop as ours (a failed search fails the trajectory)
    assert agent.default_agent_loop == TOOL_AGENT_LOOP_NAME and turn.format == "hermes"
    assert agent.agent_loop_config_path == str(tool_run.out_dir / "agent_loop.yaml")
    assert turn.tool_config_path == str(tool_run.out_dir / "search_tool.yaml") and turn.max_user_turns == 4
    row = pq.read_table(tool_run.out_dir / "train.parquet").to_pylist()[0]
    assert row["agent_name"] == TOOL_AGENT_LOOP_NAME and "<search>" not in row["prompt"][0]["content"]
    assert row["extra_info"]["tools_kwargs"] == {"search": {"create_kwargs": {"question": row["extra_info"]["question"]}}}


@pytest.mark.parametrize("key", ["", "s3cret-key"])
def test_the_services_key_reaches_both_config_files_readable_by_their_owner_alone(tmp_path, monkeypatch, key):
    """verl's workers on other nodes do not inherit the loop's environment: the key travels in the files, which
    no other user may read; without a key the files carry none and keep the umask's mode."""
    monkeypatch.setenv(API_KEY_ENV, key)
    tool_run = prepare_verl_run(tmp_path / "verl", _settings(agent_loop="tool_agent", val_questions=1), _rl(), URL,
                                "/m", _qa(tmp_path / "train.jsonl", TRAIN))
    tool = tool_run.out_dir / "search_tool.yaml"
    loops = tool_run.out_dir / "agent_loop.yaml"
    assert yaml.safe_load(tool.read_text())["tools"][0]["config"].get("api_key") == (key or None)
    assert yaml.safe_load(loops.read_text())[0].get("api_key") == (key or None)
    umask = os.umask(0)
    os.umask(umask)
    assert {path.stat().st_mode & 0o777 for path in (tool, loops)} == {0o600 if key else 0o666 & ~umask}
    if key:
        module, _, name = yaml.safe_load(tool.read_text())["tools"][0]["class_name"].rpartition(".")
        tool_class = getattr(importlib.import_module(module), name)
        config = yaml.safe_load(tool.read_text())["tools"][0]["config"]
        monkeypatch.delenv(API_KEY_ENV)  # a worker on another node
        assert tool_class(config, SimpleNamespace(function=SimpleNamespace(name="search")))._client._http.headers[
            "X-API-Key"] == key


def test_search_tool_yaml_points_at_the_service_and_the_tool_speaks_its_api(tmp_path):
    pytest.importorskip("verl.tools.schemas", reason="verl's tool schemas do not import")
    tool_run = prepare_verl_run(tmp_path / "verl", _settings(agent_loop="tool_agent", val_questions=1), _rl(), URL,
                                "/m", _qa(tmp_path / "train.jsonl", TRAIN))
    tool_config = yaml.safe_load((tool_run.out_dir / "search_tool.yaml").read_text())["tools"][0]
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

    async def one_call() -> str:  # as verl's ToolAgentLoop._call_tool calls it
        instance, _ = await tool.create(create_kwargs={"question": "What is the capital of France?"})
        try:
            response, _, _ = await tool.execute(instance, {"query_list": ["capital"]}, agent_data=None)
        finally:
            await tool.release(instance)
        return response.text

    assert "Paris" in asyncio.run(one_call())
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
    """The fixture `run` wrote tmp_path/train.jsonl; a fake launcher records the argv the script gives it."""
    dump = "import json, sys; json.dump(sys.argv[1:], open('argv.json', 'w'))"
    settings = _settings(launcher=f"{sys.executable} -c {shlex.quote(dump)}", val_questions=1,
                            overrides=["trainer.val_before_train=false"])
    fake = prepare_verl_run(tmp_path / "shell", settings, _rl(), URL, "/models/agent 0's copy", tmp_path / "train.jsonl")
    assert fake.launch_script.stat().st_mode & 0o111
    subprocess.run([str(fake.launch_script)], check=True, cwd=tmp_path)
    argv = json.loads((fake.out_dir / "argv.json").read_text())
    assert argv == ["-m", "verl.trainer.main_ppo", *(fake.out_dir / "overrides.txt").read_text().splitlines()]
    assert "actor_rollout_ref.model.path='/models/agent 0\\'s copy'" in argv


def test_the_verl_steps_reward_curve_is_read_from_verls_console_lines(tmp_path):
    """verl 0.9.1's trainer logs each step behind Ray's coloured actor prefix, numpy scalars as np.float64(...); a
    resumed run logs a step again (the later line wins). The loop's report plots this curve for a verl step."""
    from agent.rl.verl.console import reward_curve, step_metrics

    prefix = "\x1b[36m(TaskRunnerV1 pid=17411)\x1b[0m "
    log = tmp_path / "verl.log"
    log.write_text(
        f"{prefix}step:1 - actor/pg_loss:0.039 - critic/score/mean:0.125 - num_turns/mean:np.float64(5.5) - "
        "timing_s/step:195.1\n"
        f"{prefix}INFO: saving checkpoint\n"
        f"{prefix}step:2 - critic/score/mean:0.0 - training/rollout_probs_diff_mean:0.0073\n"
        f"{prefix}step:2 - critic/score/mean:0.25 - training/rollout_probs_diff_mean:0.0084\n")
    first = step_metrics(log.read_text())[0]
    assert first == {"step": 1.0, "actor/pg_loss": 0.039, "critic/score/mean": 0.125, "num_turns/mean": 5.5,
                     "timing_s/step": 195.1}
    assert reward_curve(log) == [0.125, 0.25] and reward_curve(tmp_path / "missing.log") == []


def test_a_stand_in_run_without_the_trainer_that_stands_in_is_refused_before_anything_is_written(tmp_path):
    from agent.rl.verl import run_verl_job

    train = _qa(tmp_path / "train.jsonl", TRAIN)
    with pytest.raises(ValueError, match="verl.stand_in trains with the embedded trainer"):
        run_verl_job(_settings(stand_in=True), dataclasses.replace(_rl(), qa=str(train)), "/models/agent_0", URL,
                     tmp_path / "agent")
    assert not (tmp_path / "agent").exists()
