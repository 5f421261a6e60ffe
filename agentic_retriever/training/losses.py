"""The retriever objectives: Agentic-R's Eq. 5 and a REPLUG soft-label term.

Agentic-R is "Agentic-R: Learning to Retrieve for Agentic Search"; Eq. 5 is in its section 4.1.2.

**Eq. 5** is InfoNCE with temperature tau over every passage of the global batch: for query q_j of device g,
the logits are s(q_j, p) / tau for its positive, its N - 1 sampled negatives, the passages of the other
queries on the device (in-batch) and all passages of the other G - 1 devices (cross-device): B x G x N - 1
negatives. s is the dot product of mean-pooled, L2-normalised embeddings, i.e. the cosine similarity.

sentence-transformers computes exactly this: `MultipleNegativesRankingLoss` with ``scale = 1 / tau``,
``cos_sim``, the (anchor, positive, negative_1..negative_{N-1}) column layout and ``gather_across_devices``
(its local queries against the gathered passages, with the anchor's positive at index rank x B + j of the
gathered positives, and gradients flowing back through the local shard); `CachedMultipleNegativesRankingLoss`
is its GradCache variant (Gao et al., 2021): the same loss and gradients for a large global batch, computing
embeddings without a graph first and back-propagating mini-batch by mini-batch. We use both as they are.

**The soft-label term** is REPLUG's training objective ("REPLUG: Retrieval-Augmented Black-Box Language
Models", Shi et al., arXiv:2301.12652, section 4): per query, over its own N passages d_1..d_N (the row's
positive and sampled negatives; no in-batch passages),

    P_R(d_i | q) = softmax_i(s(q, d_i) / tau)            the retriever's distribution  (REPLUG 4.1)
    Q(d_i | q)   = softmax_i(u_i / label_temperature)    the target from utilities     (REPLUG 4.2)
    KL(Q || P_R) = sum_i Q_i (log Q_i - log P_R,i)       averaged over the queries     (REPLUG 4.3)

where REPLUG's u_i is the LM likelihood of the gold answer given d_i and ours is the mined utility of d_i
(graded GAC, local relevance, or their sum; `data.passage_utility`). The target carries no gradient. REPLUG
writes its loss with the arguments the other way round, KL(P_R || Q); we minimise KL(Q || P_R), the
distillation direction: the cross-entropy to the soft target minus its constant entropy, whose gradient on
the retriever's logits s/tau is P_R - Q (with a one-hot Q, the N-way InfoNCE over the row's passages).

The objectives, by the trainer's settings:

* ``loss="infonce"``, ``soft_label_weight=0``: Eq. 5 alone (the paper);
* ``loss="infonce"``, ``soft_label_weight=w > 0``: Eq. 5 + w x KL;
* ``loss="soft_label"``: KL alone.

Requirements: the (anchor, positive, negative_1, ..) columns, and for the KL term a ``label`` column of N
utilities per row (sentence-transformers' collator passes it to the loss as ``labels``, shape (B, N)). Use
the no-duplicates batch sampler: Eq. 5 treats every other passage of the batch as a negative.

    loss = build_loss(model, "infonce", temperature=0.01, soft_label_weight=0.5, label_temperature=0.1)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset_with_label, loss=loss)

What this module adds besides the KL term is the in-batch accuracy metric (the share of local queries whose
top-scoring passage among the device's batch is their positive) and the running KL, which the trainer's
logging callback reads.
"""

from __future__ import annotations

import torch
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.util import cos_sim

__all__ = ["InBatchAccuracy", "RunningMean", "build_infonce_loss", "build_loss", "in_batch_accuracy", "soft_label_kl"]


def in_batch_accuracy(queries: torch.Tensor, passages: list[torch.Tensor]) -> tuple[int, int]:
    """(correct, total): query j is correct when, among all the batch's passages (positives first, then each
    negative column), the highest cosine similarity is its own positive, column j."""
    with torch.no_grad():
        scores = cos_sim(queries.detach().float(), torch.cat([p.detach().float() for p in passages]))
        best = scores.argmax(dim=1)
        correct = int((best == torch.arange(len(queries), device=best.device)).sum())
    return correct, len(queries)


def soft_label_kl(queries: torch.Tensor, passages: list[torch.Tensor], utilities: torch.Tensor | None,
                  temperature: float, label_temperature: float) -> torch.Tensor:
    """Mean over the B queries of KL(Q || P_R) (REPLUG Eq. 5, module docstring): `passages` holds N tensors
    of shape (B, dim), column i the i-th passage of every query; `utilities` is (B, N)."""
    if utilities is None:
        raise ValueError("the soft-label loss needs per-passage utilities: a 'label' column of N numbers per row")
    scores = torch.stack([torch.nn.functional.cosine_similarity(queries, p, dim=-1) for p in passages], dim=1)
    if utilities.shape != scores.shape:
        raise ValueError(f"utilities of shape {tuple(utilities.shape)} for {scores.shape[0]} queries x "
                         f"{scores.shape[1]} passages")
    log_p = torch.log_softmax(scores / temperature, dim=1)
    log_q = torch.log_softmax(utilities.detach().to(scores) / label_temperature, dim=1)
    return (log_q.exp() * (log_q - log_p)).sum(dim=1).mean()


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


