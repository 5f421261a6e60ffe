"""Rollouts as training samples, padded into tensors, and the model passes over them.

A `Sample` is one rollout's token ids exactly as the model saw them while generating (prompt ids, then the
response: generated and inserted segments, `agent.env.Rollout`), its loss mask (1 = generated) and what the
trainer attaches to it (score, log-probabilities, values, advantages), per response token.

`collate` left-pads the sequences, so every row's response ends in the last column: per-token tensors are
[rows, longest response], right-aligned. `token_logprobs` runs the transformer once over a batch and projects
only the generated positions' hidden states onto the vocabulary, a chunk at a time (`agent.rl.logprobs`):
retrieved text and long prompts cost the transformer's pass and nothing more, and no [rows, tokens,
vocabulary] logits tensor is ever built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .logprobs import chunked_logprobs

__all__ = ["Collated", "Sample", "collate", "output_projection", "token_logprobs", "token_values"]

#: Per-token fields of a `Sample` that `collate` pads into tensors.
TOKEN_FIELDS = ("old_logprobs", "ref_logprobs", "values", "advantages", "returns")


@dataclass
class Sample:
    """One rollout in training form."""

    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]          # parallel to response_ids: 1 generated, 0 inserted by the environment
    group: int               # the prompt it was sampled for (GRPO groups)
    score: float = 0.0       # the reward of the whole response
    components: dict[str, float] = field(default_factory=dict)  # diagnostics: EM, format, retrieval hit ...
    num_searches: int = 0
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None

    def __post_init__(self):
        if len(self.mask) != len(self.response_ids):
            raise ValueError(f"mask has {len(self.mask)} entries for {len(self.response_ids)} response tokens")
        if not self.prompt_ids or not self.response_ids:
            raise ValueError("a sample needs a non-empty prompt and response")

    @property
    def generated_tokens(self) -> int:
        return sum(self.mask)

    @property
    def last_generated(self) -> int:
        """Index (in the response) of the last generated token, where the outcome reward is placed."""
        return max(i for i, m in enumerate(self.mask) if m)


@dataclass
class Collated:
    """Left-padded model inputs [rows, T] and right-aligned per-token tensors [rows, R]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    mask: torch.Tensor       # float, 1 on generated response tokens
    tokens: dict[str, torch.Tensor]  # the TOKEN_FIELDS the samples carry

    @property
    def response_width(self) -> int:
        return self.response_ids.shape[1]


def collate(samples: Sequence[Sample], device: torch.device | str = "cpu", pad_id: int = 0) -> Collated:
    """Pad `samples` into one batch (see the module docstring for the layout)."""
    width = max(len(s.response_ids) for s in samples)
    total = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    rows = len(samples)
    input_ids = torch.full((rows, total), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, total), dtype=torch.long)
    response = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width))
    present = [name for name in TOKEN_FIELDS if all(getattr(s, name) is not None for s in samples)]
    tokens = {name: torch.zeros((rows, width)) for name in present}
    for row, sample in enumerate(samples):
        ids = sample.prompt_ids + sample.response_ids
        input_ids[row, total - len(ids):] = torch.tensor(ids)
        attention[row, total - len(ids):] = 1
        n = len(sample.response_ids)
        response[row, width - n:] = torch.tensor(sample.response_ids)
        mask[row, width - n:] = torch.tensor(sample.mask, dtype=torch.float)
        for name in present:
            tokens[name][row, width - n:] = getattr(sample, name).float()
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return Collated(input_ids.to(device), attention.to(device), positions.to(device), response.to(device),
                    mask.to(device), {k: v.to(device) for k, v in tokens.items()})


def output_projection(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """The map from a causal LM's last hidden states to its logits: the output layer, then the final-logit
    soft-capping of the models that have it (Gemma 2: ``cap * tanh(z / cap)``), as their forward pass does."""
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if not cap:
        return head
    return lambda hidden: cap * torch.tanh(head(hidden) / cap)


def token_logprobs(model, batch: Collated, temperature: float = 1.0, with_entropy: bool = False,
                   entropy_grad: bool = True, chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of every generated response token under `model` (logits divided by the sampling
    `temperature`, as the tokens were drawn) and, when asked, the entropy of each next-token distribution
    (without a graph unless `entropy_grad`: a metric only); [rows, R] each, right-aligned like
    `batch.response_ids`, 0 wherever `batch.mask` is 0 (inserted tokens and padding: no loss reads them).

    The transformer runs once over the batch; its hidden states at the generated positions go through the
    output layer `chunk_size` positions at a time (`agent.rl.logprobs.chunked_logprobs`), so no [rows, R,
    vocabulary] logits tensor is ever built and inserted positions (most of a search agent's response) are
    never projected at all."""
    width = batch.response_width
    hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                 position_ids=batch.position_ids, use_cache=False).last_hidden_state
    generated = batch.mask.bool()
    # position j predicts token j + 1: the hidden states before the last `width` tokens
    picked, entropy = chunked_logprobs(hidden[:, -width - 1:-1][generated], batch.response_ids[generated],
                                       output_projection(model), chunk_size, temperature, with_entropy, entropy_grad)
    zeros = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)
    logprobs = zeros.index_put((generated,), picked)
    return logprobs, zeros.index_put((generated,), entropy) if with_entropy else None


def token_values(critic, batch: Collated) -> torch.Tensor:
    """The critic's value of the state before every response token, [rows, R] right-aligned."""
    values = critic(batch.input_ids, batch.attention_mask, batch.position_ids)
    return values[:, -batch.response_width - 1:-1]
