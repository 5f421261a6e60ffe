"""One generation protocol for every LLM backend (transformers, vLLM, OpenAI-compatible HTTP).

A backend turns a batch of prompts (text, or token ids) and one `SamplingParams` into, per prompt,
`params.n` `Generation`s. The agent environment, the utility miner and the RL trainer see only this
protocol, so the backend is a configuration choice:

    llm = load_llm(LLMConfig(backend="transformers", model="default"))
    outs = llm.generate(["Question: who wrote Hamlet?\n"], SamplingParams(max_new_tokens=32, stop=["</answer>"]))
    outs[0][0].text, outs[0][0].token_ids, outs[0][0].finish_reason

Stop strings follow vLLM's ``include_stop_str_in_output=True``: the text ends right after the first
stop string found in the generated text (Search-R1 keeps ``</search>`` in the response), and
`token_ids` are the generated ids up to and including the token that completed it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Prompt = str | list[int]


@dataclass
class SamplingParams:
    """Sampling settings of one `generate` call (greedy by default: data generation is deterministic)."""

    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # sample among the k likeliest tokens (0: all)
    min_p: float = 0.0  # drop tokens below min_p x the likeliest one's probability
    repetition_penalty: float = 1.0  # vLLM's (1: none); sent to servers so they do not apply the model's own
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    seeds: list[int] | None = None  # one seed per prompt of the call (overrides seed): its samples differ
    logprobs: bool = False  # return the log-probability of every generated token

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.top_k < 0 or not 0 <= self.min_p < 1 or self.repetition_penalty <= 0:
            raise ValueError(f"top_k must be >= 0, min_p in [0, 1) and repetition_penalty > 0; got {self.top_k}, "
                             f"{self.min_p}, {self.repetition_penalty}")

    def prompt_seeds(self, prompts: int) -> list[int | None]:
        """The seed of each of `prompts` prompts: ``seeds`` (which must have one per prompt), else ``seed`` for all.
        vLLM and OpenAI-compatible servers seed each request on its own, so identical prompts with one seed give
        identical samples; per-prompt seeds are how several samples of one question differ there."""
        if self.seeds is None:
            return [self.seed] * prompts
        if len(self.seeds) != prompts:
            raise ValueError(f"SamplingParams.seeds has {len(self.seeds)} seeds for {prompts} prompts")
        return list(self.seeds)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Generation:
    """One sampled continuation of one prompt."""

    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length", "abort"]  # abort: the engine gave up on it (preempted, shut down)
    stop_string: str | None = None  # the stop string that ended it (finish_reason "stop" with no stop string = EOS)
    logprobs: list[float] | None = None  # parallel to token_ids when SamplingParams.logprobs


@runtime_checkable
class LLM(Protocol):
    """What every backend offers."""

    name: str  # model name or path, for artifacts and manifests

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer (token-level bookkeeping of the agent env, SFT, RL)."""
        ...

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Per prompt, `params.n` generations, in prompt order."""
        ...

    def chat_prompt(self, user_message: str) -> str:
        """`user_message` as the model's chat template renders one user turn ready for the assistant's reply
        (with the generation prompt); the message itself when the tokenizer has no chat template."""
        ...

    def close(self) -> None:
        """Let go of the engine and the device memory it holds (every backend is also a context manager that
        closes on exit); the next step's engine, or verl, then finds the device free."""
        ...


def release_device_memory() -> None:
    """Collect garbage and hand cached CUDA memory back to the device (after an engine is let go)."""
    import gc

    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def derived_seed(seed: int, *parts: object) -> int:
    """A seed for one trajectory (e.g. of a question id and a sample number) from a run's `seed`: the same
    parts give the same seed in any batch, different parts practically never collide (31 bits of SHA-256)."""
    text = "|".join(map(str, (seed, *parts)))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


def generate_checked(llm: LLM, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
    """``llm.generate(prompts, params)``, refusing a backend answer that does not give every prompt at least one
    generation (RuntimeError naming the model), so callers can zip the outputs with their prompts."""
    outputs = llm.generate(prompts, params)
    if len(outputs) != len(prompts) or any(not gens for gens in outputs):
        raise RuntimeError(f"{llm.name}: generate returned {len(outputs)} outputs for {len(prompts)} prompts")
    return outputs
