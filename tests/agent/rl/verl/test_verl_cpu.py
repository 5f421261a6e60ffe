"""verl on CPUs (``loop.verl.device: cpu``): the platform plugin registered through verl's own hooks, the one place
that writes a CPU run's environment and overrides, the launch's wall-clock limit and the leftovers it removes.

verl's trainer itself runs in `make verl-check` (benchmarks/checks/verl_check.py, its own venv with vLLM's CPU build); here
the platform is checked in a fresh process of the default venv (verl is installed there with ``--no-deps``), as
verl's workers load it: by importing verl with ``VERL_USE_EXTERNAL_MODULES`` and ``VERL_PLATFORM`` set. No Ray.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.rl.config import RLConfig
from agent.rl.verl import VerlSettings, prepare_verl_run, start_verl_run, wait_for_checkpoint
from agent.rl.verl.cpu import PLATFORM_MODULE, cpu_environment
from agent.rl.verl.leftovers import leftovers, remove_leftovers
from agentic_retriever.base.sessions import stop_session

URL = "http://127.0.0.1:8123"
QUESTIONS = [("q1", "capital of France", ["Paris"]), ("q2", "who wrote Hamlet?", ["Shakespeare"]),
             ("q3", "largest planet", ["Jupiter"])]


def _qa(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": a}) + "\n" for i, q, a in QUESTIONS))
    return path


def _rl(algorithm: str = "ppo") -> RLConfig:
    return RLConfig(qa="unused.jsonl", algorithm=algorithm, steps=2, prompts_per_step=2, samples_per_prompt=2,
                    mini_batch_size=4, micro_batch_size=2)


def _cpu(**settings) -> VerlSettings:
    return VerlSettings(**{"device": "cpu", "n_gpus_per_node": 1, "val_questions": 1} | settings)


def _in_verl_process(code: str, **environment: str) -> dict:
    """Run `code` in a fresh interpreter that imports verl first, with `environment`; its last stdout line as JSON."""
    pytest.importorskip("verl", reason="verl is not installed (make setup installs verl==0.9.1 with --no-deps)")
    env = {key: value for key, value in os.environ.items() if not key.startswith("VERL_")} | environment
    done = subprocess.run([sys.executable, "-c", "import verl\n" + code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_verl_loads_the_cpu_platform_through_its_plugin_hooks_and_runs_its_own_process_group_call():
    """verl's own `initialize_global_process_group_ray` builds the backend ``cpu:gloo,cpu:gloo`` on this platform,
    which torch refuses unless the platform names each device once."""
    code = """
import json, os, torch, torch.distributed
from verl.plugin.platform import get_platform
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device
from verl.utils.distributed import initialize_global_process_group_ray
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
os.environ["DIST_INIT_METHOD"] = "tcp://127.0.0.1:0"
initialize_global_process_group_ray(timeout_second=60)
free, total = get_torch_device().mem_get_info()
tensor = torch.ones(4)
print(json.dumps({"registered": PlatformRegistry.get("cpu").__module__, "platform": type(get_platform()).__name__,
                  "device": get_device_name(), "backend": get_nccl_backend(),
                  "group": torch.distributed.get_backend(), "world": torch.distributed.get_world_size(),
                  "memory": 0 < free <= total,
                  # host memory is the only memory without an accelerator; with one, torch pins as always
                  "pin_memory": (tensor.pin_memory() is tensor) == (not torch.accelerator.is_available())}))
"""
    found = _in_verl_process(code, **cpu_environment(_cpu()))
    assert found == {"registered": PLATFORM_MODULE, "platform": "PlatformCPU", "device": "cpu", "backend": "gloo",
                     "group": "cpu:gloo", "world": 1, "memory": True, "pin_memory": True}


def test_a_process_without_the_cpu_environment_never_registers_the_cpu_platform():
    """GPU runs: verl alone knows nvidia, npu and rocm, and torch's pin_memory is its own."""
    code = """
import json, sys, torch
from verl.plugin.platform.platform_manager import PlatformRegistry
print(json.dumps({"cpu": PlatformRegistry.get("cpu") is not None, "loaded": any("cpu_platform" in m for m in sys.modules),
                  "pin_memory_wrapped": hasattr(torch.Tensor.pin_memory, "_host_only")}))
"""
    assert _in_verl_process(code) == {"cpu": False, "loaded": False, "pin_memory_wrapped": False}


