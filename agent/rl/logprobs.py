"""Log-probabilities (and entropies) of chosen tokens from hidden states, projected onto the vocabulary a chunk
of positions at a time.

A policy-gradient loss needs, at every generated position, log p(token) = z[token] - logsumexp(z) and, for the
entropy bonus, H = logsumexp(z) - sum softmax(z) * z, where z is the position's row of logits. Materialising
z for a whole micro-batch costs rows x positions x vocabulary floats (4 x 1,000 x 49,152 x 4 bytes = 787 MB for
SmolLM2 on the quickstart), and autograd keeps that tensor, the softmax of the entropy and their products alive
until the backward pass: several times the size of every other activation of a 135M model. Here the positions
go through the output projection in chunks of ``chunk_size``, each chunk under activation checkpointing
(`torch.utils.checkpoint`, non-reentrant), so the forward pass keeps only the chunk's hidden states and its two
per-token results, and the backward pass recomputes one chunk's logits at a time: at most one chunk's logits
(and their softmax) exist at any moment. The price is one more projection per chunk in the backward pass,
a small share of a transformer's forward pass. Without gradients (the log-prob passes) chunks are simply
computed one after the other. This is the scheme of chunked cross-entropy losses for large vocabularies
(e.g. "Cut Your Losses in Large-Vocabulary Language Models", arXiv 2411.09009, which fuses it into a kernel),
applied to RL's per-token log-probabilities and entropy.

```python
hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # [rows, T, H]
logprobs, entropy = chunked_logprobs(hidden[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), model.lm_head, 512,
                                     with_entropy=True)
```
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from .core import entropy_from_logits

__all__ = ["chunked_logprobs"]


def _chunk(project: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
           temperature: float, with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = project(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_normaliser = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_normaliser
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits, log_normaliser)
    return logprobs, entropy


def chunked_logprobs(hidden: torch.Tensor, targets: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor],
                     chunk_size: int, temperature: float = 1.0, with_entropy: bool = False,
                     entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of ``targets[i]`` under the logits ``project(hidden[i]) / temperature`` and, when asked,
    the entropy of that distribution (with a graph only if `entropy_grad`: otherwise a metric); [N] each, float32.

    `hidden` is [N, hidden size] (the positions that predict the targets), `project` maps hidden states to
    logits (the model's output layer). At most `chunk_size` positions' logits exist at a time, in the forward
    and in the backward pass (see the module docstring)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    logprobs, entropies = [], []
    for start in range(0, max(hidden.shape[0], 1), chunk_size):  # one (empty) chunk when there are no positions
        args = (project, hidden[start:start + chunk_size], targets[start:start + chunk_size], temperature,
                with_entropy, entropy_grad)
        if torch.is_grad_enabled():
            logprob, entropy = checkpoint(_chunk, *args, use_reentrant=False)
        else:
            logprob, entropy = _chunk(*args)
        logprobs.append(logprob)
        entropies.append(entropy)
    return torch.cat(logprobs), torch.cat(entropies) if with_entropy else None
