"""Agent rollout throughput: the batched environment against one question at a time, same backend, with and
without the transformers backend's prefix cache.

Every contender runs `agent.env.rollout` with the transformers backend over the same weights and the same
retriever on the same `--questions` FanOutQA dev leaf questions (greedy, so all produce the same
trajectories up to float noise): "one at a time" calls it once per question, "batched" once per
`--batch-size` questions; "+ cache" keeps each finished sequence's KV cache across calls
(`TransformersLLM.prefix_cache`), so a trajectory's next turn prefills only its new tokens, "no cache"
recomputes every turn's whole context. The contenders run in turn, `--repeats` rounds, each round in a new
backend (an empty cache). Prints per contender the median trajectories per minute, generated tokens per
second, prompt tokens given, computed and taken from the cache, seconds in prefill and in decoding
(`LLM.generate` minus prefill) and the share in retrieval; then the ratios: batched/one at a time with the
cache (target: >= 3x) and without it, and what the cache gains each mode.

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

        from agentic_retriever.base.corpus import ScoredPassage
        from agentic_retriever.base.corpus import split_contents

        with open(corpus, encoding="utf-8") as handle:
            rows = [json.loads(next(handle)) for _ in range(10)]
        self.passages = [ScoredPassage(r["id"], *split_contents(r["contents"]), 1.0) for r in rows]

    def retrieve(self, queries, topk, questions=None):
        return [self.passages[:topk] for _ in queries]


def random_weights_llm(folder: str, batch_size: int):
    """The transformers backend over FOLDER's architecture with seeded random weights (bf16 on a GPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from agentic_retriever.base.llm.transformers import TransformersLLM

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype).to(device).eval()
    return TransformersLLM(model, AutoTokenizer.from_pretrained(folder), name=f"random:{folder}",
                           max_batch_size=batch_size)


CONTENDERS = (("batched + cache", None, True), ("batched, no cache", None, False),
              ("one at a time + cache", 1, True), ("one at a time, no cache", 1, False))


def run_contender(llm, client, questions: list[str], batch: int, config) -> dict:
    """Roll the questions out `batch` at a time with `llm`; the figures of that run."""
    from agent.env import rollout

    generate, prefill, retrieve = Timed(llm.generate), Timed(llm._prefill), Timed(client.retrieve)
    llm.generate, llm._prefill, client.retrieve = generate, prefill, retrieve
    started = time.perf_counter()
    results = []
    for start in range(0, len(questions), batch):
        results.extend(rollout(questions[start:start + batch], llm, client, config))
    wall = time.perf_counter() - started
    del llm.generate, llm._prefill, client.retrieve  # back to the class methods
    tokens = sum(sum(len(s.token_ids) for s in r.segments if s.generated) for r in results)
    stats = llm.prefill_stats
    return {"wall_s": wall, "trajectories_per_min": len(results) / wall * 60, "generated_tokens": tokens,
            "generated_tokens_per_s": tokens / wall, "prefill_s": prefill.seconds,
            "decode_s": generate.seconds - prefill.seconds, "retrieval_share": retrieve.seconds / wall,
            "prompt_tokens": stats.prompt_tokens, "cached_tokens": stats.cached_tokens,
            "computed_tokens": stats.computed_tokens, "searches": sum(r.num_searches for r in results),
            "answers": sum(r.answer is not None for r in results),
            "response_ids": [r.response_ids for r in results]}