@pytest.mark.parametrize(("backend", "expected"), [
    ("cpu:gloo,cpu:gloo", "cpu:gloo"),          # verl on the cpu platform
    ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"),  # verl on GPUs: untouched
    ("gloo", "gloo"), (None, None)])
def test_a_backend_list_names_each_device_once(backend, expected):
    pytest.importorskip("verl", reason="verl is not installed")
    from agent.rl.verl.cpu_platform import single_device_backend

    assert single_device_backend(backend) == expected


def test_a_backend_list_giving_one_device_two_backends_is_refused():
    pytest.importorskip("verl", reason="verl is not installed")
    from agent.rl.verl.cpu_platform import single_device_backend

    with pytest.raises(ValueError, match="two backends"):
        single_device_backend("cpu:gloo,cpu:mpi")


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_cpu_runs_compose_with_verls_config_and_pass_its_validation(tmp_path, algorithm, tiny_causal_lm_dir):
    """Every CPU override names a key of verl 0.9.1's ppo_trainer (Hydra refuses others) and verl's validate_config
    accepts the run at one Ray GPU label; the critic's settings come only with a critic."""
    pytest.importorskip("hydra", reason="hydra-core is not installed (the dev extra has it)")
    pytest.importorskip("verl", reason="verl is not installed")
    pytest.importorskip("ray", reason="ray is not installed (the dev extra has it: verl's trainer imports it)")
    from agent.rl.verl.validate import compose_verl_config, validate_verl_run

    run = prepare_verl_run(tmp_path / "run", _cpu(), _rl(algorithm), URL, str(tiny_causal_lm_dir),
                           _qa(tmp_path / "qa.jsonl"))
    config = compose_verl_config((run.out_dir / "overrides.txt").read_text().splitlines())
    assert validate_verl_run(run)["gpus"] == 1
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (config.trainer.device, actor.strategy, config.ray_kwargs.ray_init.num_gpus) == ("cpu", "fsdp2", 1)
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert actor.fsdp_config.mixed_precision.reduce_dtype == "fp32"
    assert (rollout.enable_sleep_mode, rollout.enforce_eager, rollout.dtype) == (False, True, "float16")
    assert (rollout.agent.num_workers, config.reward.num_workers, config.data.dataloader_num_workers) == (1, 1, 0)
    assert config.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    if algorithm == "ppo":
        assert (config.critic.strategy, config.critic.fsdp.mixed_precision.reduce_dtype) == ("fsdp2", "fp32")
        assert config.critic.model.override_config.attn_implementation == "sdpa"
    else:
        assert "critic." not in "".join(line for line in (run.out_dir / "overrides.txt").read_text().splitlines()
                                        if "fsdp2" in line or "sdpa" in line)


def test_a_gpu_run_writes_no_cpu_setting(tmp_path):
    run = prepare_verl_run(tmp_path / "run", VerlSettings(n_gpus_per_node=2, val_questions=1), _rl(), URL,
                           "/models/agent", _qa(tmp_path / "qa.jsonl"))
    script, overrides = run.launch_script.read_text(), (run.out_dir / "overrides.txt").read_text()
    assert not any(name in script for name in cpu_environment(_cpu()))
    assert "trainer.device" not in overrides and "fsdp2" not in overrides


