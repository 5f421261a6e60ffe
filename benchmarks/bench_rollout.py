"""Agent rollout throughput: the batched environment against one question at a time, same backend.

Both contenders run `agent.env.rollout` with the transformers backend and the same retriever on the same
`--questions` FanOutQA dev leaf questions (greedy, so both produce the same trajectories up to batching
noise in float arithmetic): the baseline calls it once per question, ours once per `--batch-size`
questions. Prints trajectories per minute of each and their ratio (target: batched >= 3x), generated
tokens per second, and the share of wall time spent in generation and in retrieval (timed around
`LLM.generate` and `RetrievalClient.retrieve`).

    python benchmarks/bench_rollout.py --model default --index runs/quickstart/index/minilm-flat
    python benchmarks/bench_rollout.py --model ~/.cache/agentic_retriever/agents/sft-XXXX   # the warm-started agent

Needs the quickstart data and index (`make demo` writes them). On a machine that cannot hold the weights
or the index (e.g. a GPU host without the project's dependencies), `--random-weights FOLDER` builds the
model of FOLDER's config with random weights (it rarely closes a tag, so every turn runs to the token cap:
a measure of the batching mechanics, not of the agent) and `--fixed-passages CORPUS` answers every search
with the first `topk` passages of CORPUS instead of an index.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from _common import REPO_ROOT, base_parser, describe_device, device_line, write_json


class Timed:
    """Wraps a callable and adds the seconds spent in it to `seconds`."""

    def __init__(self, fn: Callable):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started


class FixedPassages:
    """A retrieval client that answers every query with the first passages of a corpus file."""

    def __init__(self, corpus: str):
        import json

        from agentic_retriever.corpus import split_contents
        from agentic_retriever.corpus import ScoredPassage

        with open(corpus, encoding="utf-8") as handle:
            rows = [json.loads(next(handle)) for _ in range(10)]
        self.passages = [ScoredPassage(r["id"], *split_contents(r["contents"]), 1.0) for r in rows]

    def retrieve(self, queries, topk, questions=None):
        return [self.passages[:topk] for _ in queries]


def random_weights_llm(folder: str, batch_size: int):
    """The transformers backend over FOLDER's architecture with seeded random weights (bf16 on a GPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from agentic_retriever.llm.transformers import TransformersLLM

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype).to(device).eval()
    return TransformersLLM(model, AutoTokenizer.from_pretrained(folder), name=f"random:{folder}",
                           max_batch_size=batch_size)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", default="default", help="agent model (hub name, folder or 'default')")
    parser.add_argument("--index", default=str(REPO_ROOT / "runs/quickstart/index/minilm-flat"))
    parser.add_argument("--qa", default=str(REPO_ROOT / "runs/quickstart/data/fanoutqa_leaf_dev_in_corpus.jsonl"))
    parser.add_argument("--questions", type=int, default=16, help="questions rolled out by each contender")
    parser.add_argument("--batch-size", type=int, default=16, help="questions per batched rollout call")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="generated tokens per turn")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--random-weights", metavar="FOLDER", help="FOLDER's architecture and tokenizer, random weights")
    parser.add_argument("--fixed-passages", metavar="CORPUS", help="answer every search with CORPUS's first passages")
    args = parser.parse_args()

    from agent.env import EnvConfig, rollout
    from agent.qa_data import read_qa_rows
    from agentic_retriever.client import LocalRetrievalClient
    from agentic_retriever.llm import LLMConfig, load_llm

    def open_index(folder):
        from agentic_retriever.index import open_index as open_folder

        return open_folder(folder)

    device = describe_device()
    print(device_line(device))
    rows = read_qa_rows(args.qa)[: args.questions]
    llm = (random_weights_llm(args.random_weights, args.batch_size) if args.random_weights
           else load_llm(LLMConfig(model=args.model, max_batch_size=args.batch_size)))
    client = FixedPassages(args.fixed_passages) if args.fixed_passages else LocalRetrievalClient(open_index(args.index))
    config = EnvConfig(max_turns=args.max_turns, max_new_tokens_per_turn=args.max_new_tokens)
    questions = [r.question for r in rows]
    model = f"{args.random_weights} (random weights)" if args.random_weights else args.model
    retriever = f"first passages of {args.fixed_passages}" if args.fixed_passages else f"index {args.index}"
    print(f"rollouts: {len(questions)} questions from {args.qa}; model {model}; {retriever}; "
          f"max {args.max_turns} turns x {args.max_new_tokens} new tokens; greedy", flush=True)
    rollout(questions[:2], llm, client, config)  # warm-up, not measured

    figures = {}
    for name, batch in (("one at a time", 1), ("batched", args.batch_size)):
        generate, retrieve = Timed(llm.generate), Timed(client.retrieve)
        llm.generate, client.retrieve = generate, retrieve
        started = time.perf_counter()
        results = []
        for start in range(0, len(questions), batch):
            results.extend(rollout(questions[start:start + batch], llm, client, config))
        wall = time.perf_counter() - started
        del llm.generate, client.retrieve  # back to the class methods
        tokens = sum(sum(len(s.token_ids) for s in r.segments if s.generated) for r in results)
        figures[name] = {
            "wall_s": round(wall, 2), "trajectories_per_min": round(len(results) / wall * 60, 2),
            "generated_tokens": tokens, "generated_tokens_per_s": round(tokens / wall, 1),
            "generation_share": round(generate.seconds / wall, 3), "retrieval_share": round(retrieve.seconds / wall, 3),
            "searches": sum(r.num_searches for r in results), "answers": sum(r.answer is not None for r in results),
        }
        f = figures[name]
        print(f"  {name:<14} {f['trajectories_per_min']:>7.2f} trajectories/min  {f['generated_tokens_per_s']:>7.1f} "
              f"generated tokens/s  generation {f['generation_share']:.0%}  retrieval {f['retrieval_share']:.1%}  "
              f"({f['generated_tokens']} tokens, {f['searches']} searches, {f['answers']} answers, {f['wall_s']} s)",
              flush=True)
    ratio = figures["batched"]["trajectories_per_min"] / figures["one at a time"]["trajectories_per_min"]
    print(f"RATIO batched/one-at-a-time trajectories per minute: {ratio:.2f}x  [target >= 3x]")
    write_json(args.json, "bench_rollout", args, device, figures | {"ratio": round(ratio, 3)})


if __name__ == "__main__":
    main()
