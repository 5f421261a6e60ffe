"""s3: proof that the searcher's trainer learns from Gain Beyond RAG, on a task built to be learnable.

"s3: You Don't Need That Much Data to Train a Search Agent via RL" (arXiv 2505.14146) trains a searcher against a
frozen generator with GBR (section 3.2, Eq. 1). On the default stack the 135M searcher writes no s3 turn (0 of 48
greedy rollouts hold ``<important_info>``; 1 of 32 sampled at temperature 1) and the 135M generator answers 3 of 48
dev questions whatever it is given (benchmarks/RESULTS.md, "s3 on the default stack"), so GBR is 0 everywhere and
nothing can be learned. This benchmark builds the task the issue asks for, where the reward depends on what the
searcher selects, and trains on it with the library's own trainer (`agent.rl.RLTrainer`, reward ``s3_gbr``, the
naive-RAG cache and filters, the s3 dialect and its document bookkeeping):

* **Generator:** `agent.rewards.generation.FirstDocumentsReader` (1): it answers with the first document of its
  context, so Acc = 1 exactly when the first document of D_s3 holds a gold answer. Naive RAG gives it the question's
  top-3 in rank order, so Acc_RAG = 1 when the top-1 passage holds the answer.
* **Questions:** FanOutQA leaves (not yes/no) whose answer is in one of the question's top-`--topk` passages but not
  in the first (found with the gold answers and the index only, never the evidence titles): the naive-RAG filter of
  the trainer keeps all of them (reported), and a searcher gains only by selecting a document that holds the answer
  (``<important_info>``; D_s3 lists a block's selection in document order, so the reader reads the lowest selected
  id). Training: train leaves; held-out evaluation: dev leaves (never trained on).
* **Warm start (format only, label-free):** the 135M model is fine-tuned to write one s3 turn,
  ``<important_info>[k]</important_info><search_complete>True</search_complete>``, after the real Figure 11 prompt of a
  train leaf, with k = 1 (the retriever's top document, naive RAG's own first document) in a share
  ``--sft-top1-share`` of the examples and drawn uniformly from the other documents shown otherwise: it learns the
  format and starts close to naive RAG, as a searcher that trusts the ranking would; its selections carry no
  information about the answer (they are drawn without looking at it).
* **Runs:** ``gbr``: GRPO on the release's GBR (the configured `configs/s3_quickstart.yaml` with the settings
  below); ``shuffled-gold`` (control): the same, with the golden answers permuted among the training questions (the
  reward is then unrelated to the documents; filters off, the same questions). Both start from the same warm start
  and run at the same time, one torch thread each.

Reported per run: mean GBR (release and paper variants), GenAcc and selected documents on the held-out questions
before and after (the same seeded samples), the distribution of the first selected id, the training reward by
step, and the curves (``benchmarks/figures/s3_<run>_curves.png``).

    python benchmarks/experiments/s3/s3_training.py                      # about 95 minutes on 2 CPU cores
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _common (an experiment runs as a script)
from _common import (REPO_ROOT, base_parser, describe_device, device_line, run_workers, serve_worker, threads_per_run,
                     write_json)

DATA = REPO_ROOT / "runs" / "quickstart" / "data"
RUNS = ("gbr", "shuffled-gold")


# ----------------------------------------------------------------------------------------------- the task

def answer_rank(hits, golden) -> int | None:
    """1-based rank of the first passage whose text holds a golden answer (the span check), else None."""
    from agentic_retriever.base.qa_metrics import span_match

    return next((rank for rank, p in enumerate(hits, start=1) if span_match(p.text, list(golden)) == 1.0), None)


def select_questions(path: str, client, topk: int) -> tuple[list, Counter]:
    """The non-yes/no rows of `path` whose answer is in their question's top-`topk` but not its top-1."""
    from agent.s3_rag_baseline import is_yes_no
    from agentic_retriever.base.qa_sources import read_qa_rows

    rows = [row for row in read_qa_rows(path) if not is_yes_no(row.golden_answers)]
    hits = client.retrieve([row.question for row in rows], topk=topk)  # naive RAG's search, the searcher's D_0
    ranks = [answer_rank(h, row.golden_answers) for row, h in zip(rows, hits)]
    return [row for row, rank in zip(rows, ranks) if rank and rank > 1], Counter(ranks)


