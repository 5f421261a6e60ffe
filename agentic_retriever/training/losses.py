"""The Agentic-R contrastive objective (agentic_r.txt section 4.1.2, Eq. 5) on sentence-transformers' losses.

Eq. 5 is InfoNCE with temperature tau over every passage of the global batch: for query q_j of device g, the
logits are s(q_j, p) / tau for its positive, its N - 1 sampled negatives, the passages of the other queries
on the device (in-batch) and all passages of the other G - 1 devices (cross-device): B x G x N - 1 negatives.
s is the dot product of mean-pooled, L2-normalised embeddings, i.e. the cosine similarity.

sentence-transformers computes exactly this: `MultipleNegativesRankingLoss` with ``scale = 1 / tau``,
``cos_sim``, the (anchor, positive, negative_1..negative_{N-1}) column layout and ``gather_across_devices``
(its local queries against the gathered passages, with the anchor's positive at index rank x B + j of the
gathered positives, and gradients flowing back through the local shard); `CachedMultipleNegativesRankingLoss`
is its GradCache variant (Gao et al., 2021): the same loss and gradients for a large global batch, computing
embeddings without a graph first and back-propagating mini-batch by mini-batch. We use both as they are.

What this module adds is the in-batch accuracy metric (the share of local queries whose top-scoring passage
among the device's batch is their positive), which those losses do not report; it is read by the trainer's
logging callback.
"""

from __future__ import annotations

import torch
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.util import cos_sim

__all__ = ["InBatchAccuracy", "build_infonce_loss", "in_batch_accuracy"]


def in_batch_accuracy(queries: torch.Tensor, passages: list[torch.Tensor]) -> tuple[int, int]:
    """(correct, total): query j is correct when, among all the batch's passages (positives first, then each
    negative column), the highest cosine similarity is its own positive, column j."""
    with torch.no_grad():
        scores = cos_sim(queries.detach().float(), torch.cat([p.detach().float() for p in passages]))
        best = scores.argmax(dim=1)
        correct = int((best == torch.arange(len(queries), device=best.device)).sum())
    return correct, len(queries)


class InBatchAccuracy:
    """Running in-batch accuracy since the last `pop` (the trainer logs and resets it every logging step)."""

    def __init__(self) -> None:
        self.correct = self.total = 0

    def add(self, queries: torch.Tensor, passages: list[torch.Tensor]) -> None:
        correct, total = in_batch_accuracy(queries, passages)
        self.correct += correct
        self.total += total

    def pop(self) -> float | None:
        value = self.correct / self.total if self.total else None
        self.correct = self.total = 0
        return value


class _InfoNCE(MultipleNegativesRankingLoss):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.accuracy = InBatchAccuracy()

    def compute_loss_from_embeddings(self, embeddings: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        self.accuracy.add(embeddings[0], embeddings[1:])
        return super().compute_loss_from_embeddings(embeddings, labels)


class _CachedInfoNCE(CachedMultipleNegativesRankingLoss):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.accuracy = InBatchAccuracy()

    def calculate_loss(self, reps, labels=None, *, with_backward: bool = False) -> torch.Tensor:
        if with_backward:  # once per step (the graph-free first pass calls it without)
            self.accuracy.add(torch.cat(reps[0]), [torch.cat(r) for r in reps[1:]])
        return super().calculate_loss(reps, labels, with_backward=with_backward)


def build_infonce_loss(model, temperature: float = 0.01, gather_across_devices: bool = True,
                       cached: bool = False, mini_batch_size: int = 32):
    """Eq. 5 for `model`: the plain loss, or the GradCache one (`cached`) embedding `mini_batch_size` texts
    at a time. The returned loss has an ``accuracy`` (`InBatchAccuracy`)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if cached:
        return _CachedInfoNCE(model, scale=1.0 / temperature, similarity_fct=cos_sim, mini_batch_size=mini_batch_size,
                              gather_across_devices=gather_across_devices)
    return _InfoNCE(model, scale=1.0 / temperature, similarity_fct=cos_sim, gather_across_devices=gather_across_devices)
