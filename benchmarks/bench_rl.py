"""Agent RL: proof that the embedded trainer learns, and the cost of one RL step.

1. Learning proof. On a small task from the default corpus (FanOutQA leaf questions whose answer is in their
   evidence passage, so the right search leads to a checkable answer), each run trains the policy for
   ``--steps`` steps with the CPU quickstart config (``configs/search_r1_quickstart.yaml``) and measures the
   mean reward of the policy before and after on the same questions with the same seeded samples. Runs:
   GRPO and PPO with the configured reward, and a control: GRPO with a constant reward, where the group
   advantages are 0 and only the KL and entropy terms move the policy. Reported per run: reward before ->
   after (ratio), its components, the KL to the initial policy at the last step; the curves are copied to
   ``--figures`` (``rl_<run>_curves.png``).
2. Cost of a step (from the same runs): mean seconds of generation, log-prob passes (rollout policy unless
   the update is on-policy, reference, critic; `agent.rl.RLConfig.on_policy`) and update, the share of response tokens masked (retrieved text), peak RSS. Baseline
   in the same process: one update of the policy on a step's rollouts against a plain Hugging Face causal-LM
   loss (cross-entropy on the same tokens, one backward per micro-batch): the ratio is what our RL loss costs
   over a supervised pass.

Each run is its own process (its peak memory is its own). Needs the quickstart artifacts (``make demo``).
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO_ROOT, base_parser, describe_device, device_line, write_json

RUNS = {  # name -> overrides of the config
    "grpo": {"algorithm": "grpo"},
    "ppo": {"algorithm": "ppo"},
    "grpo-constant-reward": {"algorithm": "grpo", "reward": "constant", "reward_options": {}},
}


def _worker(name: str, args: dict) -> dict:
    from agent.rl import RLConfig, RLTrainer
    from agentic_retriever.app.config_loader import build_config
    from agentic_retriever.base.client import RetrievalConfig
    from agentic_retriever.base.qa_sources import read_qa_rows
    from agentic_retriever.retrieval import open_client

    config = build_config(RLConfig, "agent_train", None, args["config"])
    overrides = {key: args[key] for key in ("actor_lr", "critic_lr", "prompts_per_step") if args[key] is not None}
    for key, value in {**RUNS[name], "qa": args["qa"], "retrieval": RetrievalConfig(index=args["index"]),
                       "out": args["out"], "steps": args["steps"], "limit": args["limit"], "progress": False,
                       **overrides}.items():
        setattr(config, key, value)
    config.agent.model = args["model"]
    rows = read_qa_rows(config.qa)[: config.limit]
    trainer = RLTrainer(config, open_client(config.retrieval), rows)
    before = trainer.evaluate(rows, args["eval_samples"], seed=args["eval_seed"])
    trainer.train()
    after = trainer.evaluate(rows, args["eval_samples"], seed=args["eval_seed"])
    history = trainer.state.history

    # baseline: our policy update on one step's rollouts vs a plain causal-LM loss on the same tokens
    samples, _ = trainer.collect()
    on_policy = config.on_policy(len(samples))  # as the trainer's steps do
    trainer.score(samples, rollout_policy=not on_policy)
    trainer.advantages(samples)
    started = time.perf_counter()
    trainer._update_policy(samples, lambda *a: None, on_policy)
    ours = time.perf_counter() - started
    started = time.perf_counter()
    for micro in trainer._micro_batches(samples):
        batch = trainer._collate(micro)
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        trainer.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids, labels=labels).loss.backward()
    trainer._step(trainer.policy, trainer.actor_opt, trainer.actor_sched)  # the same optimiser step as ours
    plain = time.perf_counter() - started
    return {"before": before, "after": after, "history": history, "update_seconds": ours,
            "plain_causal_lm_seconds": plain, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _spawn(name: str, args: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", name, json.dumps(args)], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"run {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mean(history: list[dict], key: str) -> float:
    values = [h[key] for h in history if key in h]
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(sys.argv[2], json.loads(sys.argv[3]))))
        return
    parser = base_parser(__doc__)
    parser.add_argument("--model", help="initial policy (default: the warm-started agent of the last `make demo`)")
    parser.add_argument("--config", default="configs/search_r1_quickstart.yaml")
    parser.add_argument("--qa", default="runs/quickstart/data/fanoutqa_leaf_train_mining.jsonl",
                        help="questions (default: the answerable train leaves the warm start held out)")
    parser.add_argument("--index", default="runs/quickstart/index/minilm-flat")
    parser.add_argument("--limit", type=int, default=8, help="questions trained and evaluated on")
    parser.add_argument("--steps", type=int, default=8, help="RL steps per run")
    parser.add_argument("--eval-samples", type=int, default=4, help="seeded samples per question in evaluation")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--actor-lr", type=float, help="override the config's policy learning rate")
    parser.add_argument("--critic-lr", type=float, help="override the config's critic learning rate")
    parser.add_argument("--prompts-per-step", type=int, help="override the config's questions per step")
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--figures", default=str(REPO_ROOT / "benchmarks" / "figures"),
                        help="folder the training curves are copied to")
    args = parser.parse_args()
    if not args.model:
        report = REPO_ROOT / "runs" / "quickstart" / "report.json"
        if not report.is_file():
            raise SystemExit(f"no --model and no {report}: run `make demo` first (it warm-starts the agent)")
        args.model = json.loads(report.read_text())["agent_model"]

    device = describe_device()
    print(device_line(device))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            started = time.perf_counter()
            result = _spawn(name, {"config": args.config, "model": args.model, "qa": args.qa, "index": args.index,
                                   "out": f"{tmp}/{name}", "steps": args.steps, "limit": args.limit,
                                   "actor_lr": args.actor_lr, "critic_lr": args.critic_lr,
                                   "prompts_per_step": args.prompts_per_step,
                                   "eval_samples": args.eval_samples, "eval_seed": args.eval_seed})
            Path(args.figures).mkdir(parents=True, exist_ok=True)
            shutil.copy(f"{tmp}/{name}/training_curves.png", Path(args.figures) / f"rl_{name}_curves.png")
            results[name] = result
            history, before, after = result["history"], result["before"], result["after"]
            parts = ", ".join(f"{k} {before[k]:.3f} -> {after[k]:.3f}" for k in ("em", "valid_format", "retrieval_hit")
                              if k in before)
            print(f"ratio {name}: mean reward after / before {after['reward'] / max(before['reward'], 1e-9):.3f}x "
                  f"({before['reward']:.3f} -> {after['reward']:.3f}; {parts}); KL to the initial policy at the "
                  f"last step {history[-1].get('kl', float('nan')):.4f} ({time.perf_counter() - started:.0f} s)")
            rewards = " ".join(f"{h['reward']:.2f}" for h in history)
            print(f"  training reward by step: {rewards}")
            print(f"  step cost: generation {_mean(history, 'seconds_generate'):.1f} s, log-prob passes "
                  f"{_mean(history, 'seconds_logprobs'):.1f} s, update {_mean(history, 'seconds_update'):.1f} s; "
                  f"{_mean(history, 'response_tokens'):.0f} response tokens per rollout, "
                  f"{100 * _mean(history, 'masked_share'):.0f}% masked; on-policy update in "
                  f"{sum(h.get('on_policy', 0) for h in history):.0f} of {len(history)} steps; "
                  f"peak RSS {result['peak_rss_mib']:.0f} MiB")
            print(f"ratio {name} update vs plain causal-LM loss on the same tokens: "
                  f"{result['update_seconds'] / result['plain_causal_lm_seconds']:.2f}x "
                  f"({result['update_seconds']:.1f} s vs {result['plain_causal_lm_seconds']:.1f} s)")
    write_json(args.json, "rl", args, device, results)


if __name__ == "__main__":
    main()