def warm_start(args, client) -> str:
    """The format-only s3 warm start (see the module), cached under ``--work`` by its examples' content."""
    from transformers import AutoTokenizer

    from agent.dialects.s3 import S3Dialect, S3Selection, S3Settings
    from agent.sft import SFTConfig, SFTExample, data_fingerprint, train_sft
    from agentic_retriever.base.defaults import resolve_llm_name
    from agentic_retriever.base.llm import LLMConfig
    from agentic_retriever.base.llm.text import render_chat_prompt
    from agentic_retriever.base.qa_sources import read_qa_rows

    tokenizer = AutoTokenizer.from_pretrained(resolve_llm_name("default"))
    rows = read_qa_rows(args.train)
    random.Random(args.seed).shuffle(rows)
    rows = rows[: args.sft_examples]
    dialect = S3Dialect(S3Settings(topk=args.topk))
    picks = random.Random(args.seed + 1)
    examples = []
    hits = client.retrieve([row.question for row in rows], topk=args.topk)  # D_0: naive RAG's search
    for row, found in zip(rows, hits):
        selection = S3Selection(lambda s: len(tokenizer.encode(s, add_special_tokens=False)))
        shown = selection.observe(found)
        prompt = render_chat_prompt(tokenizer, dialect.build_prompt(row.question, [shown]))
        pick = 1 if len(shown) == 1 or picks.random() < args.sft_top1_share else picks.randint(2, len(shown))
        turn = (f"<important_info>[{pick}]</important_info>\n"
                f"<search_complete>True</search_complete>{tokenizer.eos_token}")
        examples.append(SFTExample(f"{row.id}:s3-format", prompt, [(turn, True)], {"question_id": row.id}))
    out = Path(args.work) / f"warm-start-{data_fingerprint(examples)[:12]}"
    if not (out / "sft_manifest.json").is_file():
        train_sft(SFTConfig(epochs=1.0, learning_rate=1e-4, batch_size=4, report_to=["none"]),
                  LLMConfig(model="default"), examples, out)
    return str(out)


# ----------------------------------------------------------------------------------------------- one run

def _worker(name: str, args: dict) -> dict:
    import torch

    from agent.dialects.s3 import parse_turn
    from agent.rewards.generation import FirstDocumentsReader
    from agent.rl import RLConfig, RLTrainer
    from agent.rl.heldout import train_between_scores
    from agentic_retriever.app.config_loader import build_config
    from agentic_retriever.base.client import RetrievalConfig
    from agentic_retriever.base.qa_sources import QARow
    from agentic_retriever.retrieval import open_client

    torch.set_num_threads(args["threads"])
    config = build_config(RLConfig, "agent_train", None, args["config"])
    config.agent.model = args["model"]
    config.generator.model = "first-documents-reader-1"  # names the reader given to the trainer below
    config.out, config.steps, config.progress, config.report_to = args["out"], args["steps"], False, ["none"]
    config.actor_lr, config.seed = args["actor_lr"], args["seed"]
    config.naive_rag_cache = str(Path(args["out"]) / "naive_rag")
    config.env.topk, config.env.max_turns, config.env.max_new_tokens_per_turn = args["topk"], 2, 32
    config.save_steps = args["steps"]
    train = [QARow(**row) for row in args["train_rows"]]
    heldout = [QARow(**row) for row in args["heldout_rows"]]
    if name == "shuffled-gold":  # same questions, golden answers of other questions: a reward without signal
        golden = [row.golden_answers for row in train]
        random.Random(args["seed"]).shuffle(golden)
        train = [QARow(row.id, row.question, answers) for row, answers in zip(train, golden)]
        config.keep_naive_rag_failures = config.drop_yes_no = False
    client = open_client(RetrievalConfig(index=args["index"]))
    trainer = RLTrainer(config, client, train, generator=FirstDocumentsReader(1))

    def evaluate() -> dict:
        samples = trainer.rollout_samples(heldout, args["eval_samples"], args["eval_seed"])
        metrics = trainer.rollout_metrics(samples)
        first_ids = Counter()
        for sample in samples:
            text = trainer.tokenizer.decode([t for t, m in zip(sample.response_ids, sample.mask) if m])
            ids = parse_turn(text).important_ids
            first_ids[str(min(ids)) if ids else "none"] += 1
        return {**metrics, "first_selected_id": dict(sorted(first_ids.items()))}

    return train_between_scores(trainer, evaluate) | {"question_filters": trainer.question_filters,
                                                     "train_questions": len(trainer.rows)}


