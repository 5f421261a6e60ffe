"""Retriever training losses: Eq. 5 of "Agentic-R: Learning to Retrieve for Agentic Search" (InfoNCE with in-batch
and cross-device negatives), the REPLUG soft-label KL (arXiv 2301.12652), their cached (GradCache) variants and
the in-batch accuracy."""

import math
import os

import numpy as np
import pytest
import torch

from agentic_retriever.training.losses import build_infonce_loss, build_loss, in_batch_accuracy, soft_label_kl
from tests.fakes import free_port


class _Dummy(torch.nn.Module):
    pass


def test_infonce_matches_a_hand_computed_value():
    """Two queries, one hard negative each, temperature 0.5: logits are cos/tau over all 4 passages."""
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    pos = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    neg = torch.tensor([[1.0, -1.0], [1.0, 0.0]])
    loss = build_infonce_loss(_Dummy(), temperature=0.5, gather_across_devices=False)
    value = loss.compute_loss_from_embeddings([q, pos, neg], None).item()
    c = 1 / math.sqrt(2)
    # query 0 vs [pos0, pos1, neg0, neg1] = [c, 0, c, 1]; query 1 vs them = [c, 1, -c, 0]
    l0 = -(c / 0.5) + math.log(sum(math.exp(s / 0.5) for s in (c, 0, c, 1)))
    l1 = -(1 / 0.5) + math.log(sum(math.exp(s / 0.5) for s in (c, 1, -c, 0)))
    assert value == pytest.approx((l0 + l1) / 2, rel=1e-6)
    assert loss.accuracy.pop() == 0.5  # query 0's best is neg1 (1 > c), query 1's is its positive
    assert loss.accuracy.pop() is None  # reset after pop


def test_lower_temperature_sharpens_and_in_batch_negatives_count():
    torch.manual_seed(0)
    q, pos, neg = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    values = [build_infonce_loss(_Dummy(), t, False).compute_loss_from_embeddings([q, pos, neg], None).item()
              for t in (1.0, 0.01)]
    assert values[0] != pytest.approx(values[1])
    logits = torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(torch.cat([pos, neg]), dim=-1).T
    expected = torch.nn.functional.cross_entropy(logits / 1.0, torch.arange(4)).item()
    assert values[0] == pytest.approx(expected, rel=1e-6)  # 2B - 1 negatives per query: in-batch + hard


def test_in_batch_accuracy_counts_the_own_positive_as_the_best():
    q = torch.eye(3)
    assert in_batch_accuracy(q, [torch.eye(3)]) == (3, 3)
    assert in_batch_accuracy(q, [torch.eye(3)[[1, 0, 2]]]) == (1, 3)


def test_soft_label_kl_matches_a_hand_computed_value():
    """REPLUG's KL(Q || P_R) for 1 query and 3 passages, tau 0.5, label temperature 0.25."""
    q = torch.tensor([[1.0, 0.0]])
    passages = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 1.0]])]
    utilities = torch.tensor([[1.0, 0.0, 0.5]])
    c = 1 / math.sqrt(2)
    p = [math.exp(s / 0.5) for s in (1.0, 0.0, c)]
    p = [v / sum(p) for v in p]
    target = [math.exp(u / 0.25) for u in (1.0, 0.0, 0.5)]
    target = [v / sum(target) for v in target]
    expected = sum(t * (math.log(t) - math.log(r)) for t, r in zip(target, p))
    value = soft_label_kl(q, passages, utilities, 0.5, 0.25).item()
    assert value == pytest.approx(expected, rel=1e-6)

    embeddings = [q, *passages]
    pure = build_loss(_Dummy(), "soft_label", temperature=0.5, label_temperature=0.25, gather_across_devices=False)
    assert pure.compute_loss_from_embeddings(embeddings, utilities).item() == pytest.approx(expected, rel=1e-6)
    assert pure.kl.pop() == pytest.approx(expected, rel=1e-6) and pure.accuracy.pop() == 1.0
    infonce = build_infonce_loss(_Dummy(), 0.5, False).compute_loss_from_embeddings(embeddings, None).item()
    mixed = build_loss(_Dummy(), "infonce", 0.5, soft_label_weight=0.3, label_temperature=0.25,
                       gather_across_devices=False)
    assert mixed.compute_loss_from_embeddings(embeddings, utilities).item() == pytest.approx(infonce + 0.3 * expected)
    assert soft_label_kl(q, passages, torch.tensor([[5.0, 0.0, 0.0]]), 0.5, 1e-3).item() == pytest.approx(
        -math.log(p[0]), rel=1e-5)  # a one-hot target: the row's N-way InfoNCE
    with pytest.raises(ValueError, match="per-passage utilities"):
        pure.compute_loss_from_embeddings(embeddings, None)


