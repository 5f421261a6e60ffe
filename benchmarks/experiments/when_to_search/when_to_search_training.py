"""Learning when to search: proof that the multi-stage reward moves the agent's choice to search, on the default stack.

"Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with Reasoning Language Models"
(section 3.3, Eqs. 6-12) scores a `reflect` rollout with r = r_answer + r_search + r_format. Stage 1's answer term
(Eq. 10) pays a wrong answer 0.3 per retrieval, so an agent that guesses learns to search first; stage 2's (Eq. 11)
charges a right answer 0.3 per retrieval, so an agent that knows learns to stop searching. The embedded 135M model
does not use tags it was not taught (docs/offline-defaults.md), so the runs start from a warm start in the dialect's
tags that leaves the choice open (what the reward then taught it: benchmarks/RESULTS.md, "Learning when to search
on the default stack"):

* **Warm start** (`agent sft --synthesis.dialect reflect --synthesis.direct-answer-share S`, train leaves, the RL
  questions held out): trajectories that search with keyword queries (the question's content words, or its evidence
  title with them), read the retriever's real top-k, reflect on the evidence sentence and answer; and a share S
  (default 0.5) of direct answers, ``<think> .. I know it. </think> <reflect> I recall .. </reflect> <answer>``,
  which state the gold answer of a train question from memory. Both branches open with the same words, so the warm
  start leaves one choice, search or not, and on questions it has not seen a direct answer is a guess.
* **Runs:** ``stage-1``: GRPO with `configs/when_to_search_quickstart.yaml`'s reward (``when_to_search_stage1``;
  ``--stage1-steps`` below ``--steps`` switches to stage 2 after that many steps), on the 25 train leaves the warm
  start held out; ``constant-reward`` (control): the same with a constant reward (GRPO advantages 0: only the KL and
  entropy terms move the policy). Dynamic sampling is off in both (``--dynamic-sampling`` turns it on for the
  rewarded run; the control's groups are all flat, so it would keep none): the two runs see the same number of
  rollouts.

Held-out evaluation, before and after each run, on FanOutQA dev leaves whose evidence page is in the corpus (never
trained on; ``--heldout-questions`` of them spread over the file, ``--eval-samples`` each): the same seeded samples
scored by both stages' rewards, with the valid-shape rate (Eq. 6), the share
answered without search, retrievals per rollout and answer correctness (exact match: no judge). The training curves
go to ``benchmarks/figures/when_to_search_<run>_curves.png``. The two runs go side by side, one torch thread each
(``--one-at-a-time``: one after the other with every core).

    # 41 minutes on 2 CPU cores, plus 15 for the warm start (cached)
    python benchmarks/experiments/when_to_search/when_to_search_training.py

On 2 CPU cores a step costs about 10 minutes per run (16 rollouts: generation 2 min, log-prob passes 2 min, update
6 min, one thread each) and a held-out evaluation of 64 rollouts 12 minutes, hence the defaults: 4 steps and 32
held-out rollouts.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _common (an experiment runs as a script)
from _common import (add_rl_bench_arguments, base_parser, run_workers, serve_worker, start_rl_bench,
                     threads_per_run, write_json)

RUNS = ("stage-1", "constant-reward")
#: What the summary prints per run, before -> after.
SHOWN = ("valid_format", "answered_without_search", "searches", "stage1_answer_correct", "stage1_r_search")


def warm_start(args) -> str:
    """The reflect-format warm start of `configs/quickstart.yaml`'s ``agent_sft`` section with a share of direct
    answers (cached by its inputs)."""
    from agent.sft import WarmStartConfig, warm_start_agent
    from agentic_retriever.app.config_loader import build_config

    config = build_config(WarmStartConfig, "agent_sft", None, args.sft_config)
    config.synthesis.dialect, config.synthesis.topk = "reflect", args.topk
    config.synthesis.direct_answer_share = args.direct_answer_share
    config.exclude_qa = args.train  # the RL questions: a direct answer learnt for them would be recall, not a guess
    # the same updates in micro-batches of 1 (the peak memory of one trajectory, beside other jobs)
    config.train.gradient_accumulation *= config.train.batch_size
    config.train.batch_size = 1
    config.retrieval.index = args.index
    return str(warm_start_agent(config))


def spread(rows: list, count: int) -> list:
    """`count` rows spread evenly over `rows` in file order (a file's neighbours share a parent question)."""
    if count >= len(rows):
        return rows
    return [rows[i * len(rows) // count] for i in range(count)]


def _worker(name: str, args: dict) -> dict:
    """One run: evaluate on the held-out questions, train ``args["steps"]`` steps, evaluate again."""
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
    config.out, config.steps, config.progress, config.report_to = args["out"], args["steps"], False, ["none"]
    config.save_steps, config.actor_lr = args["steps"], args["actor_lr"]
    config.env.topk, config.env.max_new_tokens_per_turn = args["topk"], args["max_new_tokens_per_turn"]
    config.stage2.after_step = args["stage1_steps"]
    config.dynamic_sampling = args["dynamic_sampling"]
    client = open_client(RetrievalConfig(index=args["index"]))
    heldout = spread(read_qa_rows(args["heldout"]), args["heldout_questions"])
    rewards = prepare_reward(config, client, heldout)  # the evaluation's: stage 1 and stage 2
    if name == "constant-reward":
        config = constant_reward_control(config)
    trainer = RLTrainer(config, client, read_qa_rows(args["train"]))
    scorers = {"stage1": rewards.reward, "stage2": rewards.stage2}
    return train_between_scores(
        trainer, lambda: score_on_heldout(trainer, scorers, heldout, args["eval_samples"], args["eval_seed"]))


def main() -> None:
    if serve_worker(_worker):
        return
    parser = base_parser(__doc__)
    add_rl_bench_arguments(parser, name="bench_when_to_search", config="configs/when_to_search_quickstart.yaml",
                           heldout="fanoutqa_leaf_dev_in_corpus.jsonl", runs=RUNS, eval_samples=1,
                           actor_lr=2e-5)
    parser.add_argument("--heldout-questions", type=int, default=32,
                        help="N held-out questions, spread evenly over the file")
    parser.add_argument("--direct-answer-share", type=float, default=0.5,
                        help="share of warm-start examples that answer without searching")
    parser.add_argument("--topk", type=int, default=3, help="passages per search (the paper: 5)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--stage1-steps", type=int, default=None,
                        help="steps of stage 1 before the switch to stage 2 (default: all of them)")
    parser.add_argument("--dynamic-sampling", action="store_true",
                        help="DAPO's dynamic sampling in the rewarded run (more rollouts per step)")
    parser.add_argument("--max-new-tokens-per-turn", type=int, default=128,
                        help="the warm start's reflection quotes a sentence (up to 102 tokens with its answer): a "
                             "shorter cap cuts some answers off, and a cut answer breaks the shape")
    args = parser.parse_args()

    device, work, model = start_rl_bench(args, warm_start)
    threads = threads_per_run(args.runs, args.one_at_a_time, args.threads)

    started = time.perf_counter()
    common = {"config": args.config, "model": model, "index": args.index, "train": args.train,
              "heldout": args.heldout, "heldout_questions": args.heldout_questions, "topk": args.topk,
              "steps": args.steps, "stage1_steps": args.stage1_steps if args.stage1_steps is not None else args.steps,
              "actor_lr": args.actor_lr, "dynamic_sampling": args.dynamic_sampling,
              "max_new_tokens_per_turn": args.max_new_tokens_per_turn, "eval_samples": args.eval_samples,
              "eval_seed": args.eval_seed, "threads": threads}
    results = run_workers(__file__, args.runs, lambda name: common | {"out": str(work / name)}, threads, work,
                          args.one_at_a_time)
    Path(args.figures).mkdir(parents=True, exist_ok=True)
    for name, result in results.items():
        shutil.copy(work / name / "training_curves.png", Path(args.figures) / f"when_to_search_{name}_curves.png")
        before, after = result["before"], result["after"]
        for stage in ("stage1", "stage2"):
            print(f"{name}: held-out {stage} reward {before[stage]:.3f} -> {after[stage]:.3f} "
                  f"(difference {after[stage] - before[stage]:+.3f})")
        print("  " + ", ".join(f"{k} {before[k]:.3f} -> {after[k]:.3f}" for k in SHOWN if k in before))
        rewards = " ".join(f"{h['reward']:.2f}(s{h.get('reward_stage', 1)})" for h in result["history"])
        searched = " ".join(f"{1 - h['answered_without_search']:.2f}" for h in result["history"])
        print(f"  training reward by step: {rewards}; share of rollouts that searched: {searched}")
    if set(RUNS) <= results.keys():
        moved = {name: results[name]["after"]["answered_without_search"] - results[name]["before"][
            "answered_without_search"] for name in RUNS}
        print(f"against the control: the held-out share answered without search moved {moved['stage-1']:+.3f} under "
              f"the reward, {moved['constant-reward']:+.3f} under the constant reward")
    print(f"runs: {time.perf_counter() - started:.0f} s, {threads} torch thread(s) each"
          f"{', one at a time' if args.one_at_a_time else ', side by side'}")
    write_json(args.json, "when_to_search", args, device, results)


if __name__ == "__main__":
    main()
