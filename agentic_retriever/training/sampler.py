"""Batches without a repeated text that still hold every example in every epoch.

sentence-transformers' `NoDuplicatesBatchSampler` builds each batch from examples that share no text (query,
positive or negative) with it, so no passage is its own query's in-batch negative for another query. Mined rows
share passages a lot (the rounds of one question retrieve the same candidates), so a duplicate-free pass over
the data needs more, smaller batches than ceil(n / B); but the sampler advertises ceil(n / B), and the Hugging
Face trainer takes exactly the advertised number of batches per epoch: the rest of the pass is skipped,
silently (16 rows of 4 questions, 4 rounds each sharing their positive, batch 8: half of the rows per epoch).

`CoveringNoDuplicatesBatchSampler` advertises instead the number of batches its passes actually need: the
most over the run's epochs (each epoch's pass is seeded by seed + epoch, so this is exact). An epoch whose
pass needs fewer batches is topped up by the parent's resampling (a few examples twice; it logs a warning).
"""

from __future__ import annotations

from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

__all__ = ["CoveringNoDuplicatesBatchSampler"]


class CoveringNoDuplicatesBatchSampler(NoDuplicatesBatchSampler):
    """`NoDuplicatesBatchSampler` whose length covers a whole duplicate-free pass in each of `epochs` epochs
    (module docstring). With ``drop_last`` (several processes) it is the parent unchanged."""

    def __init__(self, *args, epochs: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.epochs = max(1, int(epochs))
        self._length: int | None = None

    def __len__(self) -> int:
        if self.drop_last:
            return super().__len__()
        if self._length is None:
            self._length = 0  # while counting, the parent's __iter__ stops after one pass (it tops up to len)
            current, passes = self.epoch, []
            try:
                for epoch in range(self.epochs):
                    self.epoch = epoch
                    passes.append(sum(1 for _ in super().__iter__()))
            finally:
                self.epoch = current
                self._length = max(passes) if len(passes) == self.epochs else None
        return self._length