def test_soft_label_gradients_reach_the_encoder_and_follow_the_target():
    torch.manual_seed(0)
    encoder = torch.nn.Linear(6, 4, bias=False)
    inputs = torch.randn(4, 3, 6)  # (query + 3 passages, 3 queries, features)
    utilities = torch.tensor([[1.0, 0.2, 0.0], [0.0, 1.0, 0.5], [0.3, 0.3, 0.9]], requires_grad=True)
    loss = build_loss(_Dummy(), "soft_label", temperature=0.1, label_temperature=0.1, gather_across_devices=False)

    def kl():
        return loss.compute_loss_from_embeddings([encoder(x) for x in inputs], utilities)

    value = kl()
    value.backward()
    assert encoder.weight.grad is not None and encoder.weight.grad.abs().sum() > 0
    assert utilities.grad is None  # the target is a constant
    with torch.no_grad():
        encoder.weight -= 0.5 * encoder.weight.grad
    assert kl().item() < value.item()  # a gradient step moves P_R towards Q


@pytest.mark.parametrize("loss_name, weight", [("soft_label", 0.0), ("infonce", 0.5)])
def test_the_cached_soft_label_loss_gives_the_same_loss_and_gradients(tiny_model_dir, loss_name, weight):
    from sentence_transformers import SentenceTransformer

    labels = torch.tensor([[1.0, 0.1, 0.4], [0.2, 0.9, 0.0], [0.5, 0.5, 1.0], [0.0, 0.3, 0.8]])

    def loss_and_grads(cached: bool):
        torch.manual_seed(0)
        model = SentenceTransformer(tiny_model_dir, device="cpu")
        model.eval()
        texts = [[f"query {i}" for i in range(4)], [f"positive passage {i}" for i in range(4)],
                 [f"negative passage {i} words" for i in range(4)], [f"other {i} text" for i in range(4)]]
        loss = build_loss(model, loss_name, 0.05, weight, 0.2, False, cached=cached, mini_batch_size=2)
        value = loss([model.tokenize(column) for column in texts], labels)
        value.backward()
        return value.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain_loss, plain_grads = loss_and_grads(False)
    cached_loss, cached_grads = loss_and_grads(True)
    assert cached_loss == pytest.approx(plain_loss, rel=1e-5)
    assert plain_grads.keys() == cached_grads.keys() and plain_grads
    for name in plain_grads:
        torch.testing.assert_close(cached_grads[name], plain_grads[name], rtol=1e-3, atol=1e-6)


def _rank_worker(rank: int, world: int, port: int, weights: torch.Tensor, inputs: torch.Tensor, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        encoder = torch.nn.Linear(inputs.shape[-1], 4, bias=False)
        encoder.weight.data.copy_(weights)
        batch = inputs.shape[1] // world
        local = inputs[:, rank * batch:(rank + 1) * batch]  # columns: query, positive, negative
        loss = build_infonce_loss(_Dummy(), 0.05, gather_across_devices=True)
        value = loss.compute_loss_from_embeddings([encoder(x) for x in local], None)
        value.backward()
        grad = encoder.weight.grad.clone()
        dist.all_reduce(grad)  # what DDP does: average the gradients
        torch.save({"loss": value.item(), "grad": grad / world}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_over_the_concatenated_batch(tmp_path):
    """Eq. 5 across devices: same loss (mean over ranks) and same averaged gradients as one big batch.
    Misaligned anchors (query j of rank 1 scored against rank 0's positive j) would change both."""
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    weights = torch.randn(4, 6)
    inputs = torch.randn(3, 6, 6)  # (query/positive/negative, 6 queries, 6 features)
    mp.start_processes(_rank_worker, args=(2, free_port(), weights, inputs, str(tmp_path)), nprocs=2,
                       start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    encoder = torch.nn.Linear(6, 4, bias=False)
    encoder.weight.data.copy_(weights)
    loss = build_infonce_loss(_Dummy(), 0.05, gather_across_devices=False)
    reference = loss.compute_loss_from_embeddings([encoder(x) for x in inputs], None)
    reference.backward()
    assert np.mean([r["loss"] for r in ranks]) == pytest.approx(reference.item(), rel=1e-5)
    for r in ranks:
        torch.testing.assert_close(r["grad"], encoder.weight.grad, rtol=1e-4, atol=1e-6)
