"""Generation through any OpenAI-compatible server (a vLLM server hosting Qwen2.5-72B, SGLang, ...).

`endpoint="completions"` posts prompts (text or token ids) to ``/v1/completions``; `chat_prompt`
renders the chat template locally, so agent code is the same as with the local backends.
`endpoint="chat"` posts each prompt as the one user message of ``/v1/chat/completions`` (the server
applies the template; `chat_prompt` returns the message unchanged; token-id prompts are refused).

Requests run concurrently (`max_concurrency` threads over one HTTP connection pool); a request that
meets a connection error, a timeout, 429 or a 5xx is retried with exponential back-off (honouring
``Retry-After``) until `max_retries` or its `deadline_s` (all attempts and waits together) runs out; any other
error status raises `OpenAIError` with the server's message.

Finished work is kept: with a `reply_store` (mining gives its own, ``stages/llm_replies.jsonl``), every reply is
stored the moment it arrives, keyed by a hash of the URL and the request's whole body (model, prompt, sampling,
seed), and a request whose key is stored is answered from the store without being sent. A call that fails after
hundreds of replies (a server that died, a hung one past its deadline) loses only the requests in flight, and the
same call again, after a restart, sends only those.

Stop strings: requests carry vLLM's ``include_stop_str_in_output``; when a server trims the stop
string anyway but names it (vLLM's ``stop_reason``), it is put back, so the text follows the protocol.
`token_ids` are the returned text tokenized with the model's tokenizer (or `tokenizer`); log-probs are
the server's, one per generated token up to the stop cut (the same count as `token_ids` whenever
re-tokenizing the text reproduces the model's tokens, which holds for the usual BPE tokenizers).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Literal, Protocol

import httpx
from tqdm.auto import tqdm

from ..defaults import resolve_llm_name
from ..fingerprint import stable_hash
from .protocol import Generation, Prompt, SamplingParams
from .text import find_stop, render_chat_prompt

#: Longest wait between two attempts, in seconds.
_MAX_BACKOFF = 60.0


class OpenAIError(RuntimeError):
    """An OpenAI-compatible server refused a request, or kept failing after every retry."""


def request_body(model: str, prompt: Prompt, params: SamplingParams, endpoint: Literal["completions", "chat"],
                 seed: int | None = None) -> dict:
    """The JSON body of one request: `params.n` completions of one prompt, seeded with `seed`. The sampling fields
    OpenAI's API lacks go as vLLM's server reads them (top level): always, since a vLLM server fills a missing one
    from the model's ``generation_config`` (Qwen2.5-Instruct: repetition_penalty 1.05, top_k 20), which our
    in-process backends do not apply."""
    body: dict[str, Any] = {"model": model, "max_tokens": params.max_new_tokens, "temperature": params.temperature,
                            "top_p": params.top_p, "top_k": params.top_k or -1, "min_p": params.min_p,
                            "repetition_penalty": params.repetition_penalty, "n": params.n}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        if params.logprobs:
            body["logprobs"] = True
    else:
        body["prompt"] = prompt
        if params.logprobs:
            body["logprobs"] = 1  # the chosen token's log-prob (plus its top-1 alternative)
    if params.stop:
        body["stop"] = list(params.stop)
        body["include_stop_str_in_output"] = True
    if seed is not None:
        body["seed"] = seed
    return body


def _choice_parts(choice: dict, endpoint: str) -> tuple[str, list[str], list[float]]:
    """(text, token strings, token log-probs) of one choice of either endpoint."""
    logprobs = choice.get("logprobs") or {}
    if endpoint == "chat":
        entries = logprobs.get("content") or []
        text = (choice.get("message") or {}).get("content") or ""
        return text, [e["token"] for e in entries], [e["logprob"] for e in entries]
    return choice.get("text") or "", list(logprobs.get("tokens") or []), list(logprobs.get("token_logprobs") or [])


class ReplyStore(Protocol):
    """Where `OpenAILLM` keeps replies: a durable mapping of key -> reply (mining's `StageStore` is one)."""

    def __contains__(self, key: str) -> bool: ...

    def get(self, key: str) -> Any: ...

    def put(self, records: dict[str, Any]) -> int: ...


def reply_key(url: str, body: dict) -> str:
    """The content key of one request: the canonical hash of the URL and the whole body."""
    return stable_hash({"url": url, "body": body})


class OpenAILLM:
    """The `LLM` protocol over an OpenAI-compatible HTTP server.

        llm = OpenAILLM("Qwen/Qwen2.5-72B-Instruct", base_url="http://gpu-node:8000/v1")
        llm.generate([llm.chat_prompt("Rate this passage ...")], SamplingParams(max_new_tokens=8))
    """

    def __init__(self, model: str, base_url: str = "http://127.0.0.1:8000/v1", api_key_env: str = "OPENAI_API_KEY",
                 endpoint: Literal["completions", "chat"] = "completions", tokenizer: str | None = None,
                 max_concurrency: int = 8, timeout: float = 120.0, max_retries: int = 5, retry_backoff: float = 1.0,
                 progress: bool = False, deadline_s: float = 600.0):
        if endpoint not in ("completions", "chat"):
            raise ValueError(f"unknown endpoint '{endpoint}' (use completions or chat)")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s}")
        self.name = model
        self.endpoint = endpoint
        self.url = base_url.rstrip("/") + ("/chat/completions" if endpoint == "chat" else "/completions")
        self.tokenizer_name = tokenizer or model
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.progress = progress
        self.deadline_s, self.timeout = deadline_s, timeout
        #: Where replies are kept as they arrive (`ReplyStore`; None: nowhere).
        self.reply_store: ReplyStore | None = None
        headers = {"Authorization": f"Bearer {os.environ[api_key_env]}"} if os.environ.get(api_key_env) else {}
        self._client = httpx.Client(timeout=timeout, headers=headers,
                                    limits=httpx.Limits(max_connections=max_concurrency))
        self._tokenizer = None

    @property
    def tokenizer(self):
        """The model's tokenizer, loaded on first use from `tokenizer` (default: the model name)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                self._tokenizer = AutoTokenizer.from_pretrained(resolve_llm_name(self.tokenizer_name))
            except (OSError, ValueError) as error:
                raise OpenAIError(f"cannot load the tokenizer '{self.tokenizer_name}' (needed for token ids and "
                                  f"chat prompts); set the LLM config's `tokenizer` to a local tokenizer folder: "
                                  f"{error}") from error
        return self._tokenizer

    def chat_prompt(self, user_message: str) -> str:
        return user_message if self.endpoint == "chat" else render_chat_prompt(self.tokenizer, user_message)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Per prompt, `params.n` generations, in prompt order (one request per prompt, run concurrently)."""
        for i, prompt in enumerate(prompts):
            if self.endpoint == "chat" and not isinstance(prompt, str):
                raise ValueError(f"prompt {i} is token ids, which the chat endpoint cannot take; "
                                 f"use endpoint=completions")
        bodies = [request_body(self.name, prompt, params, self.endpoint, seed)
                  for prompt, seed in zip(prompts, params.prompt_seeds(len(prompts)))]
        store = self.reply_store
        keys = [reply_key(self.url, body) for body in bodies]
        answers: list[dict | None] = [None] * len(bodies)
        if store is not None:
            answers = [store.get(key) if key in store else None for key in keys]
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            futures = {pool.submit(self._post, body): i for i, body in enumerate(bodies) if answers[i] is None}
            try:
                for future in tqdm(as_completed(futures), total=len(futures), desc="generating", unit=" prompts",
                                   disable=not self.progress):
                    i = futures[future]
                    answers[i] = future.result()
                    if store is not None:
                        store.put({keys[i]: answers[i]})
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        return [self._generations(answer, params, i) for i, answer in enumerate(answers)]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAILLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _post(self, body: dict) -> dict:
        """POST with retries on connection errors, timeouts, 429 and 5xx; the decoded JSON answer."""
        problem, deadline = "", time.monotonic() + self.deadline_s
        for attempt in range(self.max_retries + 1):
            wait = self.retry_backoff * 2 ** attempt
            left = deadline - time.monotonic()
            try:
                response = self._client.post(self.url, json=body, timeout=max(0.001, min(self.timeout, left)))
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError as error:
                        raise OpenAIError(f"{self.url} answered 200 with a body that is not JSON: "
                                          f"{response.text[:300]!r}") from error
                problem = f"HTTP {response.status_code}: {self._message(response)}"
                if response.status_code != 429 and response.status_code < 500:
                    raise OpenAIError(f"{self.url} refused the request ({problem})")
                retry_after = response.headers.get("retry-after", "")
                if retry_after.replace(".", "", 1).isdigit():
                    wait = max(wait, float(retry_after))
            if attempt < self.max_retries:
                wait = min(wait, _MAX_BACKOFF)
                if time.monotonic() + wait >= deadline:
                    raise OpenAIError(f"{self.url} gave no answer within the request's deadline of "
                                      f"{self.deadline_s:g} s ({attempt + 1} attempts; last error: {problem}; LLM "
                                      "setting deadline_s)")
                time.sleep(wait)
        raise OpenAIError(f"{self.url} failed {self.max_retries + 1} times; last error: {problem}")

    @staticmethod
    def _message(response: httpx.Response) -> str:
        """The error message of an OpenAI-style error body, else the start of the body."""
        try:
            error = response.json().get("error")
        except ValueError:
            return response.text[:300]
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        return str(error)[:300] if error else response.text[:300]

    def _generations(self, answer: dict, params: SamplingParams, index: int) -> list[Generation]:
        choices = answer.get("choices")
        if not isinstance(choices, list) or len(choices) != params.n:
            raise OpenAIError(f"{self.url}: the answer to prompt {index} has "
                              f"{len(choices) if isinstance(choices, list) else 'no'} choices, expected {params.n}")
        return [self._generation(choice, params) for choice in sorted(choices, key=lambda c: c.get("index", 0))]

    def _generation(self, choice: dict, params: SamplingParams) -> Generation:
        """One choice as a `Generation`: the stop string restored if trimmed, the text cut after it."""
        text, tokens, token_logprobs = _choice_parts(choice, self.endpoint)
        stop_reason = choice.get("stop_reason")
        if isinstance(stop_reason, str) and stop_reason in params.stop and stop_reason not in text:
            text += stop_reason
        found = find_stop(text, params.stop)
        stop_string = None
        if found is not None:
            end, stop_string = found
            text = text[:end]
        reason = choice.get("finish_reason")
        finish = "abort" if reason == "abort" else "stop" if found is not None or reason != "length" else "length"
        logprobs = None
        if params.logprobs:
            logprobs, start = [], 0
            for token, logprob in zip(tokens, token_logprobs):
                if start >= len(text):
                    break
                logprobs.append(float(logprob))
                start += len(token)
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        return Generation(text, ids, finish, stop_string, logprobs)