def test_the_cpu_launch_exports_the_platform_and_keeps_the_callers_own_plugin_modules(tmp_path):
    dump = "import json, os; json.dump({k: v for k, v in os.environ.items() if k.startswith(('VERL_', 'VLLM_'))}, " \
           "open('env.json', 'w'))"
    settings = _cpu(launcher=f"{sys.executable} -c {shlex.quote(dump)}", cpu_kv_cache_gib=3)
    run = prepare_verl_run(tmp_path / "run", settings, _rl(), URL, "/models/agent", _qa(tmp_path / "qa.jsonl"))
    env = {key: value for key, value in os.environ.items() if not key.startswith("VERL_")}
    subprocess.run([str(run.launch_script)], check=True, env=env | {"VERL_USE_EXTERNAL_MODULES": "my_plugin"})
    seen = json.loads((run.out_dir / "env.json").read_text())
    assert seen == {"VERL_USE_EXTERNAL_MODULES": f"{PLATFORM_MODULE},my_plugin", "VERL_PLATFORM": "cpu",
                    "VERL_ENGINE_DEVICE": "cuda", "VLLM_CPU_KVCACHE_SPACE": "3"}


def test_a_run_past_its_wall_clock_limit_is_stopped_and_fails_the_wait_with_its_log(tmp_path):
    """A hung verl (its weight sync waits forever) must not hold the step for the 7 days the wait allows."""
    hang = "import time; print('weight sync...', flush=True); time.sleep(600)"
    settings = _cpu(launcher=f"{sys.executable} -c {shlex.quote(hang)}", timeout_seconds=3, poll_seconds=0.1)
    run = prepare_verl_run(tmp_path / "run", settings, _rl(), URL, "/models/agent", _qa(tmp_path / "qa.jsonl"))
    started = time.monotonic()
    process = start_verl_run(run)
    with pytest.raises(RuntimeError, match="wall-clock limit") as error:
        wait_for_checkpoint(run, settings, process)
    assert time.monotonic() - started < 60
    assert process.returncode == 124 and "weight sync..." in str(error.value)


