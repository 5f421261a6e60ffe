"""GAC continuations: the round context's KV cache reused across candidates (and each continuation's earlier
turns kept in the prefix cache) vs every continuation from scratch.

The utility miner's global-answer-correctness step (`agentic_retriever.mining.gac.rollout_gac`) continues
the agent once per (round, candidate): `--rounds` rounds x `--candidates` candidates, all in one
`agent.env.rollout` call with one `Prefix` per pair, so the continuations of a round share the round's
whole context and differ only in the candidate passage of its ``<information>``; later turns retrieve
normally. Every contender runs exactly that path (`rollout_gac`) with the transformers backend, the same
model and the same prompts, in a new backend per run (an empty prefix cache); only what is reused differs:
"reuse + cache" batches rows by their token ids, computes each round's context once per batch and keeps
finished sequences' KV caches across calls (`TransformersLLM.prefix_cache`: a continuation's later turns
prefill only their new tokens); "reuse" does the first two without a prefix cache; "recompute" computes
every row whole, every turn. They alternate (a noisy neighbour slows all alike). Prints continuations per
second of each and the ratios (target: reuse >= 2x recompute), generated tokens, prompt tokens computed, the
share of wall time in `generate`, and whether all generated the same tokens (greedy: they should, up to
float noise on near-ties, e.g. in bfloat16).

Rounds come from real trajectories with `--trajectories` (`mining.rounds.extract_rounds`; candidates
retrieved from `--index` for the round's query, as mining does), else from synthetic contexts: round r
has ``r % 3 + 1`` earlier turns, each a ``<think>`` of `--think-words` words, a search call and 3
passages, and synthetic passages are the candidates (from the quickstart corpus when it exists). Later
turns search `--index` when it exists, else a fake client that returns fixed passages.

    python benchmarks/bench_gac.py --rounds 2 --candidates 8 --max-new-tokens 32           # a quick check
    python benchmarks/bench_gac.py --rounds 8 --candidates 20 --max-new-tokens 512 \\
        --trajectories runs/quickstart/agent/trajectories_dev_sft.jsonl --model ~/.cache/agentic_retriever/agents/sft-XXXX
"""

from __future__ import annotations

import time
from pathlib import Path

from _common import (
    REPO_ROOT,
    alternate,
    base_parser,
    describe_device,
    device_line,
    load_passages,
    summarize,
    synthetic_passages,
    write_json,
)

QUICKSTART_INDEX = REPO_ROOT / "runs/quickstart/index/minilm-flat"


class FixedClient:
    """A retrieval client that answers every query with the same passages (later turns of synthetic runs)."""

    def __init__(self, passages):
        self.passages = list(passages)

    def retrieve(self, queries, topk, questions=None, histories=None):
        return [self.passages[:topk] for _ in queries]