def main() -> None:
    if serve_worker(_worker):
        return
    parser = base_parser(__doc__)
    parser.add_argument("--config", default="configs/s3_quickstart.yaml")
    parser.add_argument("--index", default="runs/quickstart/index/minilm-flat")
    parser.add_argument("--train", default=str(DATA / "fanoutqa_leaf_train.jsonl"), help="training leaves")
    parser.add_argument("--heldout", default=str(DATA / "fanoutqa_leaf_dev.jsonl"), help="held-out leaves (eval only)")
    parser.add_argument("--topk", type=int, default=3,
                        help="documents per search ([P]'s main run: 8; 3 keeps a CPU step short)")
    parser.add_argument("--sft-examples", type=int, default=64, help="format warm-start examples")
    parser.add_argument("--sft-top1-share", type=float, default=0.5,
                        help="share of warm-start examples that select the top document")
    parser.add_argument("--steps", type=int, default=10, help="RL steps per run")
    parser.add_argument("--actor-lr", type=float, default=1e-5)
    parser.add_argument("--eval-samples", type=int, default=8, help="seeded samples per held-out question")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--work", default=str(REPO_ROOT / "runs" / "quickstart" / "bench_s3"),
                        help="folder of the warm start and the runs")
    parser.add_argument("--figures", default=str(REPO_ROOT / "benchmarks" / "figures"))
    args = parser.parse_args()

    from agentic_retriever.base.client import RetrievalConfig
    from agentic_retriever.retrieval import open_client

    device = describe_device()
    print(device_line(device))
    client = open_client(RetrievalConfig(index=args.index))
    train, train_ranks = select_questions(args.train, client, args.topk)
    heldout, heldout_ranks = select_questions(args.heldout, client, args.topk)
    for label, ranks in (("train", train_ranks), ("held-out", heldout_ranks)):
        print(f"{label}: rank of the first answer-bearing passage in the question's top-{args.topk}: "
              + ", ".join(f"{rank or 'none'} {count}" for rank, count in sorted(ranks.items(), key=lambda kv: kv[0] or 99)))
    print(f"task: {len(train)} train and {len(heldout)} held-out questions (answer at ranks 2..{args.topk})")
    started = time.perf_counter()
    model = warm_start(args, client)
    print(f"warm start: {model} ({time.perf_counter() - started:.0f} s)")

    threads = threads_per_run(args.runs, one_at_a_time=False)
    common = {"config": args.config, "model": model, "index": args.index, "topk": args.topk, "steps": args.steps,
              "actor_lr": args.actor_lr, "eval_samples": args.eval_samples, "eval_seed": args.eval_seed,
              "seed": args.seed, "threads": threads,
              "train_rows": [{"id": r.id, "question": r.question, "golden_answers": list(r.golden_answers)}
                             for r in train],
              "heldout_rows": [{"id": r.id, "question": r.question, "golden_answers": list(r.golden_answers)}
                               for r in heldout]}
    started = time.perf_counter()
    work = Path(args.work)
    results = run_workers(__file__, args.runs, lambda name: common | {"out": str(work / name)}, threads, work)
    Path(args.figures).mkdir(parents=True, exist_ok=True)
    for name, result in results.items():
        shutil.copy(work / name / "training_curves.png", Path(args.figures) / f"s3_{name}_curves.png")
        before, after, history = result["before"], result["after"], result["history"]
        print(f"ratio {name}: held-out mean GBR (release) after / before "
              f"{after['reward'] / max(before['reward'], 1e-9):.2f}x ({before['reward']:.3f} -> {after['reward']:.3f}); "
              + ", ".join(f"{k} {before[k]:.3f} -> {after[k]:.3f}" for k in ("gbr", "gen_acc", "selected_documents")))
        print(f"  first selected id before {before['first_selected_id']} after {after['first_selected_id']}")
        rewards = " ".join(f"{h['reward']:.2f}" for h in history)
        print(f"  training reward by step: {rewards}; questions {result['question_filters'] or result['train_questions']}")
    print(f"both runs: {time.perf_counter() - started:.0f} s, {threads} torch thread(s) each")
    write_json(args.json, "s3", args, device, results)


if __name__ == "__main__":
    main()
