"""The learning-rate schedule of the retriever trainer: a linear warm-up that starts above zero, then linear decay.

Hugging Face's ``linear`` schedule runs update k of its W warm-up updates at k / W x the peak rate, so the
first update has rate 0 and does nothing (with 4 updates and ``warmup_steps=0.1``, which transformers 5 reads
as ceil(0.1 x 4) = 1 warm-up update, a quarter of the run is lost). Here, with T updates and
W = ceil(warmup_ratio x T) (at most T), update k (0-based) runs at

    peak x (k + 1) / (W + 1)              for k < W    (W rates strictly between 0 and the peak)
    peak x (T - k) / (T - W)              for k >= W   (the peak at update W, then linear decay, > 0 to the end)

which is Hugging Face's schedule with the warm-up shifted by one update. Few-update runs (the CPU
quickstart trains for a handful of updates) are where the difference matters.
"""

from __future__ import annotations

import functools
import math

__all__ = ["learning_rate_factor", "warmup_linear_schedule", "warmup_updates"]


def warmup_updates(warmup_ratio: float, total_updates: int) -> int:
    """W = ceil(warmup_ratio x total_updates), at most total_updates (0 for a ratio of 0)."""
    if not 0 <= warmup_ratio <= 1:
        raise ValueError(f"warmup_ratio must be in [0, 1], got {warmup_ratio}")
    # round() first: 0.1 x 30 is 3.0000000000000004 in floating point, which must not become 4
    return min(total_updates, math.ceil(round(warmup_ratio * total_updates, 9)))


def learning_rate_factor(update: int, warmup: int, total: int) -> float:
    """The share of the peak learning rate that update `update` (0-based) of `total` runs at."""
    if update < warmup:
        return (update + 1) / (warmup + 1)
    return max(0.0, (total - update) / max(1, total - warmup))


def warmup_linear_schedule(optimizer, warmup_ratio: float, total_updates: int):
    """A `LambdaLR` on `optimizer` following the module's schedule."""
    from torch.optim.lr_scheduler import LambdaLR

    warmup = warmup_updates(warmup_ratio, total_updates)
    return LambdaLR(optimizer, functools.partial(learning_rate_factor, warmup=warmup, total=total_updates))
