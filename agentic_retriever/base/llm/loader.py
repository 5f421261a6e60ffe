"""`LLMConfig`, the whole configuration surface of every backend, and `load_llm` that builds one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..precision import TORCH_NAMES, Precision, resolve_native
from .prefix_cache import DEFAULT_PREFIX_CACHE_TOKENS
from .protocol import LLM


@dataclass
class LLMConfig:
    """Which LLM to run and how. Fields a backend does not use are ignored by it.

    The agent LLM is the shared ``agent`` setting of a config file (`agentic_retriever.app.config_loader`)."""

    RENAMED: ClassVar[dict[str, str]] = {"dtype": "precision"}

    backend: Literal["transformers", "vllm", "openai"] = dataclasses.field(
        default="transformers", metadata={"help": "transformers (CPU/GPU), vllm (GPU) or openai (HTTP server)"})
    model: str = dataclasses.field(
        default="default", metadata={"help": "hub name, local folder, 'default' (embedded SmolLM2-135M-Instruct), "
                                              "or the served model name (openai)"})
    precision: Precision = dataclasses.field(default="auto", metadata={
        "help": "weights; auto = fp32 on CPU, bf16 (else fp16) on GPU; native = auto on GPU, bf16 on a CPU with AMX, "
                "else fp32; training steps use it as mixed precision"})
    device: str = dataclasses.field(default="auto", metadata={"help": "transformers: auto, cpu, cuda or cuda:N"})
    max_batch_size: int = dataclasses.field(default=16, metadata={"help": "transformers: sequences per batch"})
    progress: bool = dataclasses.field(default=False, metadata={"help": "show a progress bar while generating"})
    base_url: str = dataclasses.field(
        default="http://127.0.0.1:8000/v1", metadata={"help": "openai: server URL up to and including /v1"})
    api_key_env: str = dataclasses.field(
        default="OPENAI_API_KEY", metadata={"help": "openai: environment variable with the API key (unset: none sent)"})
    endpoint: Literal["completions", "chat"] = dataclasses.field(
        default="completions", metadata={"help": "openai: /v1/completions, or /v1/chat/completions (server's template)"})
    tokenizer: str | None = dataclasses.field(
        default=None, metadata={"help": "openai: tokenizer for token ids and chat prompts (default: the model name)"})
    max_concurrency: int = dataclasses.field(default=8, metadata={"help": "openai: requests in flight"})
    timeout: float = dataclasses.field(default=120.0, metadata={"help": "openai: seconds per request"})
    max_retries: int = dataclasses.field(
        default=5, metadata={"help": "openai: retries on 429, 5xx and connection errors"})
    deadline_s: float = dataclasses.field(default=600.0, metadata={
        "help": "openai: longest time one request may take, every attempt and wait included (a hung server is "
                "an error after this long, not after timeout x retries)"})
    retry_backoff: float = dataclasses.field(
        default=1.0, metadata={"help": "openai: first wait in seconds, doubled per retry"})
    gpu_memory_utilization: float = dataclasses.field(
        default=0.85, metadata={"help": "vllm: share of GPU memory to use"})
    tensor_parallel_size: int = dataclasses.field(default=1, metadata={"help": "vllm: GPUs per model"})
    enable_prefix_caching: bool = dataclasses.field(default=True, metadata={
        "help": "vllm and transformers: keep KV caches across calls, so a prompt that starts like an earlier "
                "sequence (an agent's next turn) computes only its new tokens"})
    prefix_cache_tokens: int | None = dataclasses.field(default=None, metadata={
        "help": f"transformers: budget of the prefix cache in tokens, least recently used out first; unset: "
                f"{DEFAULT_PREFIX_CACHE_TOKENS} on a CPU, off on CUDA (where it measured slower)"})
    max_model_len: int | None = dataclasses.field(
        default=None, metadata={"help": "vllm: context length (model's own if unset)"})
    engine_args: dict = dataclasses.field(default_factory=dict, metadata={
        "help": "vllm: further keyword arguments of vllm.LLM, e.g. {\"enable_chunked_prefill\": false} (vLLM 0.32's "
                "CPU build crashes rewinding a seeded request's generator after a chunked prefill)"})

    def __post_init__(self):
        self.precision = resolve_native(self.precision, self.device)


def load_llm(config: LLMConfig) -> LLM:
    """Build the backend `config.backend` names (vLLM is imported only here, when chosen)."""
    if config.backend == "transformers":
        from .transformers import TransformersLLM

        return TransformersLLM.load(config.model, dtype=TORCH_NAMES.get(config.precision, config.precision), device=config.device,
                                    max_batch_size=config.max_batch_size, progress=config.progress,
                                    prefix_cache_tokens=config.prefix_cache_tokens if config.enable_prefix_caching else 0)
    if config.backend == "vllm":
        from .vllm import VLLMLLM

        return VLLMLLM(config.model, dtype=TORCH_NAMES.get(config.precision, config.precision), gpu_memory_utilization=config.gpu_memory_utilization,
                       tensor_parallel_size=config.tensor_parallel_size,
                       enable_prefix_caching=config.enable_prefix_caching, max_model_len=config.max_model_len,
                       progress=config.progress, engine_args=config.engine_args)
    if config.backend == "openai":
        from .openai import OpenAILLM

        return OpenAILLM(config.model, base_url=config.base_url, api_key_env=config.api_key_env,
                         endpoint=config.endpoint, tokenizer=config.tokenizer, max_concurrency=config.max_concurrency,
                         timeout=config.timeout, max_retries=config.max_retries, retry_backoff=config.retry_backoff,
                         progress=config.progress, deadline_s=config.deadline_s)
    raise ValueError(f"unknown LLM backend '{config.backend}' (use transformers, vllm or openai)")