def describe(f: dict) -> str:
    return (f"{f['trajectories_per_min']:>7.2f} trajectories/min  {f['generated_tokens_per_s']:>6.1f} generated tokens/s  "
            f"prefill {f['prefill_s']:.1f} s, decode {f['decode_s']:.1f} s, retrieval {f['retrieval_share']:.1%}  "
            f"prompt tokens {f['prompt_tokens']:.0f}: computed {f['computed_tokens']:.0f}, cached {f['cached_tokens']:.0f}  "
            f"({f['generated_tokens']:.0f} tokens, {f['searches']:.0f} searches, {f['answers']:.0f} answers, "
            f"{f['wall_s']:.1f} s)")


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", default="default", help="agent model (hub name, folder or 'default')")
    parser.add_argument("--index", default=str(REPO_ROOT / "runs/quickstart/index/minilm-flat"))
    parser.add_argument("--qa", default=str(REPO_ROOT / "runs/quickstart/data/fanoutqa_leaf_dev_in_corpus.jsonl"))
    parser.add_argument("--questions", type=int, default=16, help="questions rolled out by each contender")
    parser.add_argument("--batch-size", type=int, default=16, help="questions per batched rollout call")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="generated tokens per turn")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all contenders; medians are reported")
    parser.add_argument("--skip", action="append", default=[], choices=[name for name, _, _ in CONTENDERS],
                        help="leave this contender out (repeatable; its ratios are not printed)")
    parser.add_argument("--random-weights", metavar="FOLDER", help="FOLDER's architecture and tokenizer, random weights")
    parser.add_argument("--fixed-passages", metavar="CORPUS", help="answer every search with CORPUS's first passages")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's); 1 on a busy machine, "
                                                      "where a waiting thread spins and one-row steps crawl")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    import statistics

    from agent.env import EnvConfig, rollout
    from agentic_retriever.base.llm import LLMConfig, load_llm
    from agentic_retriever.base.llm.prefix_cache import DEFAULT_PREFIX_CACHE_TOKENS
    from agentic_retriever.base.llm.transformers import TransformersLLM
    from agentic_retriever.base.qa_sources import read_qa_rows
    from agentic_retriever.retrieval import LocalRetrievalClient

    def open_index(folder):
        from agentic_retriever.index import open_index as open_folder

        return open_folder(folder)

    device = describe_device()
    print(device_line(device))
    rows = read_qa_rows(args.qa)[: args.questions]
    loaded = (random_weights_llm(args.random_weights, args.batch_size) if args.random_weights
              else load_llm(LLMConfig(model=args.model, max_batch_size=args.batch_size)))
    client = FixedPassages(args.fixed_passages) if args.fixed_passages else LocalRetrievalClient(open_index(args.index))
    config = EnvConfig(max_turns=args.max_turns, max_new_tokens_per_turn=args.max_new_tokens)
    questions = [r.question for r in rows]
    model = f"{args.random_weights} (random weights)" if args.random_weights else args.model
    retriever = f"first passages of {args.fixed_passages}" if args.fixed_passages else f"index {args.index}"
    print(f"rollouts: {len(questions)} questions from {args.qa}; model {model}; {retriever}; "
          f"max {args.max_turns} turns x {args.max_new_tokens} new tokens; greedy; "
          f"prefix cache of {DEFAULT_PREFIX_CACHE_TOKENS} tokens where on", flush=True)

    def backend(cached: bool) -> TransformersLLM:  # a new one per run: an empty prefix cache
        return TransformersLLM(loaded.model, loaded.tokenizer, name=loaded.name, max_batch_size=args.batch_size,
                               prefix_cache_tokens=DEFAULT_PREFIX_CACHE_TOKENS if cached else 0)

    rollout(questions[:2], backend(True), client, config)  # warm-up, not measured
    contenders = [c for c in CONTENDERS if c[0] not in args.skip]
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in contenders}
    for round_ in range(args.repeats):
        order = contenders if round_ % 2 == 0 else contenders[::-1]
        for name, batch, cached in order:
            run = run_contender(backend(cached), client, questions, batch or args.batch_size, config)
            runs[name].append(run)
            print(f"  round {round_ + 1} {name:<24} {describe(run)}", flush=True)

    figures = {}
    for name in runs:
        f = {key: statistics.median(run[key] for run in runs[name]) for key in runs[name][0] if key != "response_ids"}
        f["walls_s"] = [round(run["wall_s"], 2) for run in runs[name]]
        figures[name] = f
        print(f"  {name:<24} {describe(f)} (median of {f['walls_s']} s)", flush=True)
    first = next(iter(runs))
    same = {name: runs[name][0]["response_ids"] == runs[first][0]["response_ids"] for name in runs}
    print(f"  same trajectories as '{first}': {same}")
    per_min = {name: f["trajectories_per_min"] for name, f in figures.items()}
    ratios = {f"{ours} / {theirs}": per_min[ours] / per_min[theirs] for ours, theirs in (
        ("batched + cache", "one at a time + cache"), ("batched, no cache", "one at a time, no cache"),
        ("batched + cache", "batched, no cache"), ("one at a time + cache", "one at a time, no cache"),
        ("batched + cache", "one at a time, no cache")) if ours in per_min and theirs in per_min}
    for label, value in ratios.items():
        print(f"ratio {label}: {value:.2f}x")
    if "batched + cache / one at a time + cache" in ratios:
        print(f"RATIO batched/one-at-a-time trajectories per minute (both with the prefix cache): "
              f"{ratios['batched + cache / one at a time + cache']:.2f}x  [target >= 3x]")
    write_json(args.json, "bench_rollout", args, device, figures | {"ratios": ratios, "same_trajectories": same})


if __name__ == "__main__":
    main()
