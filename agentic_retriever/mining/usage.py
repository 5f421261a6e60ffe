"""What the LLMs cost: a pass-through `LLM` wrapper that counts calls, sequences and tokens.

Mining reports the calls and tokens each stage spent (mining_stats.json). The stages see the scorer and
agent LLMs only through `CountingLLM`, which forwards everything (generation, ``score``, chat template,
tokenizer, name) and counts on the way:

* ``calls``: `generate` and ``score`` calls; ``sequences``: prompts (x n samples) or scored pairs;
* ``prompt_tokens``: token-id prompts by length, text prompts through the tokenizer when there is one
  (otherwise they are not counted and ``prompt_tokens_exact`` turns False);
* ``completion_tokens``: generated tokens (scored continuation tokens for ``score``).

It also computes the model's content fingerprint once (``fingerprint``), which the stages key their results on.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from agentic_retriever.base.fingerprint import llm_fingerprint
from agentic_retriever.base.llm.protocol import Generation, Prompt, SamplingParams

__all__ = ["CountingLLM", "Usage"]


@dataclass
class Usage:
    calls: int = 0
    sequences: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_exact: bool = True

    def as_dict(self) -> dict:
        return asdict(self)

    def minus(self, earlier: Usage) -> Usage:
        return Usage(self.calls - earlier.calls, self.sequences - earlier.sequences,
                     self.prompt_tokens - earlier.prompt_tokens, self.completion_tokens - earlier.completion_tokens,
                     self.prompt_tokens_exact and earlier.prompt_tokens_exact)

    def copy(self) -> Usage:
        return Usage(**asdict(self))


class CountingLLM:
    """`llm` with a running `Usage` (see the module docstring)."""

    def __init__(self, llm):
        self.llm = llm
        self.usage = Usage()

    @property
    def name(self) -> str:
        return self.llm.name

    @functools.cached_property
    def fingerprint(self) -> str:
        """The model's content fingerprint (`fingerprint.llm_fingerprint`), computed once: the stages' cache keys."""
        return llm_fingerprint(self.llm)

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    def chat_prompt(self, user_message: str) -> str:
        return self.llm.chat_prompt(user_message)

    @property
    def can_score(self) -> bool:
        return callable(getattr(self.llm, "score", None))

    def _prompt_tokens(self, prompt: Prompt) -> int:
        if not isinstance(prompt, str):
            return len(prompt)
        tokenizer = getattr(self.llm, "tokenizer", None)
        if tokenizer is None:
            self.usage.prompt_tokens_exact = False
            return 0
        return len(tokenizer.encode(prompt, add_special_tokens=False))

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        outputs = self.llm.generate(prompts, params)
        self.usage.calls += 1
        self.usage.sequences += len(prompts) * params.n
        self.usage.prompt_tokens += sum(self._prompt_tokens(p) for p in prompts) * params.n
        self.usage.completion_tokens += sum(len(g.token_ids) for gens in outputs for g in gens)
        return outputs

    def score(self, prompts: Sequence[Prompt], continuations: Sequence[Sequence[int] | str]) -> list[list[float]]:
        if not self.can_score:
            raise TypeError(f"{self.llm.name}: this LLM backend has no score() (log-probabilities of given "
                            f"continuations); the likelihood scorers need the transformers backend")
        scores = self.llm.score(prompts, continuations)
        self.usage.calls += 1
        self.usage.sequences += len(prompts)
        self.usage.prompt_tokens += sum(self._prompt_tokens(p) for p in prompts)
        self.usage.completion_tokens += sum(len(s) for s in scores)
        return scores
