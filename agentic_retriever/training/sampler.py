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

Several processes (torchrun) need more: accelerate's `BatchSamplerShard` gives batch j to process j % P, and the
loss gathers the P batches of a step (cross-device negatives), so the P batches of a step must share no text
either, and every batch must hold exactly `batch_size` rows (the gather needs equal shapes); a dropped tail loses
rows. `StepNoDuplicatesBatchSampler` builds duplicate-free *step* batches of P x `batch_size` rows and cuts each
into P consecutive process batches; a step short of rows (the end of a pass, where deferred duplicates are left)
is filled with rows of the same pass that share no text with it (so every row is in every epoch, some twice), and
its length is what it yields, counted like the single-process one's.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

__all__ = ["CoveringNoDuplicatesBatchSampler", "StepNoDuplicatesBatchSampler"]


class CoveringNoDuplicatesBatchSampler(NoDuplicatesBatchSampler):
    """`NoDuplicatesBatchSampler` whose length covers a whole duplicate-free pass in each of `epochs` epochs
    (module docstring), for one process (several: `StepNoDuplicatesBatchSampler`). With ``drop_last`` it is the
    parent unchanged."""

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


class StepNoDuplicatesBatchSampler:
    """Process batches of `batch_size` rows for `processes` data-parallel processes (module docstring): the
    `processes` consecutive batches of a step share no text, every batch is full, and each epoch's pass holds
    every row. ``drop_last`` is kept for accelerate to read; nothing is ever dropped (the length is a multiple of
    `processes`)."""

    def __init__(self, dataset, batch_size: int, processes: int, drop_last: bool = True,
                 valid_label_columns: list[str] | None = None, generator=None, seed: int = 0, epochs: int = 1):
        if processes < 2:
            raise ValueError(f"StepNoDuplicatesBatchSampler is for several processes, got {processes}")
        self.dataset, self.batch_size, self.processes, self.drop_last = dataset, batch_size, processes, drop_last
        self.seed, self.epochs, self.epoch = seed, max(1, int(epochs)), 0
        self._passes: dict[int, list[list[int]]] = {}  # by epoch: counting the length computes the epochs' passes
        self._pass = NoDuplicatesBatchSampler(dataset, batch_size=batch_size * processes, drop_last=False,
                                              valid_label_columns=valid_label_columns, generator=generator, seed=seed)
        columns = [name for name in dataset.column_names if name not in (valid_label_columns or [])]
        # each row's texts by their hash (equal texts, equal hashes in this process; a 64-bit collision would at
        # worst keep two rows out of one step)
        self._texts = [frozenset(hash(str(row[name])) for name in columns) for row in dataset]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _steps_of_pass(self, epoch: int) -> list[list[int]]:
        """One duplicate-free pass (seeded by seed + `epoch`, so computed once), each step filled to `processes` x
        `batch_size` rows."""
        if epoch not in self._passes:
            self._pass.set_epoch(epoch)
            size = self.batch_size * self.processes
            steps = [list(step) for step in self._pass]
            rng = random.Random(self.seed * 1_000_003 + epoch)
            for step in steps:
                if len(step) < size:
                    self._fill(step, size, rng)
            self._passes[epoch] = steps
        return self._passes[epoch]

    def _fill(self, step: list[int], size: int, rng: random.Random) -> None:
        texts = set().union(*(self._texts[i] for i in step))
        chosen = set(step)
        candidates = [i for i in range(len(self._texts)) if i not in chosen]
        rng.shuffle(candidates)
        for index in candidates:
            if len(step) == size:
                return
            if texts.isdisjoint(self._texts[index]):
                step.append(index)
                texts |= self._texts[index]
        raise ValueError(f"no duplicate-free step of {size} rows ({self.processes} processes x {self.batch_size}) can "
                         f"be filled from {len(self._texts)} rows: lower per_device_batch_size")

    def __len__(self) -> int:
        return max(len(self._steps_of_pass(epoch)) for epoch in range(self.epochs)) * self.processes

    def __iter__(self) -> Iterator[list[int]]:
        wanted, yielded = len(self) // self.processes, 0
        for extra in itertools.count():  # a pass shorter than the longest epoch's continues with another
            for step in self._steps_of_pass(self.epoch + extra * self.epochs):
                for start in range(0, len(step), self.batch_size):
                    yield step[start:start + self.batch_size]
                yielded += 1
                if yielded == wanted:
                    return
