"""QAgent: proof that the two-stage trainer learns, on the default stack.

"QAgent: A modular Search Agent with Interactive Query Understanding" (arXiv 2510.08383) trains its agent end to
end with Eq. 7 (1{format} x strict EM; stage 1), then with Eq. 10 (contains-EM of a frozen generator's answer from
every retrieved passage + 0.5 x Hit; stage 2). The embedded 135M model prompted with Table 5 never writes the
format (reported below as the untrained model's stage-1 reward and valid-format rate on the held-out questions), so
both runs start from a QAgent-format warm start: ``agent sft --synthesis.dialect qagent --synthesis.topk 1
--train.batch-size 1 --train.gradient-accumulation 4`` (plans
before every search, ``--queries-per-search`` ``<query>`` lines per search (1 by default), a reflection after every
observation, an answer read from the evidence sentence; train leaves, the mining questions held out).

* ``two-stage``: `configs/qagent_quickstart.yaml` (GRPO, 4 questions x 4 samples, top-1 per query, the embedded
  SmolLM2-135M loaded separately as the frozen generator), ``--steps`` steps with the switch to stage 2 after
  ``--stage1-steps``; trained on the 25 train leaves the warm start held out;
* ``constant-reward`` (control): the same, with a constant reward (GRPO advantages 0: only the KL and entropy terms
  move the policy).

Held-out evaluation, before and after each run, on the dev leaves whose answer is in their evidence passage (never
trained on): the same seeded samples scored by BOTH stages' rewards (mean Eq. 7, mean Eq. 10) with the valid-format
rate, strict EM, Hit and the generator's contains-EM; the training curves are copied to
``benchmarks/figures/qagent_<run>_curves.png``. The two runs go side by side, one torch thread each
(``--one-at-a-time``: one after the other with every core, for machines short of memory).

``--reevaluate SEED ...`` trains nothing: it scores the warm start and the final policies an earlier run left for
``--runs`` on the same held-out questions under other sampling seeds (is a gain more than one draw?).

    python benchmarks/experiments/qagent/qagent_training.py    # about 8 minutes a step per run, one thread each
    python benchmarks/experiments/qagent/qagent_training.py --reevaluate 1 2 --runs two-stage
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _common (an experiment runs as a script)
from _common import (add_rl_bench_arguments, base_parser, finish_worker, run_workers, serve_worker,
                     start_rl_bench, start_worker, threads_per_run, write_json)

RUNS = ("two-stage", "constant-reward")
SHOWN = ("stage1", "stage2", "valid_format", "em", "hit", "stage2_submodule_contains_em", "searches", "queries")


def warm_start(args) -> str:
    """The QAgent-format warm start of `configs/quickstart.yaml`'s ``agent_sft`` section (cached by its inputs)."""
    from agent.sft import WarmStartConfig, warm_start_agent
    from agentic_retriever.app.config_loader import build_config

    config = build_config(WarmStartConfig, "agent_sft", None, args.sft_config)
    config.synthesis.dialect, config.synthesis.topk = "qagent", 1
    config.synthesis.queries_per_search = args.queries_per_search
    # the same updates in micro-batches of 1: four of QAgent's longer trajectories at once passed 9 GB of RSS
    config.train.gradient_accumulation *= config.train.batch_size
    config.train.batch_size = 1
    config.retrieval.index = args.index
    return str(warm_start_agent(config))


def _worker(name: str, args: dict) -> dict:
    """One run: evaluate, train ``args["steps"]`` steps (none for "untrained"), evaluate again."""
    import torch

    from agent.rl import RLConfig, RLTrainer
    from agent.rl.batch_reward import prepare_reward
    from agent.rl.heldout import constant_reward_control, score_on_heldout, train_between_scores
    from agentic_retriever.app.config_loader import build_config
    from agentic_retriever.base.client import RetrievalConfig
    from agentic_retriever.base.qa_sources import read_qa_rows
    from agentic_retriever.retrieval import open_client

    torch.set_num_threads(args["threads"])
    config = build_config(RLConfig, "agent_train", None, args["config"])
    config.agent.model = args["model"]
    config.out, config.steps, config.progress, config.report_to = args["out"], max(1, args["steps"]), False, ["none"]
    config.save_steps, config.actor_lr = config.steps, args["actor_lr"]
    config.env.max_new_tokens_per_turn = args["max_new_tokens_per_turn"]
    config.stage2.after_step = args["stage1_steps"]
    client = open_client(RetrievalConfig(index=args["index"]))
    heldout = read_qa_rows(args["heldout"])
    rewards = prepare_reward(config, client, heldout)  # the evaluation's: Eq. 7 and Eq. 10
    if name == "constant-reward":
        config = constant_reward_control(config)
    trainer = RLTrainer(config, client, read_qa_rows(args["train"]))
    scorers = {"stage1": rewards.reward, "stage2": rewards.stage2}
    return train_between_scores(
        trainer, lambda: score_on_heldout(trainer, scorers, heldout, args["eval_samples"], args["eval_seed"]),
        train=args["steps"] > 0)


