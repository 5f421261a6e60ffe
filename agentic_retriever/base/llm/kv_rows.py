"""Per-row KV caches of a Hugging Face `DynamicCache`: cut one row out of a batch, and stack rows into a batch.

The transformers backend computes a batch in several passes (prompts of different lengths, prefixes shared
by several rows, prefixes kept by the prefix cache) and decodes the batch from one cache. A row here is
(per layer (keys, values) of shape [kv heads, positions, head dim], attention mask of shape [positions]):
a row of a pass, with that pass's left padding masked, or a cached prefix, all of whose positions count.
`stack_rows` puts rows side by side, right-aligned, left-padded to the widest with masked slots, which is
how every pass of the backend lays out a batch (positions come from position ids, not from slots).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

KVRow = tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


def pass_row(cache: DynamicCache, mask: torch.Tensor, slot: int) -> KVRow:
    """Row `slot` of a pass's cache and attention mask (views, no copy)."""
    return [(layer.keys[slot], layer.values[slot]) for layer in cache.layers], mask[slot]


def cached_row(kv: torch.Tensor | None, length: int) -> KVRow:
    """The first `length` positions of a kept KV cache ([layers, 2, kv heads, positions, head dim]; None: empty)."""
    if kv is None or length == 0:
        return [], torch.zeros(0, dtype=torch.long)
    return [(layer[0, :, :length], layer[1, :, :length]) for layer in kv], torch.ones(length, dtype=torch.long)


def row_kv(cache: DynamicCache, mask: torch.Tensor, slot: int) -> torch.Tensor:
    """Row `slot`'s keys and values at its unmasked positions, in order, as one tensor [layers, 2, kv heads,
    positions, head dim] (a copy: it outlives the batch)."""
    keep = mask[slot].nonzero().squeeze(1)
    return torch.stack([torch.stack((layer.keys[slot].index_select(1, keep), layer.values[slot].index_select(1, keep)))
                        for layer in cache.layers])


def stack_rows(rows: Sequence[KVRow], config, device: torch.device) -> tuple[DynamicCache, torch.Tensor]:
    """One cache (of `config`'s layers) and attention mask whose row i is `rows[i]`, right-aligned and
    left-padded with masked slots to the widest row. At least one row must hold a position."""
    width = max(len(mask) for _, mask in rows)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for i, (_, row_mask) in enumerate(rows):
        mask[i, width - len(row_mask):] = row_mask
    filled = [(i, layers) for i, (layers, row_mask) in enumerate(rows) if len(row_mask)]
    cache = DynamicCache(config=config)
    for layer in range(len(filled[0][1])):
        sample_keys, sample_values = filled[0][1][layer]
        keys = sample_keys.new_zeros((len(rows), sample_keys.shape[0], width, sample_keys.shape[2]))
        values = sample_values.new_zeros((len(rows), sample_values.shape[0], width, sample_values.shape[2]))
        for i, layers in filled:
            row_keys, row_values = layers[layer]
            keys[i, :, width - row_keys.shape[1]:] = row_keys
            values[i, :, width - row_values.shape[1]:] = row_values
        cache.update(keys, values, layer)
    return cache, mask