def _wait_for_log(run, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (run.log_path.read_text() if run.log_path.exists() else ""):
        assert time.monotonic() < deadline, run.log_path.read_text()
        time.sleep(0.1)


@pytest.mark.parametrize("parent_ignores_sigint", [False, True], ids=["terminal", "sigint-ignored-by-the-parent"])
def test_an_interrupted_launch_passes_the_signal_on_to_verl(tmp_path, parent_ignores_sigint):
    """Ctrl-C reaches verl through launch.sh's trap, also when the loop itself was started ignoring SIGINT (in the
    background of a script), which a shell could not trap if it inherited it."""
    marker = tmp_path / "terminated"
    code = (f"import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w'), "
            "sys.exit(143))); print('training', flush=True); time.sleep(600)")
    settings = _cpu(launcher=f"{sys.executable} -c {shlex.quote(code)}")
    run = prepare_verl_run(tmp_path / "run", settings, _rl(), URL, "/models/agent", _qa(tmp_path / "qa.jsonl"))
    before = signal.signal(signal.SIGINT, signal.SIG_IGN if parent_ignores_sigint else signal.default_int_handler)
    try:
        process = start_verl_run(run)
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        _wait_for_log(run, "training")
        process.send_signal(signal.SIGINT)  # to the script, as a terminal's Ctrl-C
        assert process.wait(timeout=60) != 0 and marker.exists()
    finally:
        stop_session(process, 5)


@pytest.mark.parametrize("delay_s", [0.0, 0.05])
def test_a_signal_in_the_first_moments_of_a_launch_leaves_no_verl_running(tmp_path, delay_s):
    """However early the script is stopped (before its traps, before verl starts, before it knows verl's pid), it
    exits and verl, if started, gets the signal. The caller handles SIGINT, as an interactive loop does (a signal
    that comes before the guard's own handlers is handled as the caller left it)."""
    started = tmp_path / "verl.pid"
    code = (f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); time.sleep(600)")
    settings = _cpu(launcher=f"{sys.executable} -c {shlex.quote(code)}")
    run = prepare_verl_run(tmp_path / "run", settings, _rl(), URL, "/models/agent", _qa(tmp_path / "qa.jsonl"))
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = start_verl_run(run)
    finally:
        signal.signal(signal.SIGINT, handler)
    try:
        time.sleep(delay_s)
        process.send_signal(2)
        assert process.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while started.exists() and _alive(int(started.read_text() or 0)):
            assert time.monotonic() < deadline, "verl outlived its interrupted launch"
            time.sleep(0.1)
    finally:
        stop_session(process, 5)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # the file is created, its pid not yet written
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"


def test_leftovers_are_the_new_segments_no_process_holds(tmp_path):
    old, new, held, weights, other = (tmp_path / name for name in (
        "psm_old", "psm_new", "psm_held", "verl_weights_0a1b", "someone_elses"))
    for path in (old, new, held, weights, other):
        path.write_bytes(b"x" * 10)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 60
    with open(held, "rb"):
        removed = remove_leftovers(since, shm_dir=tmp_path, socket_dirs=())
    assert removed == {new: 10, weights: 10} and all(path.exists() for path in (old, held, other))
    assert leftovers(since, [held], in_use=set()) == [held]  # once nothing holds it, it is a leftover too


def test_leftover_sockets_are_those_no_process_has_bound_any_longer(tmp_path):
    import socket

    folder = tmp_path / "s"
    folder.mkdir()
    bound, closed = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    bound.bind(str(folder / "live.sock"))
    closed.bind(str(folder / "dead.sock"))
    closed.close()  # the file stays, as a ZMQ socket's does when its process dies
    try:
        removed = remove_leftovers(time.time() - 60, shm_dir=tmp_path / "none", socket_dirs=[folder])
        assert list(removed) == [folder / "dead.sock"] and (folder / "live.sock").exists()
    finally:
        bound.close()


def test_verl_lingering_after_its_final_checkpoint_is_stopped_with_every_process_it_started(tmp_path):
    """The next step takes verl's devices: after the checkpoint, verl gets a grace to exit, then it and whatever it
    started (Ray's processes run in its session, in process groups of their own) are stopped."""
    pid_file = tmp_path / "child.pid"
    linger = ("import os, pathlib, subprocess, sys, time; "
              "child = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); time.sleep(600)']); "
              f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); "
              "root = pathlib.Path('checkpoints/global_step_2/actor/huggingface'); root.mkdir(parents=True); "
              "(root / 'config.json').write_text('{}'); (root / 'model.safetensors').write_bytes(b'w'); "
              "pathlib.Path('checkpoints/latest_checkpointed_iteration.txt').write_text('2'); time.sleep(600)")
    settings = _cpu(launcher=f"{sys.executable} -c {shlex.quote(linger)}", poll_seconds=0.1)
    run = prepare_verl_run(tmp_path / "run", settings, _rl(), URL, "/models/agent", _qa(tmp_path / "qa.jsonl"))
    process = start_verl_run(run)
    folder = wait_for_checkpoint(run, settings, process, exit_grace_s=1)
    assert folder == run.checkpoint_root / "global_step_2" / "actor" / "huggingface"
    assert process.returncode is not None
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the process verl started outlived the wait"
        time.sleep(0.1)


def test_a_rerun_refuses_a_verl_still_running_from_before_or_stops_it_on_request(tmp_path):
    """A loop killed while verl ran leaves verl on its devices (its own session); the rerun must not start a second
    verl on the same checkpoint folder beside it."""
    linger = "import time; print('training', flush=True); time.sleep(600)"
    settings = _cpu(launcher=f"{sys.executable} -c {shlex.quote(linger)}")
    run = prepare_verl_run(tmp_path / "run", settings, _rl(), URL, "/models/agent", _qa(tmp_path / "qa.jsonl"))
    started = [start_verl_run(run)]
    try:
        _wait_for_log(run, "training")  # verl is running (its launch just started, /proc shows it in mid-exec)
        with pytest.raises(RuntimeError, match=f"still running this run from before \\(session {started[0].pid}"):
            start_verl_run(run)
        started.append(start_verl_run(run, replace_running=True))
        assert started[0].wait(timeout=30) != 0 and started[1].poll() is None
        stop_session(started[1], grace_s=5)
        started.append(start_verl_run(run))  # nothing of the run left running: starts
        assert started[2].poll() is None
    finally:
        for process in started:
            stop_session(process, grace_s=1)