def _common_args(args, model: str, threads: int, steps: int) -> dict:
    return {"config": args.config, "model": model, "index": args.index, "train": args.train, "heldout": args.heldout,
            "steps": steps, "stage1_steps": args.stage1_steps, "actor_lr": args.actor_lr,
            "max_new_tokens_per_turn": args.max_new_tokens_per_turn,
            "eval_samples": args.eval_samples, "eval_seed": args.eval_seed, "threads": threads}


def reevaluate(args, device: dict, work: Path, model: str) -> None:
    """Held-out evaluation only, once per seed of ``--reevaluate``: the warm start and the final policy that an earlier
    run of the benchmark left for each of ``--runs`` (``work/RUN/policy``), side by side; no training."""
    models = {"warm-start": model} | {name: str(work / name / "policy") for name in args.runs}
    missing = [path for path in models.values() if not Path(path).is_dir()]
    if missing:
        raise SystemExit(f"no trained policy at {', '.join(missing)}: run the benchmark without --reevaluate first")
    threads = threads_per_run(models, args.one_at_a_time, args.threads)
    results = {}
    for seed in args.reevaluate:
        folder = work / "reevaluate" / f"seed-{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        scores = run_workers(__file__, list(models), lambda name: _common_args(args, models[name], threads, 0)
                             | {"eval_seed": seed, "out": str(folder / name)}, threads, folder, args.one_at_a_time)
        results[str(seed)] = {name: score["before"] for name, score in scores.items()}
        for name, score in results[str(seed)].items():
            print(f"eval seed {seed}, {name}: " + ", ".join(f"{k} {score[k]:.3f}" for k in SHOWN if k in score))
    write_json(args.json, "qagent_reevaluate", args, device, results)


def main() -> None:
    if serve_worker(_worker):
        return
    parser = base_parser(__doc__)
    add_rl_bench_arguments(parser, name="bench_qagent", config="configs/qagent_quickstart.yaml",
                           heldout="fanoutqa_leaf_dev_answerable.jsonl", runs=RUNS, eval_samples=4,
                           actor_lr=2e-5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--stage1-steps", type=int, default=5, help="steps of stage 1 before the switch")
    parser.add_argument("--max-new-tokens-per-turn", type=int, default=96,
                        help="the warm start's reflection quotes a sentence: 64 tokens cut some answers off")
    parser.add_argument("--queries-per-search", type=int, default=1,
                        help="queries in each search of the warm start's trajectories (QAgent: 1-3)")
    parser.add_argument("--skip-untrained", action="store_true", help="do not evaluate the model without warm start")
    parser.add_argument("--reevaluate", nargs="+", type=int, metavar="SEED",
                        help="no training: evaluate the warm start and the policies an earlier run left for --runs "
                             "on the held-out questions under each of these sampling seeds")
    args = parser.parse_args()

    device, work, model = start_rl_bench(args, warm_start)
    if args.reevaluate:
        reevaluate(args, device, work, model)
        return
    threads = threads_per_run(args.runs, args.one_at_a_time, args.threads)
    untrained = None
    if not args.skip_untrained:
        log = work / "untrained.log"
        untrained = finish_worker(start_worker(__file__, "untrained", _common_args(args, "default", os.cpu_count() or 1,
                                                                                    0) | {"out": str(work / "untrained")},
                                               os.cpu_count() or 1, log), "untrained", log)["before"]
        print(f"untrained 135M under Table 5 (held-out): stage-1 reward {untrained['stage1']:.3f}, valid format "
              f"{untrained['valid_format']:.3f}, stage-2 reward {untrained['stage2']:.3f}, hit {untrained['hit']:.3f}")

    started = time.perf_counter()
    results = run_workers(__file__, args.runs, lambda name: _common_args(args, model, threads, args.steps)
                          | {"out": str(work / name)}, threads, work, args.one_at_a_time)
    Path(args.figures).mkdir(parents=True, exist_ok=True)
    for name, result in results.items():
        shutil.copy(work / name / "training_curves.png", Path(args.figures) / f"qagent_{name}_curves.png")
        before, after = result["before"], result["after"]
        for stage in ("stage1", "stage2"):
            print(f"ratio {name} held-out {stage} reward after / before {after[stage] / max(before[stage], 1e-9):.2f}x "
                  f"({before[stage]:.3f} -> {after[stage]:.3f})")
        print("  " + ", ".join(f"{k} {before[k]:.3f} -> {after[k]:.3f}" for k in SHOWN[2:] if k in before))
        rewards = " ".join(f"{h['reward']:.2f}(s{h.get('reward_stage', 1)})" for h in result["history"])
        print(f"  training reward by step: {rewards}")
    print(f"runs: {time.perf_counter() - started:.0f} s, {threads} torch thread(s) each"
          f"{', one at a time' if args.one_at_a_time else ', side by side'}")
    write_json(args.json, "qagent", args, device, {"untrained": untrained, **results})


if __name__ == "__main__":
    main()
