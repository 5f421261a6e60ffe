"""Chunked log-probabilities (agent/rl/logprobs.py, agent.rl.batch.token_logprobs): the same log-probs, entropies
and gradients as full logits, on tiny random-weight models made here, and never more than one chunk's logits alive."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from agent.rl.batch import Sample, collate, token_logprobs
from agent.rl.logprobs import chunked_logprobs

VOCAB = 97


def tiny_llama(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        tie_word_embeddings=tied))


def tiny_gemma2():
    """Gemma 2 soft-caps its final logits (cap * tanh(z / cap)): a small cap so the capping matters."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    return Gemma2ForCausalLM(Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                          max_position_embeddings=128, final_logit_softcapping=2.0,
                                          attn_implementation="eager"))


MODELS = {"llama-untied": lambda: tiny_llama(False), "llama-tied (SmolLM2)": lambda: tiny_llama(True),
          "gemma2-softcapped": tiny_gemma2}


def samples() -> list[Sample]:
    """Left-padded rows of different lengths with inserted (masked) tokens in their responses."""
    return [Sample([5, 6, 7, 8, 9], [10, 11, 12, 13], [1, 0, 1, 1], group=0),
            Sample([5, 6], [20, 21, 22, 23, 24, 25, 26], [1, 1, 0, 0, 1, 1, 1], group=0),
            Sample([3], [40, 41], [1, 1], group=1)]


def full_logprobs(model, batch, temperature: float):
    """The reference: the model's full logits over the response region, log-softmax and entropy."""
    width = batch.response_width
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                   use_cache=False).logits[:, -width - 1:-1].float() / temperature
    logprobs = logits.log_softmax(-1)
    picked = logprobs.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return picked * batch.mask, entropy * batch.mask


def loss_and_gradients(model, logprobs, entropy, weights):
    loss = (logprobs * weights).sum() + 0.3 * (entropy * weights).sum()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_chunked_log_probs_entropy_and_gradients_equal_the_full_logits(name, chunk_size):
    model = MODELS[name]()
    batch = collate(samples())
    weights = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(1))
    expected_logprobs, expected_entropy = full_logprobs(model, batch, temperature=0.7)
    expected = loss_and_gradients(model, expected_logprobs, expected_entropy, weights)
    logprobs, entropy = token_logprobs(model, batch, temperature=0.7, with_entropy=True, chunk_size=chunk_size)
    assert torch.allclose(logprobs, expected_logprobs.detach(), atol=1e-5)
    assert torch.allclose(entropy, expected_entropy.detach(), atol=1e-5)
    assert torch.all(logprobs[batch.mask == 0] == 0) and torch.all(entropy[batch.mask == 0] == 0)
    loss, gradients = loss_and_gradients(model, logprobs, entropy, weights)
    assert loss == pytest.approx(expected[0], abs=1e-4)
    assert gradients.keys() == expected[1].keys() and len(gradients) > 0
    for parameter, gradient in gradients.items():
        assert torch.allclose(gradient, expected[1][parameter], atol=1e-5, rtol=1e-4), parameter
    if name.startswith("llama-tied"):
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_entropy_without_a_graph_is_a_metric_only():
    model = tiny_llama(False)
    logprobs, entropy = token_logprobs(model, collate(samples()), with_entropy=True, entropy_grad=False, chunk_size=4)
    assert logprobs.requires_grad and not entropy.requires_grad


def test_only_one_chunks_logits_are_alive_at_a_time_forward_and_backward():
    """Every logits tensor the projection makes is tracked: none survives the forward pass (so the graph keeps
    no chunk's logits), and in the backward pass each chunk's logits are recomputed after the previous
    chunk's are gone."""
    head = torch.nn.Linear(8, VOCAB, bias=False)
    hidden = torch.randn(10, 8, requires_grad=True)
    made: list[weakref.ref] = []
    alive_at_creation: list[int] = []

    def project(h: torch.Tensor) -> torch.Tensor:
        gc.collect()
        alive_at_creation.append(sum(ref() is not None for ref in made))
        logits = head(h)
        made.append(weakref.ref(logits))
        return logits

    logprobs, entropy = chunked_logprobs(hidden, torch.arange(10) % VOCAB, project, chunk_size=3, with_entropy=True)
    gc.collect()
    assert len(made) == 4 and all(ref() is None for ref in made)  # 4 chunks of at most 3; no logits kept
    (logprobs.sum() + entropy.sum()).backward()
    assert len(made) == 8  # each chunk recomputed once in the backward pass
    assert alive_at_creation == [0] * 8
    expected = torch.log_softmax(head(hidden), -1).gather(-1, (torch.arange(10) % VOCAB)[:, None]).squeeze(-1)
    assert torch.allclose(logprobs, expected, atol=1e-6)
    assert hidden.grad is not None and head.weight.grad is not None


def test_without_gradients_chunks_are_computed_once():
    calls = []
    head = torch.nn.Linear(8, VOCAB)

    def project(h):
        calls.append(h.shape[0])
        return head(h)

    with torch.no_grad():
        logprobs, entropy = chunked_logprobs(torch.randn(7, 8), torch.zeros(7, dtype=torch.long), project, 3)
    assert calls == [3, 3, 1] and logprobs.shape == (7,) and entropy is None
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        chunked_logprobs(torch.randn(7, 8), torch.zeros(7, dtype=torch.long), project, 0)