class RunningMean:
    """Mean of the values added since the last `pop` (the KL term, logged as ``soft_label_kl``)."""

    def __init__(self) -> None:
        self.sum, self.count = 0.0, 0

    def add(self, value: torch.Tensor) -> None:
        self.sum += float(value.detach())
        self.count += 1

    def pop(self) -> float | None:
        value = self.sum / self.count if self.count else None
        self.sum, self.count = 0.0, 0
        return value


class _Objective:
    """What both loss classes share: which terms, their weights, and the running metrics."""

    def _init_objective(self, infonce: bool, soft_label_weight: float, temperature: float,
                        label_temperature: float) -> None:
        self.infonce, self.soft_label_weight = infonce, soft_label_weight
        self.kl_temperature, self.label_temperature = temperature, label_temperature
        self.accuracy = InBatchAccuracy()
        self.kl = RunningMean()

    def _kl_term(self, queries: torch.Tensor, passages: list[torch.Tensor], labels) -> torch.Tensor:
        value = soft_label_kl(queries, passages, labels, self.kl_temperature, self.label_temperature)
        self.kl.add(value)
        return self.soft_label_weight * value


class _InfoNCE(MultipleNegativesRankingLoss, _Objective):
    def __init__(self, *args, infonce: bool = True, soft_label_weight: float = 0.0, label_temperature: float = 0.1,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self._init_objective(infonce, soft_label_weight, 1.0 / self.scale, label_temperature)

    def compute_loss_from_embeddings(self, embeddings: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        self.accuracy.add(embeddings[0], embeddings[1:])
        loss = super().compute_loss_from_embeddings(embeddings, labels) if self.infonce else 0.0
        if self.soft_label_weight:
            loss = loss + self._kl_term(embeddings[0], embeddings[1:], labels)
        return loss


class _CachedInfoNCE(CachedMultipleNegativesRankingLoss, _Objective):
    def __init__(self, *args, infonce: bool = True, soft_label_weight: float = 0.0, label_temperature: float = 0.1,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self._init_objective(infonce, soft_label_weight, 1.0 / self.scale, label_temperature)

    def calculate_loss(self, reps, labels=None, *, with_backward: bool = False) -> torch.Tensor:
        queries, passages = torch.cat(reps[0]), [torch.cat(r) for r in reps[1:]]
        if with_backward:  # once per step (the graph-free first pass calls it without)
            self.accuracy.add(queries, passages)
        loss = super().calculate_loss(reps, labels, with_backward=with_backward) if self.infonce else 0.0
        if self.soft_label_weight:
            # the KL sees only each query's own N passages: B x N scores, no need to chunk it
            kl = self._kl_term(queries, passages, labels)
            if with_backward:  # adds its gradient to the cached embedding gradients of Eq. 5's mini-batches
                kl.backward()
                kl = kl.detach()
            loss = loss + kl
        return loss


def build_loss(model, loss: str = "infonce", temperature: float = 0.01, soft_label_weight: float = 0.0,
               label_temperature: float = 0.1, gather_across_devices: bool = True, cached: bool = False,
               mini_batch_size: int = 32):
    """The objective for `model` (module docstring): ``loss`` infonce is Eq. 5 plus `soft_label_weight` x KL,
    ``loss`` soft_label the KL alone; `cached` uses GradCache, embedding `mini_batch_size` texts at a time.
    The returned loss has an ``accuracy`` (`InBatchAccuracy`) and a ``kl`` (`RunningMean`)."""
    if not temperature > 0 or not label_temperature > 0:
        raise ValueError(f"temperatures must be positive, got {temperature} and {label_temperature}")
    if loss not in ("infonce", "soft_label"):
        raise ValueError(f"loss must be infonce or soft_label, got {loss!r}")
    if soft_label_weight < 0:
        raise ValueError(f"soft_label_weight must be at least 0, got {soft_label_weight}")
    terms = {"infonce": loss == "infonce", "soft_label_weight": 1.0 if loss == "soft_label" else soft_label_weight,
             "label_temperature": label_temperature}
    if cached:
        return _CachedInfoNCE(model, scale=1.0 / temperature, similarity_fct=cos_sim, mini_batch_size=mini_batch_size,
                              gather_across_devices=gather_across_devices, **terms)
    return _InfoNCE(model, scale=1.0 / temperature, similarity_fct=cos_sim, gather_across_devices=gather_across_devices,
                    **terms)


def build_infonce_loss(model, temperature: float = 0.01, gather_across_devices: bool = True,
                       cached: bool = False, mini_batch_size: int = 32):
    """Eq. 5 for `model`: the plain loss, or the GradCache one (`cached`) embedding `mini_batch_size` texts
    at a time. The returned loss has an ``accuracy`` (`InBatchAccuracy`)."""
    return build_loss(model, "infonce", temperature, gather_across_devices=gather_across_devices, cached=cached,
                      mini_batch_size=mini_batch_size)
