"""Generation with vLLM on GPUs (the paper-scale agent and scorer), prefix caching on.

vLLM is an optional extra, imported only when this backend is built. Its stop handling already is the
protocol's (``include_stop_str_in_output=True``: the text ends right after the stop string, the token ids
end with the token that completed it); n samples, per-request seeds and the chosen tokens' log-probs
(``logprobs=0``, of the model's temperature-1 distribution with vLLM's default ``logprobs_mode``) map
one to one. Automatic prefix caching shares the KV cache of a common context across requests, which is
what the utility miner's 20 continuations of one agent context need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..defaults import resolve_llm_name
from .protocol import Generation, Prompt, SamplingParams, release_device_memory
from .text import render_chat_prompt

INSTALL_HINT = "pip install 'agentic-retriever[vllm]'"


def import_vllm():
    """The `vllm` module, or an ImportError that names the extra to install."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(f"the vllm backend needs vLLM, which is not installed: {INSTALL_HINT} "
                          f"(it needs a CUDA build of torch); or use backend=transformers ({error})") from error
    return vllm


def sampling_kwargs(params: SamplingParams, seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` that implement `params` for one prompt seeded with `seed`."""
    return {
        "n": params.n,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k or -1,  # vLLM: -1 (or 0) considers every token
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "stop": list(params.stop),
        "include_stop_str_in_output": True,
        "seed": seed,
        "logprobs": 0 if params.logprobs else None,  # 0: only the chosen token's log-prob
        "skip_special_tokens": True,
    }


def vllm_prompt(prompt: Prompt) -> str | dict[str, list[int]]:
    """A prompt as vLLM takes it: text as is, token ids as a ``TokensPrompt`` dict."""
    return prompt if isinstance(prompt, str) else {"prompt_token_ids": list(prompt)}


def to_generation(completion, want_logprobs: bool) -> Generation:
    """A vLLM ``CompletionOutput`` (text, token_ids, finish_reason, stop_reason, logprobs) as a `Generation`."""
    token_ids = list(completion.token_ids)
    logprobs = None
    if want_logprobs:
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, token_ids)]
    stop_string = completion.stop_reason if isinstance(completion.stop_reason, str) else None
    finish = completion.finish_reason if completion.finish_reason in ("length", "abort") else "stop"
    return Generation(completion.text, token_ids, finish, stop_string, logprobs)


class VLLMLLM:
    """The `LLM` protocol over an in-process ``vllm.LLM`` engine."""

    def __init__(self, model: str = "default", dtype: str = "auto", gpu_memory_utilization: float = 0.85,
                 tensor_parallel_size: int = 1, enable_prefix_caching: bool = True, max_model_len: int | None = None,
                 progress: bool = False, engine_args: dict | None = None):
        self._vllm = import_vllm()
        self.name = model
        self.progress = progress
        self.engine = self._vllm.LLM(model=resolve_llm_name(model), dtype=dtype,
                                     gpu_memory_utilization=gpu_memory_utilization,
                                     tensor_parallel_size=tensor_parallel_size,
                                     enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len,
                                     **(engine_args or {}))

    @property
    def tokenizer(self):
        return self.engine.get_tokenizer()

    @property
    def max_context(self) -> int | None:
        """The engine's context length (``max_model_len``): a longer prompt is refused by vLLM, request by request."""
        config = getattr(getattr(self.engine, "llm_engine", None), "model_config", None)
        return getattr(config, "max_model_len", None)

    def close(self) -> None:
        """Shut the engine down and free its GPU memory: ``LLM.shutdown()`` where the installed vLLM has it,
        then vLLM's ``cleanup_dist_env_and_memory`` (its distributed state, garbage, the CUDA cache)."""
        engine, self.engine = self.engine, None
        if engine is None:
            return
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del engine
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        except ImportError:
            release_device_memory()
        else:
            cleanup_dist_env_and_memory()

    def __enter__(self) -> VLLMLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def chat_prompt(self, user_message: str) -> str:
        return render_chat_prompt(self.tokenizer, user_message)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Per prompt, `params.n` generations, in prompt order (vLLM schedules the whole list at once)."""
        per_prompt = [self._vllm.SamplingParams(**sampling_kwargs(params, seed))
                      for seed in params.prompt_seeds(len(prompts))]
        outputs = self.engine.generate([vllm_prompt(p) for p in prompts], per_prompt, use_tqdm=self.progress)
        return [[to_generation(c, params.logprobs) for c in output.outputs] for output in outputs]