class CountedGenerate:
    """Wraps `llm.generate`: calls, seconds, generated tokens and the generated ids (to compare contenders)."""

    def __init__(self, generate):
        self.generate = generate
        self.calls, self.seconds, self.tokens = 0, 0.0, 0
        self.generated: list[list[tuple[int, ...]]] = []

    def __call__(self, prompts, params, *args, **kwargs):
        started = time.perf_counter()
        try:
            outputs = self.generate(prompts, params, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started
        self.calls += 1
        self.tokens += sum(len(g.token_ids) for per_prompt in outputs for g in per_prompt)
        self.generated.append([tuple(g.token_ids) for per_prompt in outputs for g in per_prompt])
        return outputs


def scored_passages(count: int, corpus: str | None, seed: int = 0):
    from agentic_retriever.base.corpus import ScoredPassage
    from agentic_retriever.base.corpus import split_contents

    texts, source = load_passages(count, corpus, seed=seed)
    return [ScoredPassage(f"p{i}", *split_contents(t), score=1.0) for i, t in enumerate(texts)], source


def synthetic_requests(rounds: int, candidates: int, think_words: int, corpus: str | None):
    """Rounds of made-up trajectories (one question each) with `candidates` corpus passages each."""
    from agent.dialects import get_dialect
    from agentic_retriever.mining.gac import GACRequest
    from agentic_retriever.mining.rounds import Round

    dialect = get_dialect("search_r1")
    pool, source = scored_passages(rounds * candidates + 3 * 3 * rounds, corpus)
    thoughts = [" ".join(p.split()[:think_words]) for p in synthetic_passages(4 * rounds, words=think_words, seed=1)]
    requests, used = [], 0
    for r in range(rounds):
        turns, context = r % 3 + 1, ""
        for t in range(turns):
            context += f"<think> {thoughts[4 * r + t]} </think>\n<search> query {t} of question {r} </search>"
            if t < turns - 1:
                context += dialect.format_observation([pool[used:used + 3]])
                used += 3
        round_ = Round(question_id=f"q{r}", question=f"Which passage answers synthetic question number {r}?",
                       golden_answers=(f"answer {r}",), round_index=turns, turn_index=turns - 1,
                       query=f"query {turns - 1} of question {r}", history_queries=(), context=context,
                       turns_used=turns, retriever="synthetic")
        requests.append(GACRequest(round_, tuple(pool[used:used + candidates])))
        used += candidates
    return requests, f"synthetic contexts; candidates and earlier observations: {source}", pool[:3]


def trajectory_requests(path: str, rounds: int, candidates: int, client, max_turns: int):
    """The first `rounds` minable rounds of the trajectories, with `candidates` passages retrieved for each."""
    from agent.trajectory import read_trajectories
    from agentic_retriever.mining.candidates import retrieve_candidates
    from agentic_retriever.mining.gac import GACRequest
    from agentic_retriever.mining.rounds import extract_rounds

    found = []
    for trajectory in read_trajectories(path):
        found.extend(extract_rounds(trajectory, max_turns=max_turns)[0])
        if len(found) >= rounds:
            break
    found = found[:rounds]
    if not found:
        raise SystemExit(f"no minable rounds in {path}")
    hits = retrieve_candidates(client, found, candidates)
    return [GACRequest(r, tuple(h)) for r, h in zip(found, hits)], f"{len(found)} rounds of {path}"


def main() -> None:
    from agentic_retriever.base.llm.prefix_cache import DEFAULT_PREFIX_CACHE_TOKENS

    parser = base_parser(__doc__)
    parser.add_argument("--model", default="default", help="agent model (hub name, folder or 'default')")
    parser.add_argument("--trajectories", help="JSONL trajectories to take rounds from; unset: synthetic contexts")
    parser.add_argument("--index", default=str(QUICKSTART_INDEX),
                        help="index for candidates (with --trajectories) and later turns; without it, synthetic "
                             "runs use fixed passages")
    parser.add_argument("--corpus", help="passages for synthetic runs; unset: the quickstart corpus if present, else made-up text")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=8, help="candidate passages per round (mining: 20)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="generated tokens per turn")
    parser.add_argument("--max-turns", type=int, default=4, help="EnvConfig.max_turns of the GAC agent")
    parser.add_argument("--batch-size", type=int, default=16, help="TransformersLLM.max_batch_size")
    parser.add_argument("--prefix-cache-tokens", type=int, default=DEFAULT_PREFIX_CACHE_TOKENS,
                        help="the prefix cache's budget in the 'reuse + cache' contender")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"],
                        help="weights: auto (fp32 on CPU, bf16 on GPU), fp32, bf16, fp16")
    parser.add_argument("--think-words", type=int, default=60, help="synthetic: words per earlier <think>")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each contender")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each contender first")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's); 1 on a busy machine")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from agent.env import EnvConfig
    from agentic_retriever.base.llm import LLMConfig, load_llm
    from agentic_retriever.base.llm.transformers import TransformersLLM
    from agentic_retriever.mining.gac import rollout_gac

    device = describe_device()
    print(device_line(device))
    env = EnvConfig(max_turns=args.max_turns, max_new_tokens_per_turn=args.max_new_tokens)
    client = None
    if Path(args.index).is_dir():
        from agentic_retriever.index import open_index
        from agentic_retriever.retrieval import LocalRetrievalClient

        client = LocalRetrievalClient(open_index(args.index))
    if args.trajectories:
        if client is None:
            raise SystemExit(f"--trajectories needs an index for the candidates: no {args.index}")
        requests, source = trajectory_requests(args.trajectories, args.rounds, args.candidates, client, args.max_turns)
    else:
        requests, source, fixed = synthetic_requests(args.rounds, args.candidates, args.think_words, args.corpus)
        if client is None:
            client = FixedClient(fixed)
    llm = load_llm(LLMConfig(model=args.model, precision=args.precision, max_batch_size=args.batch_size))
    if not isinstance(llm, TransformersLLM):
        raise SystemExit("this benchmark measures the transformers backend")
    pairs = sum(len(r.passages) for r in requests)
    contexts = [len(llm.tokenizer.encode(llm.chat_prompt(_prompt(r.round.question)) + r.round.context,
                                         add_special_tokens=False)) for r in requests]
    print(f"GAC: {len(requests)} rounds x {args.candidates} candidates = {pairs} continuations ({source}); "
          f"round contexts {min(contexts)}-{max(contexts)} tokens (prompt included); model {args.model} on "
          f"{llm.device} ({llm.model.dtype}); max {args.max_turns} turns x {args.max_new_tokens} new tokens; "
          f"batches of {args.batch_size}; later turns: {'index ' + args.index if not isinstance(client, FixedClient) else 'fixed passages'}",
          flush=True)

    last: dict[str, dict] = {}

    def contender(name: str, reuse: bool, cached: bool):
        def run():
            backend = TransformersLLM(llm.model, llm.tokenizer, name=llm.name, max_batch_size=args.batch_size,
                                      reuse_prefix=reuse, prefix_cache_tokens=args.prefix_cache_tokens if cached else 0)
            counted = CountedGenerate(backend.generate)
            backend.generate = counted
            started = time.perf_counter()
            records = rollout_gac(requests, backend, client, env)
            wall = time.perf_counter() - started
            last[name] = {"records": records, "counted": counted, "wall": wall, "stats": backend.prefill_stats}
        return run

    contenders = {"reuse + cache": contender("reuse + cache", True, True), "reuse": contender("reuse", True, False),
                  "recompute": contender("recompute", False, False)}
    seconds = alternate(contenders, args.repeats, args.warmup)
    figures = {}
    for name in contenders:
        run = last[name]
        figures[name] = summarize(seconds[name], pairs) | {
            "generated_tokens": run["counted"].tokens, "generate_calls": run["counted"].calls,
            "generation_share": round(run["counted"].seconds / run["wall"], 3),
            "answers": sum(a is not None for rec in run["records"] for a in rec["answers"]),
            "prompt_tokens": run["stats"].prompt_tokens, "computed_tokens": run["stats"].computed_tokens,
            "cached_tokens": run["stats"].cached_tokens,
        }
        f = figures[name]
        print(f"  {name:<13} {f['median_per_s']:>8.2f} continuations/s (best {f['best_per_s']:.2f}, median "
              f"{f['median_s']:.2f} s)  {f['generated_tokens']} generated tokens in {f['generate_calls']} generate "
              f"calls ({f['generated_tokens'] / f['median_s']:.1f}/s)  prompt tokens {f['prompt_tokens']}: computed "
              f"{f['computed_tokens']}, from the prefix cache {f['cached_tokens']}  generation "
              f"{f['generation_share']:.0%}  {f['answers']} answers", flush=True)
    same = all(last[name]["counted"].generated == last["recompute"]["counted"].generated for name in contenders)
    per_s = {name: f["median_per_s"] for name, f in figures.items()}
    ratios = {"reuse/recompute": per_s["reuse"] / per_s["recompute"],
              "reuse + cache/reuse": per_s["reuse + cache"] / per_s["reuse"],
              "reuse + cache/recompute": per_s["reuse + cache"] / per_s["recompute"]}
    print(f"same generated tokens from all (greedy): {'yes' if same else 'NO (float noise flipped a near-tie)'}")
    for label, value in ratios.items():
        print(f"ratio {label} continuations per second (medians): {value:.2f}x")
    print(f"RATIO reuse/recompute continuations per second (medians): {ratios['reuse/recompute']:.2f}x  [target >= 2x]")
    write_json(args.json, "bench_gac", args, device,
               figures | {"ratios": {k: round(v, 3) for k, v in ratios.items()}, "same_generations": same,
                          "continuations": pairs, "context_tokens": contexts, "source": source})


def _prompt(question: str) -> str:
    from agent.dialects import get_dialect

    return get_dialect("search_r1").build_prompt(question)


if __name__ == "__main__":
    main()
