"""Automatic prefix caching for the transformers backend: the KV cache of finished sequences (and of the shared
prefixes a batch computed once) kept across batches and `generate`/`score` calls, keyed by their token ids, so
that a later prompt starting with a cached sequence prefills only the tokens after it.

An agent's next turn is its previous prompt + the turn it generated + the observation the environment
inserted (`agent.env.rollout`); without this cache, every turn recomputes the whole context, and on a
compute-bound CPU that prefill, not decoding, bounds what batching gains. This is vLLM's automatic prefix
caching at the granularity of whole sequences rather than blocks: a prompt reuses the longest token prefix
it shares with any entry (an entry it extends, or the instructions it shares with another question's
prompt), and the KV cache of a prefix does not depend on what follows it in a causal LM.

    cache = PrefixCache(max_tokens=32768)
    cache.store(prompt_ids + generated_ids[:-1], kv)      # kv: [layers, 2, kv heads, tokens, head dim]
    kv, length = cache.longest(next_prompt_ids, limit=len(next_prompt_ids) - 1)
    # kv[..., :length, :] is the KV cache of next_prompt_ids[:length]

Entries are evicted least recently used (a hit counts as a use) under a budget of `max_tokens` tokens
summed over entries; storing a sequence drops the entries it extends (an agent's earlier turns), so one
trajectory holds one entry. The cache cannot see the weights that computed an entry: its owner clears it
when they change (`TransformersLLM` does so when a parameter is updated or replaced).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .batching import shared_length

if TYPE_CHECKING:  # the configuration (`LLMConfig`) reads the default budget without importing torch
    import torch

#: Default budget, in tokens: 16 agent contexts of 2,048 tokens. A token's KV cache takes layers x 2 x kv heads x
#: head dim values: 46 KB for SmolLM2-135M in float32 (1.5 GB at this budget), 57 KB for Qwen2.5-7B in bfloat16.
DEFAULT_PREFIX_CACHE_TOKENS = 32768
#: The budget a backend gets when none is set, by device type: measured (benchmarks/RESULTS.md, "The GPU check"),
#: the cache pays on a CPU, where prefill dominates (batched rollouts 1.50x, one question at a time 1.96x), and
#: loses on an H100, where decoding a batch from merged cached rows is slower than the prefill it saves
#: (batched 0.33x, one at a time 0.88x).
PREFIX_CACHE_TOKENS_BY_DEVICE = {"cpu": DEFAULT_PREFIX_CACHE_TOKENS, "cuda": 0}


def prefix_cache_budget(tokens: int | None, device_type: str) -> int:
    """`tokens`, or where it is None the budget `PREFIX_CACHE_TOKENS_BY_DEVICE` gives `device_type` (off on
    devices it does not name)."""
    return PREFIX_CACHE_TOKENS_BY_DEVICE.get(device_type, 0) if tokens is None else tokens


class PrefixCache:
    """KV caches of token sequences, least recently used out first under a token budget (see the module)."""

    def __init__(self, max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"a prefix cache needs a budget of at least 1 token, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self._tokens = 0

    @property
    def tokens(self) -> int:
        """Tokens held, summed over entries."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: Sequence[int], limit: int) -> tuple[torch.Tensor | None, int]:
        """The entry sharing the longest token prefix with `ids`, and that length, at most `limit`
        ((None, 0) when no entry shares a token). The entry's first `length` positions are the KV cache of
        ``ids[:length]``."""
        ids = tuple(ids)
        best, length = None, 0
        for key in self._entries:
            shared = min(shared_length(key, ids), limit)
            if shared > length:
                best, length = key, shared
        if best is None:
            return None, 0
        self._entries.move_to_end(best)
        return self._entries[best], length

    def store(self, ids: Sequence[int], kv: torch.Tensor) -> None:
        """Keep `kv` ([layers, 2, kv heads, len(ids), head dim]) as the KV cache of `ids`; the entries that
        `ids` extends are dropped, then the least recently used ones until the budget holds. A sequence
        longer than the whole budget is not kept."""
        if kv.shape[3] != len(ids):
            raise ValueError(f"a KV cache of {kv.shape[3]} positions cannot be the cache of {len(ids)} tokens")
        if len(ids) > self.max_tokens:
            return
        key = tuple(ids)
        for old in [old for old in self._entries if len(old) <= len(key) and key[:len(old)] == old]:
            self._drop(old)
        self._entries[key] = kv
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._tokens -= len(key)
