"""The LLM backends against the real vLLM, on the CPU (`make vllm-check`; vLLM's CPU build in its own venv).

Every paper-scale step (rollouts, GAC continuations, the listwise LR scorer, the sub-answers) goes through
`agentic_retriever.base.llm.vllm` or `agentic_retriever.base.llm.openai` against vLLM; the unit tests use fakes.
This runs the real engine on the converted SmolLM2-135M-Instruct of the default stack, each step in its own process
with a timeout:

  a. greedy parity: our vLLM backend and the transformers backend, both in fp32, on the same Search-R1 prompts (token
     ids) with the dialect's stop strings: the share of identical generations and the first divergence;
  b. rollouts: `run_rollouts` of the Search-R1 dialect over our retrieval service, 4 samples a question at
     temperature 1: how many distinct trajectories each question gets (4 expected);
  c. mining with rollout GAC (the agent continues each candidate on vLLM) on a few rounds;
  d. `vllm serve` on loopback: our OpenAI backend runs the listwise LR stage and the sub-answers against it; the
     server's request log shows the sampling fields it applied (repetition_penalty 1.0, not the model's);
  e. throughput of (a) and (b) beside the transformers backend, in the same step.

    python benchmarks/checks/vllm_check.py --out runs/vllm_check      # results.json and results.md there
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common (a check runs as a script)
from _common import check_parser, cpu_model, earlier_steps, enter_check, free_port, run_check_steps, usable_cores

STEPS = {"a": 900, "b": 900, "c": 900, "d": 1200}  # seconds each step may take
QUESTIONS = 6
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 2))


def _model() -> str:
    """The agent: ``--agent`` (e.g. the demo's warm-started SmolLM2, which writes the dialect's tags), else the
    converted SmolLM2-135M-Instruct of the default stack."""
    from agentic_retriever.base.defaults import smollm2_hf_dir

    return os.environ.get("VLLM_CHECK_AGENT") or str(smollm2_hf_dir())


def _vllm_llm(precision: str = "bf16"):
    from agentic_retriever.base.llm import LLMConfig, load_llm

    # vLLM 0.32's CPU build crashes ("CPU Generator does not use offset") rewinding a seeded request's generator
    # after a chunked prefill: sampled rollouts with observations hit it, so prefills are not chunked here
    return load_llm(LLMConfig(backend="vllm", model=_model(), precision=precision, max_model_len=4096,
                              engine_args={"enable_chunked_prefill": False}))


def _transformers_llm():
    from agentic_retriever.base.llm import LLMConfig, load_llm

    return load_llm(LLMConfig(backend="transformers", model=_model(), precision="fp32", device="cpu"))


def prepare(out: Path, questions: int = QUESTIONS) -> dict:
    """`questions` answerable leaf train questions and a MiniLM index of a few hundred passages holding them."""
    from agentic_retriever.base.corpus import split_contents
    from agentic_retriever.base.data.prepare import PrepareConfig, prepare_defaults
    from agentic_retriever.base.encoder import EncoderConfig
    from agentic_retriever.base.jsonl import iter_jsonl, write_jsonl
    from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index

    prepare_defaults(PrepareConfig(out=str(out / "data")))
    rows = [row for _, row in iter_jsonl(out / "data" / "fanoutqa_leaf_train_answerable.jsonl")][:questions]
    titles = {t for row in rows for t in row["supporting_titles"]}
    corpus = [row for _, row in iter_jsonl(out / "data" / "corpus.jsonl")]
    keep = [p for p in corpus if split_contents(p["contents"])[0] in titles] + corpus[:300]
    write_jsonl(out / "qa.jsonl", rows)
    write_jsonl(out / "corpus.jsonl", list({p["id"]: p for p in keep}.values()))
    if not (out / "index" / "manifest.json").is_file():
        build_index(IndexBuildConfig(corpus=str(out / "corpus.jsonl"), out=str(out / "index"),
                                     encoder=EncoderConfig(model="default"), dense=DenseParams(type="flat")))
    return {"questions": len(rows), "passages": len({p["id"] for p in keep})}


def _prompts(llm, out: Path) -> list[list[int]]:
    from agent.env import EnvConfig, Environment
    from agentic_retriever.base.qa_sources import read_qa_rows

    env = Environment(llm.tokenizer, EnvConfig(), llm.chat_prompt)
    return [env.start(row.question).context_ids() for row in read_qa_rows(out / "qa.jsonl")]


def _timed_generate(llm, prompts, params) -> tuple[list, float]:
    llm.generate(prompts[:1], params)  # warm-up (vLLM's first call compiles)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    return outputs, time.perf_counter() - started


def step_a(out: Path) -> dict:
    """Greedy parity and generation throughput, vLLM against transformers."""
    from agentic_retriever.base.llm import SamplingParams

    params = SamplingParams(max_new_tokens=64, stop=["</search>", "</answer>"])
    with _transformers_llm() as reference:
        prompts = _prompts(reference, out)
        expected, reference_s = _timed_generate(reference, prompts, params)
    with _vllm_llm("fp32") as llm:  # the reference's precision: a bf16 engine diverges where logits are close
        got, vllm_s = _timed_generate(llm, prompts, params)
    pairs = [(e[0].text, g[0].text) for e, g in zip(expected, got)]
    same = sum(e == g for e, g in pairs)
    first = next(((i, next(k for k in range(min(len(e), len(g)) + 1) if e[:k + 1] != g[:k + 1]), e, g)
                  for i, (e, g) in enumerate(pairs) if e != g), None)
    tokens = {"transformers": sum(len(e[0].token_ids) for e in expected), "vllm": sum(len(g[0].token_ids) for g in got)}
    return {"ok": same == len(pairs), "identical": f"{same}/{len(pairs)}",
            "finish_reasons": sorted({g[0].finish_reason for g in got}),
            "first_divergence": None if first is None else {"prompt": first[0], "char": first[1],
                                                            "transformers": first[2][:120], "vllm": first[3][:120]},
            "tokens_per_s": {"transformers": round(tokens["transformers"] / reference_s, 1),
                             "vllm": round(tokens["vllm"] / vllm_s, 1)}}


def _service(out: Path):
    from agentic_retriever.index import open_index
    from agentic_retriever.server import ServerThread, create_app

    return ServerThread(create_app(open_index(str(out / "index"))))


def _rollouts(llm, url: str, qa: Path, path: Path) -> tuple[dict, float]:
    from agent.env import EnvConfig
    from agent.rollouts import run_rollouts
    from agent.trajectory import read_trajectories
    from agentic_retriever.base.client import HttpRetrievalClient

    env = EnvConfig(temperature=1.0, max_turns=2, max_new_tokens_per_turn=64)
    started = time.perf_counter()
    run_rollouts(qa, llm, HttpRetrievalClient(url), env, path, batch_size=64, samples=4)
    seconds = time.perf_counter() - started
    texts: dict[str, set[str]] = {}
    for t in read_trajectories(path):
        texts.setdefault(t.question_id, set()).add(t.response_text)
    return {q: len(v) for q, v in texts.items()}, seconds


def step_b(out: Path) -> dict:
    """Sampled rollouts over the service: distinct trajectories per question, trajectories/s on both backends."""
    folder = out / "b"
    folder.mkdir(exist_ok=True)
    for stale in folder.glob("*.jsonl*"):
        stale.unlink()
    with _service(out) as url:
        with _vllm_llm() as llm:
            distinct, vllm_s = _rollouts(llm, url, out / "qa.jsonl", folder / "vllm.jsonl")
        with _transformers_llm() as llm:
            reference, reference_s = _rollouts(llm, url, out / "qa.jsonl", folder / "transformers.jsonl")
    n = 4 * len(distinct)
    return {"ok": all(v == 4 for v in distinct.values()), "distinct_per_question": sorted(distinct.values()),
            "transformers_distinct_per_question": sorted(reference.values()),
            "trajectories_per_s": {"transformers": round(n / reference_s, 2), "vllm": round(n / vllm_s, 2)}}


def step_c(out: Path) -> dict:
    """Rollout GAC on vLLM: the agent continues each round with each candidate."""
    from agentic_retriever.base.client import HttpRetrievalClient
    from agentic_retriever.mining.config import MiningConfig
    from agentic_retriever.mining.pipeline import mine
    from agentic_retriever.mining.selection import SelectionConfig

    config = MiningConfig(num_candidates=5, lr_scorer="retriever", use_sub_answers=False, gac_mode="rollout",
                          skip_hopeless_gac=False, progress=False, plot=False,
                          selection=SelectionConfig(lr_threshold=0, num_negatives=2, negatives="release",
                                                    false_negative_filter=False))
    with _service(out) as url, _vllm_llm() as llm:
        result = mine(str(out / "b" / "vllm.jsonl"), HttpRetrievalClient(url), llm, None, config, str(out / "c"))
    gac = result.stats["gac"]
    return {"ok": gac["candidates"] > 0, "rounds": result.stats["rounds"]["in"], "gac_candidates": gac["candidates"],
            "gac_correct": gac["correct"], "rows": result.stats["rows"]}


def step_d(out: Path) -> dict:
    """`vllm serve` with our OpenAI backend as the listwise LR scorer and the sub-answer writer; the server started
    and stopped as the loop does its step servers (`StepServers`)."""
    from agentic_retriever.app.loop.processes import StepServerSpec, StepServers
    from agentic_retriever.base.client import HttpRetrievalClient
    from agentic_retriever.base.llm import LLMConfig, load_llm
    from agentic_retriever.mining.config import MiningConfig
    from agentic_retriever.mining.pipeline import mine
    from agentic_retriever.mining.selection import SelectionConfig

    port, model = free_port(), _model()
    # the server's module, not the `vllm serve` script: vllm-cpu's distribution is not named vllm, and the script's
    # version lookup fails on it (PackageNotFoundError)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "2048", "--enable-log-requests"]
    server = StepServerSpec("vllm_serve", shlex.join(command), f"http://127.0.0.1:{port}/health", ("mining",),
                            start_timeout_s=STEPS["d"] - 300)
    log_path = out / f"{server.name}.log"
    log_path.unlink(missing_ok=True)  # the request log of this run only
    with StepServers([server], out) as servers:
        started = time.monotonic()
        servers.before("mining")
        up_s = time.monotonic() - started
        scorer = load_llm(LLMConfig(backend="openai", model=model, base_url=f"http://127.0.0.1:{port}/v1",
                                    endpoint="chat", max_concurrency=8, timeout=300))
        config = MiningConfig(num_candidates=5, lr_window=5, lr_scorer="listwise", use_sub_answers=True,
                              progress=False, plot=False,
                              selection=SelectionConfig(use_gac=False, lr_threshold=0, num_negatives=2,
                                                        negatives="release", false_negative_filter=False))
        with _service(out) as url, scorer:
            result = mine(str(out / "b" / "vllm.jsonl"), HttpRetrievalClient(url), None, scorer, config,
                          str(out / "d"))
    logged = log_path.read_text(errors="replace")
    applied = re.findall(r"repetition_penalty=([0-9.]+)", logged)
    lr, sub = result.stats["local_relevance"], result.stats["sub_answers"]
    return {"ok": lr["windows"] > 0 and bool(applied) and set(applied) == {"1.0"}, "server_up_s": round(up_s, 1),
            "lr_windows": lr["windows"], "lr_parse_rate": lr["parse_rate"], "sub_answer_parse_rate": sub["parse_rate"],
            "requests_logged": len(applied), "repetition_penalty_applied": sorted(set(applied)),
            "top_k_applied": sorted(set(re.findall(r"top_k=(-?[0-9]+)", logged))), "rows": result.stats["rows"]}


def markdown(results: dict) -> str:
    lines = [f"vLLM {results['vllm']} on {results['machine']}, SmolLM2-135M-Instruct (fp32 on both backends in a, bf16 "
             "on vLLM elsewhere)", "", "| step | ok | figures | seconds |", "|---|---|---|---|"]
    for name, result in sorted(results["steps"].items()):
        figures = "; ".join(f"{k}: {v}" for k, v in result.items() if k not in ("ok", "seconds"))
        lines.append(f"| {name} | {'yes' if result['ok'] else 'NO'} | {figures} | {result.get('seconds')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = check_parser(__doc__, "runs/vllm_check", STEPS, "abcd", "which steps to run (default: all)",
                        "the agent's model folder (default: the converted SmolLM2)").parse_args()
    out = enter_check(args, "VLLM_CHECK_AGENT", globals())
    if out is None:
        return
    import vllm

    results = {"vllm": vllm.__version__, "agent": _model(), "machine": f"{cpu_model()}, {usable_cores()} CPU cores",
               "data": prepare(out), "steps": earlier_steps(out)}
    run_check_steps(__file__, args.steps, STEPS, out, results, markdown)
    sys.exit(0 if all(r["ok"] for r in results["steps"].values()) else 1)


if __name__ == "__main__":
    main()
