"""`agentic-retriever loop plan`: the hours and GPU-hours of each step of one iteration, before a run.

The work of each step comes from the loop's own settings: verl's steps x prompts x samples (step 1); the mining
questions rolled out once, with the mining plan's assumptions for their length (step 2); the mining plan of
`mine run --plan.only` (step 3: requests and tokens per stage, `mining.plan`); its rounds as an upper bound of the
training rows, times (1 + negatives) passages and the epochs (step 4); the corpus (step 5); the evaluation's
trajectories (step 6). Each is divided by a per-GPU throughput of `RATES` (the user overrides any of them; encoding
and training are e5-base-v2's, moved to the config's retriever by its size: `_retriever_rates`), on the
GPUs the step gets of ``--gpus`` under ``loop.placement: ray`` (docs/loop.md, "The GPU plan"): verl, rollouts and
evaluation on all of them; mining's scorer on the GPUs its ``loop.step_servers`` entry names and the GAC shards on the
rest, the two at once (the step takes the longer); retriever training and encoding on the loop's node. Each
step's price is its entry of `PRICES`, by its name in `steps.STEPS`; a step without one is listed as not priced.

The throughputs are estimates with their sources, not measurements of this library on those GPUs (none was made:
no such GPU here). Each says whether it is published, ours, or derived, and how.

    plan = plan_loop(job, gpus=8, gpu_type="H100")
    print(plan_table(plan))

The plan also gives the retriever's GPU memory (`retriever_cost.retriever_memory`): the service's query encoder and
index, and training per GPU with full fine-tuning and with LoRA.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import LoopJob
from .processes import step_server_specs
from .retriever_cost import REFERENCE, EncoderShape, encoder_shape, retriever_memory
from .steps import STEPS

__all__ = ["PRICES", "RATES", "Priced", "Rate", "plan_loop", "plan_table"]


@dataclass(frozen=True)
class Rate:
    """A per-GPU throughput: its value, unit and where it comes from."""

    value: float
    unit: str
    source: str


#: Parameters of the paper's models (Qwen2.5 model cards: 7.61B and 72.7B).
_PARAMS_7B, _PARAMS_72B = 7.61e9, 72.7e9
#: Share of a GPU's dense bf16 peak that prefill is assumed to reach (long prompts, large batches).
_PREFILL_UTILISATION = 0.4
#: Published: Lambda's vLLM benchmark of A100-80G and H100-80G SXM ("H100 offers ~2x better throughput and lower
#: latency than A100", github.com/LambdaLabsML/vllm-benchmark, benchmark_v0.md).
_H100_OVER_A100 = 2.0
_S3 = ("s3 (arXiv 2505.14146), Table 4: Search-R1 PPO of a 7B model at 1.8 min a step with batch 120 on five "
       "A100-80G: 1.8 x 60 x 5 / 120 = 4.5 GPU-s a sequence (rollout with search, reference, critic and update)")
_DECODE_A100 = ("published: DeepSeek-R1-Distill-Qwen-7B (Qwen2.5-7B's architecture) on one A100-80G with vLLM's "
                "default configuration, 3,363 generated tokens/s (collected at morphllm.com/vllm-benchmarks)")
_OURS_H200 = ("ours: MiniLM-L6 fp16 on one H200 (benchmarks/RESULTS.md, \"The GPU check on one H200\", "
              "`make gpu-check`)")
#: e5-base-v2 on an H100 (derivations in `_rates_h100`): MiniLM-L6 (6 layers of 384) against e5-base-v2 (12 of
#: 768) is 8x the FLOPs a token, and the H200 has the H100's chip (GH100, 989 dense bf16 TFLOPS).
_ENCODE_H100 = 4124.0 / 8
_TRAIN_H100 = 1600.0 / 8 * (128 / 160) * 0.75


def _rates_a100() -> dict[str, Rate]:
    prefill = 312e12 * _PREFILL_UTILISATION
    return {
        "rl_seconds_per_sequence": Rate(4.5, "GPU-seconds per RL sequence (7B PPO)", _S3),
        "llm_7b_prefill": Rate(prefill / (2 * _PARAMS_7B), "prompt tokens/s per GPU",
                               f"derived: A100's 312 dense bf16 TFLOPS x {_PREFILL_UTILISATION:g} / 2 FLOPs x 7.61B "
                               "parameters a token"),
        "llm_7b_decode": Rate(3363.0, "generated tokens/s per GPU", _DECODE_A100),
        "llm_72b_prefill": Rate(prefill / (2 * _PARAMS_72B), "prompt tokens/s per GPU (TP 4)",
                                f"derived: as llm_7b_prefill for 72.7B parameters, {_PREFILL_UTILISATION:g} of the "
                                "peak on each of the tensor-parallel GPUs"),
        "llm_72b_decode": Rate(3363.0 * _PARAMS_7B / _PARAMS_72B, "generated tokens/s per GPU (TP 4)",
                               "derived: llm_7b_decode x 7.61 / 72.7 (decoding reads every weight once a step: "
                               "bandwidth-bound, so inversely proportional to the parameters per GPU-second)"),
        "encode": Rate(_ENCODE_H100 / _H100_OVER_A100, "passages/s per GPU (e5-base-v2 fp16)",
                       "derived: encode on H100 / 2 (Lambda's H100-over-A100 factor)"),
        "train": Rate(_TRAIN_H100 / _H100_OVER_A100, "passages/s per GPU (e5-base-v2 contrastive training)",
                      "derived: train on H100 / 2 (Lambda's H100-over-A100 factor)"),
    }


def _rates_h100() -> dict[str, Rate]:
    a100 = _rates_a100()
    lambda_ = "(Lambda's vLLM benchmark: H100-80G SXM ~2x A100-80G, github.com/LambdaLabsML/vllm-benchmark)"
    scaled = {key: Rate(rate.value / _H100_OVER_A100, rate.unit, f"{rate.source}; halved on an H100 {lambda_}")
              if key == "rl_seconds_per_sequence" else
              Rate(rate.value * _H100_OVER_A100, rate.unit, f"{rate.source}; doubled on an H100 {lambda_}")
              for key, rate in a100.items() if key not in ("encode", "train")}
    return scaled | {
        "encode": Rate(_ENCODE_H100, "passages/s per GPU (e5-base-v2 fp16)",
                       f"derived from {_OURS_H200}: 4,124 passages/s / 8 (e5-base-v2 has 8x MiniLM-L6's FLOPs a "
                       "token); the H200 has the H100's chip"),
        "train": Rate(_TRAIN_H100, "passages/s per GPU (e5-base-v2 contrastive training)",
                      f"derived from {_OURS_H200}: training at 200 queries/s x 8 passages of 128 tokens = 1,600 "
                      "passages/s, / 8 (e5-base-v2's FLOPs), x 128/160 (wiki-18 passages of about 160 tokens), "
                      "x 0.75 (gradient checkpointing recomputes the forward pass)"),
    }


#: Per-GPU throughputs by GPU type (`Rate`: value, unit, source). `plan_loop(..., overrides=...)` replaces any.
RATES: dict[str, dict[str, Rate]] = {"A100": _rates_a100(), "H100": _rates_h100()}
#: Published: LoRA trained GPT-3 175B 25% faster than full fine-tuning ("LoRA", arXiv 2106.09685, section 4.2).
_LORA_SPEEDUP = 1.25
#: Forward passes' worth of FLOPs in a training step with gradient checkpointing: forward 1, backward 2 (Kaplan et
#: al.'s 6N a token against 2N), the checkpointed forward again 1.
_TRAIN_FORWARDS = 4
#: GPU memory of the GPU types (GiB as the cards report it: 80 GB cards).
GPU_MEMORY_GIB = {"A100": 79.2, "H100": 79.2}


def _retriever_rates(rates: dict[str, Rate], job: LoopJob, shape: EncoderShape) -> dict[str, Rate]:
    """The encoding and training throughputs of `rates` (e5-base-v2's) for the config's retriever, of `shape`.

    A passage costs a fixed time whatever the model (tokenising, moving, Python: e5-base-v2's time less its
    compute) plus its model's compute: passage tokens x parameters outside the embeddings, at the FLOPs a GPU
    reaches in the 7B prefill of the same table (``llm_7b_prefill``: a prefill is this forward pass). Training
    counts `_TRAIN_FORWARDS` forwards a passage, and LoRA's compute its published speed-up."""
    model, tokens = job.train.encoder.model, job.mine.plan.passage_tokens
    reference = encoder_shape(REFERENCE)
    flops_rate = rates["llm_7b_prefill"].value * _PARAMS_7B  # parameter-tokens a second: 2x that in FLOPs

    def forward_s(parameters: int) -> float:
        return tokens * parameters / flops_rate

    out = dict(rates)
    for key, forwards in (("encode", 1), ("train", _TRAIN_FORWARDS)):
        lora = key == "train" and job.train.lora.rank
        if shape.body_parameters == reference.body_parameters and not lora:
            continue
        rate = rates[key]
        fixed = max(0.0, 1 / rate.value - forwards * forward_s(reference.body_parameters))
        compute = forwards * forward_s(shape.body_parameters) / (_LORA_SPEEDUP if lora else 1)
        unit = rate.unit.replace("e5-base-v2 fp16", f"{model} 16-bit").replace("e5-base-v2", model) \
            + (f", LoRA r={job.train.lora.rank}" if lora else "")
        out[key] = Rate(1 / (fixed + compute), unit,
                        f"derived: {fixed * 1e3:.2f} ms a passage whatever the model (1 / e5-base-v2's {key} rate, "
                        f"{rate.value:,.0f} passages/s, less its compute) + {compute * 1e3:.2f} ms of {model}'s "
                        f"compute ({forwards} forward(s) of {tokens} tokens x {shape.body_parameters / 1e6:,.0f}M "
                        "parameters outside the embeddings at llm_7b_prefill's FLOPs"
                        + (f", / {_LORA_SPEEDUP:g} for LoRA (Hu et al., arXiv 2106.09685, section 4.2)" if lora else "")
                        + f"). e5-base-v2's rate: {rate.source}")
    return out


#: Tokens of Search-R1's instruction and a question, before the agent's turns.
_INSTRUCTION_TOKENS = 250


def _questions(spec: str, given: int) -> int:
    """The questions of the QA set `spec` (read as `mine run --plan.qa` reads it), or `given` when it is not here."""
    from agentic_retriever.base.qa_sources import read_qa_source_rows

    if given:
        return given
    if spec:
        try:
            return len(read_qa_source_rows(spec))
        except FileNotFoundError:
            pass
    raise ValueError(f"loop plan: the questions {spec or '(loop.mining_qa)'} are not here; give their number "
                     "(--questions N)")


def _passages(corpus: str, given: int) -> int:
    if given:
        return given
    if corpus and Path(corpus).is_file():
        with open(corpus, encoding="utf-8") as rows:
            return sum(1 for line in rows if line.strip())
    raise ValueError(f"loop plan: the corpus {corpus or '(index_build.corpus)'} is not here; give its passages "
                     "(--corpus-passages N)")


def _trajectory_tokens(job: LoopJob) -> tuple[float, float]:
    """(prompt tokens prefilled, tokens generated) of one trajectory, by the mining plan's assumptions: each turn's
    prompt extends the last (a prefix cache prefills only what is new), searches x topk passages come back."""
    plan, searches = job.mine.plan, job.mine.plan.searches_per_question
    generated = (searches + 1) * plan.turn_tokens
    return _INSTRUCTION_TOKENS + generated + searches * job.rollout.env.topk * plan.passage_tokens, generated


def _millions(tokens: float) -> str:
    return f"{tokens / 1e6:,.0f}M" if tokens >= 1e7 else f"{tokens / 1e6:,.2f}M"


def _llm_seconds(prompt: float, generated: float, rates: dict[str, Rate], size: str) -> float:
    return prompt / rates[f"llm_{size}_prefill"].value + generated / rates[f"llm_{size}_decode"].value


@dataclass(frozen=True)
class Priced:
    """One step's price: its `work` in words, `gpu_seconds` of it spread on `on` GPUs (or taking `hours`, when its
    parts do not spread evenly), the throughputs used (`rates`), `how` it runs, and what bounds it."""

    work: str
    gpu_seconds: float
    on: int
    rates: tuple[str, ...]
    hours: float | None = None
    how: str = ""
    bound_by: str = ""


@dataclass
class _Planning:
    """What the steps' prices read: the job, the GPUs (all of them, and the loop's node), the throughputs, the
    mining questions, one trajectory's tokens, and the corpus size given on the command line (0: counted)."""

    job: LoopJob
    gpus: int
    node: int
    rates: dict[str, Rate]
    questions: int
    corpus_passages: int

    @functools.cached_property
    def trajectory(self) -> tuple[float, float]:
        return _trajectory_tokens(self.job)

    @functools.cached_property
    def mining(self) -> dict[str, Any]:
        """The mining plan of `mine run --plan.only` for the loop's questions (tokens counted as characters / 4)."""
        from agentic_retriever.mining.plan import plan_mining, token_counter

        count, _ = token_counter("")
        return plan_mining(self.job.mine.mining, [], self.questions, self.job.mine.plan, count, count,
                           {"scorer": "characters / 4", "agent": "characters / 4"})


def _price_agent(p: _Planning) -> Priced:
    rl = p.job.agent_train
    sequences = rl.steps * rl.prompts_per_step * (rl.samples_per_prompt if rl.algorithm == "grpo" else 1)
    return Priced(f"{rl.steps} steps x {rl.prompts_per_step} prompts"
                  + (f" x {rl.samples_per_prompt} samples" if rl.algorithm == "grpo" else "")
                  + f" = {sequences:,} sequences", sequences * p.rates["rl_seconds_per_sequence"].value, p.gpus,
                  ("rl_seconds_per_sequence",), how="verl")


def _price_trajectories(p: _Planning) -> Priced:
    prompt, generated = p.trajectory
    return Priced(f"{p.questions:,} trajectories of ~{prompt:,.0f} prompt + {generated:,.0f} generated tokens",
                  p.questions * _llm_seconds(prompt, generated, p.rates, "7b"), p.gpus,
                  ("llm_7b_prefill", "llm_7b_decode"))


def _price_mining(p: _Planning) -> Priced:
    stages = p.mining["stages"]
    scorer_tokens = [sum(stages.get(s, {}).get(k, 0) for s in ("sub_answers", "local_relevance"))
                     for k in ("prompt_tokens", "completion_tokens")]
    gac = stages.get("gac", {})
    scorer_s = _llm_seconds(*scorer_tokens, p.rates, "72b")
    gac_s = _llm_seconds(gac.get("prompt_tokens", 0), gac.get("completion_tokens", 0), p.rates, "7b")
    scorer_gpus = sum(spec.gpu_count for spec in step_server_specs(p.job.loop.step_servers, STEPS)
                      if "mining" in spec.steps)
    if scorer_gpus and scorer_gpus >= p.gpus:
        raise ValueError(f"loop plan: the mining servers take {scorer_gpus} GPUs, leaving none of {p.gpus} for shards")
    shards = p.gpus - scorer_gpus
    # a scorer server on GPUs of its own runs beside the shards; without one (no mining server with GPUs), the
    # scorer's work is counted on the shards' GPUs
    scorer_where = f"on {scorer_gpus} GPUs" if scorer_gpus else "on the shards' GPUs"
    hours = (max(scorer_s / scorer_gpus, gac_s / shards) if scorer_gpus else (scorer_s + gac_s) / shards) / 3600
    bound_by = ("the scorer" if scorer_s / scorer_gpus > gac_s / shards else "the GAC shards") if scorer_gpus else ""
    return Priced(f"{p.mining['rounds']:,} rounds: {_millions(scorer_tokens[0])} prompt + "
                  f"{_millions(scorer_tokens[1])} generated tokens to the scorer {scorer_where}, "
                  f"{_millions(gac.get('prompt_tokens', 0))} + {_millions(gac.get('completion_tokens', 0))} to GAC "
                  f"engines on {shards}", scorer_s + gac_s, p.gpus,
                  ("llm_72b_prefill", "llm_72b_decode", "llm_7b_prefill", "llm_7b_decode"), hours=hours,
                  bound_by=bound_by)


def _price_retriever(p: _Planning) -> Priced:
    train, negatives, rounds = p.job.train, p.job.mine.mining.selection.num_negatives, p.mining["rounds"]
    passages = rounds * (1 + negatives) * train.epochs
    return Priced(f"at most {rounds:,} rows x {1 + negatives} passages x {train.epochs:g} epochs = "
                  f"{passages / 1e6:,.1f}M passages", passages / p.rates["train"].value, p.node, ("train",))


def _price_index(p: _Planning) -> Priced:
    corpus = _passages(p.job.index.corpus, p.corpus_passages)
    return Priced(f"{corpus:,} passages", corpus / p.rates["encode"].value, p.node, ("encode",))


def _price_evaluate(p: _Planning) -> Priced:
    evaluated = 2 * p.job.loop.eval.agent_questions
    return Priced(f"{evaluated:,} trajectories (Agent_i with each retriever)",
                  evaluated * _llm_seconds(*p.trajectory, p.rates, "7b"), p.gpus, ("llm_7b_prefill", "llm_7b_decode"))


#: The price of each step of `steps.STEPS`, by name; a step without one is listed as not priced.
PRICES: dict[str, Callable[[_Planning], Priced]] = {
    "agent": _price_agent, "trajectories": _price_trajectories, "mining": _price_mining,
    "retriever": _price_retriever, "index": _price_index, "evaluate": _price_evaluate}


def _row(number: int, name: str, priced: Priced | None) -> dict[str, Any]:
    """Step `name` (labelled by its place in `STEPS`, and how it runs) as a row of the plan: its GPU-hours are
    its hours times the GPUs it holds."""
    label = f"{number} {name}" + (f" ({priced.how})" if priced and priced.how else "")
    if priced is None:
        return {"step": label, "work": "not priced (no entry in loop.plan.PRICES)", "gpus": 0, "hours": 0.0,
                "gpu_hours": 0.0, "rates": []}
    hours = priced.hours if priced.hours is not None else priced.gpu_seconds / priced.on / 3600
    return {"step": label, "work": priced.work, "gpus": priced.on, "hours": hours, "gpu_hours": hours * priced.on,
            "rates": list(priced.rates)} | ({"bound_by": priced.bound_by} if priced.bound_by else {})


def plan_loop(job: LoopJob, gpus: int, gpu_type: str = "H100", gpus_per_node: int = 8, questions: int = 0,
              corpus_passages: int = 0, overrides: dict[str, float] | None = None) -> dict[str, Any]:
    """The plan of one iteration of `job` on `gpus` GPUs of `gpu_type` (nodes of `gpus_per_node`): per step its
    work, the GPUs it holds, hours and GPU-hours (hours x GPUs held), and the throughputs used with their sources."""
    if gpu_type not in RATES:
        raise ValueError(f"loop plan: no throughputs for GPU type {gpu_type!r} (known: {', '.join(RATES)}); give "
                         "each with --throughput KEY=VALUE on a known type")
    shape = encoder_shape(job.train.encoder.model)
    rates = _retriever_rates(RATES[gpu_type], job, shape)
    for key, value in (overrides or {}).items():
        if key not in rates:
            raise ValueError(f"loop plan: unknown throughput {key!r} (known: {', '.join(rates)})")
        rates[key] = Rate(float(value), rates[key].unit, "given on the command line")
    planning = _Planning(job, gpus, min(gpus, gpus_per_node), rates, _questions(job.loop.mining_qa, questions),
                         corpus_passages)
    steps = [_row(number, name, PRICES[name](planning) if name in PRICES else None)
             for number, name in enumerate(STEPS, 1)]
    memory = retriever_memory(shape, job, planning.node, _passages(job.index.corpus, corpus_passages))
    return {"gpus": gpus, "gpu_type": gpu_type, "gpus_per_node": gpus_per_node, "questions": planning.questions,
            "retriever": memory | {"gpu_memory_gib": GPU_MEMORY_GIB[gpu_type]}, "steps": steps,
            "hours": sum(s["hours"] for s in steps),
            "gpu_hours": sum(s["gpu_hours"] for s in steps),
            "iterations": job.loop.iterations, "rates": {k: vars(r) for k, r in rates.items()},
            "mining_plan": planning.mining}


def plan_table(plan: dict[str, Any]) -> str:
    """The plan as Markdown: one row a step, the totals, then each throughput with its source."""
    lines = [f"One iteration on {plan['gpus']} x {plan['gpu_type']} ({math.ceil(plan['gpus'] / plan['gpus_per_node'])}"
             f" node(s) of {plan['gpus_per_node']}), {plan['questions']:,} mining questions", "",
             "| step | work | GPUs | GPU-hours | hours |", "|---|---|---|---|---|"]
    for s in plan["steps"]:
        bound = f" (bound by {s['bound_by']})" if "bound_by" in s else ""
        lines.append(f"| {s['step']} | {s['work']} | {s['gpus']} | {s['gpu_hours']:,.1f} | {s['hours']:,.1f}{bound} |")
    lines += [f"| iteration | | | {plan['gpu_hours']:,.0f} | {plan['hours']:,.1f} ({plan['hours'] / 24:,.1f} days) |",
              "", f"{plan['iterations']} iterations: {plan['hours'] * plan['iterations']:,.0f} hours, "
              f"{plan['gpu_hours'] * plan['iterations']:,.0f} GPU-hours.", "", "Throughputs per GPU:", ""]
    for key, rate in plan["rates"].items():
        value = f"{rate['value']:,.2f}" if rate["value"] < 10 else f"{rate['value']:,.0f}"
        lines.append(f"- `{key}` = {value} {rate['unit']}: {rate['source']}")
    return "\n".join(lines + [""] + _retriever_lines(plan["retriever"])) + "\n"


def _retriever_lines(memory: dict[str, Any]) -> list[str]:
    """The retriever's GPU memory as Markdown (`retriever_cost.retriever_memory`), each figure against a card."""
    card = memory["gpu_memory_gib"]
    checkpointing = "with gradient checkpointing" if memory["checkpointing"] else "without gradient checkpointing"
    lines = [f"Retriever {memory['encoder']}: {memory['parameters'] / 1e6:,.0f}M parameters "
             f"({memory['body_parameters'] / 1e6:,.0f}M outside the embeddings), {memory['dim']}-d vectors "
             f"(shape from {memory['source']}). GPU memory, of {card:g} GiB a card (retriever_cost's terms and "
             "sources):", "", "| what | GiB per GPU | on GPU 0, beside the service | fits |", "|---|---|---|---|",
             f"| service: query encoder on GPU 0 (16-bit) | {memory['service_encoder_gib']:,.1f} | | |",
             f"| service: Flat index in fp16 over the node's GPUs (loop.service.index_gpu on) | "
             f"{memory['index_per_gpu_gib']:,.1f} | {memory['service_gib']:,.1f} | |"]
    for name, row in memory["training"].items():
        mark = " (the config)" if name == memory["chosen"] else ""
        beside = row["total_gib"] + memory["service_gib"]
        lines.append(f"| training, {name}{mark}: {row['states_gib']:,.1f} model states + "
                     f"{memory['activations_gib']:,.1f} activations | {row['total_gib']:,.1f} | {beside:,.1f} | "
                     f"{'yes' if beside <= card else 'no'} |")
    lines += ["", f"Activations: {memory['tokens_in_flight']:,} tokens in flight ({memory['in_flight']}), "
              f"{checkpointing}."]
    return lines
