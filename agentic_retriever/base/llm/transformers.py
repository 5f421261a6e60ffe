"""Generation with a Hugging Face causal LM, written out step by step (CPU and GPU). (A little over 400 lines:
prefill, decoding and the prefix cache's bookkeeping share one call's batch state; the batch plan, the KV-row
plumbing and the cache itself live in `batching`, `kv_rows` and `prefix_cache`.)

Why not ``model.generate``: an agent batch needs per-sequence stop strings, and a sequence that has
finished (EOS, a stop string such as ``</search>``, or its token cap) should leave the batch so the
others continue cheaper. The loop here does exactly that:

1. prefill: each row starts from the longest KV cache at hand for a prefix of it, and only the rest of
   the row is computed:
   - the prefix cache (`agentic_retriever.base.llm.prefix_cache`): the KV caches of sequences finished by
     earlier calls, so an agent's next turn (its previous prompt + the generated turn + the observation)
     computes only the observation, and a prompt sharing instructions with an earlier one reuses them;
   - a prefix shared within the batch: rows that share a token prefix (the n samples of one prompt, or the
     20 candidate continuations of one agent context) have it computed once (itself after the longest
     prefix cache entry it starts with, and then kept in the prefix cache for the next batches). Rows are
     batched prefix-aware (`batch_order`): sorted by their token ids, so rows sharing a prefix are
     neighbours, in families of rows sharing at least half their tokens, shorter families first; a batch
     may hold several groups of rows with different shared prefixes (`prefix_groups`).
   Shared prefixes, then the rows' own tokens, go through the model in left-padded passes of (nearly) equal
   length (`length_groups`, which weighs the padding a pass would compute against the cost of one more
   pass: one row a pass on a CPU for prompts of different lengths, few passes on a GPU), and the passes'
   caches are merged, each left-padded to the batch's width, into one cache for decoding (the batch plan
   comes from `agentic_retriever.base.llm.batching`, the cache plumbing from `agentic_retriever.base.llm.kv_rows`);
2. decode: one token per step per active row from a `DynamicCache`, greedy or sampled (temperature,
   top-p, a seeded `torch.Generator`);
3. a row finishes on EOS, on a stop string (searched in the decoded tail of its generated text), or at
   `max_new_tokens`; its KV cache goes to the prefix cache, and it is index-selected out of the cache, mask
   and positions.

Log-probabilities (generation and `score`) are ``log_softmax`` of the model's raw logits, i.e. of the
temperature-1 distribution, whatever temperature and top-p sampled the token: this is the policy
probability that RL ratios and likelihood scorers need.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer

from ..defaults import resolve_llm_name
from .batching import batch_order, length_groups, prefix_groups
from .device import resolve_device, resolve_dtype
from .kv_rows import cached_row, pass_row, row_kv, stack_rows
from .prefix_cache import PrefixCache, prefix_cache_budget
from .protocol import Generation, Prompt, SamplingParams
from .protocol import release_device_memory
from .text import find_stop, render_chat_prompt

log = logging.getLogger(__name__)

#: Tokens of a sequence's generated tail that are decoded to look for a stop string, beyond 4 per
#: character of the longest stop string (a token decodes to at least one byte of text, except special tokens).
_STOP_WINDOW_SLACK = 16

#: What one more prefill pass costs, in tokens computed, by device type (`length_groups`). CPU: SmolLM2-135M on
#: one thread runs a pass in 30 ms plus 2 ms a token, whatever the batch size. GPU: a small model's pass costs
#: about the same up to thousands of tokens (SmolLM2-135M on an H100: 16 prompts of 230-600 tokens prefill in
#: 0.13 s in one padded pass, 0.18 s at a cost of 1024, 0.85 s one length a pass); a larger model may use less.
_PASS_COST = {"cpu": 32, "cuda": 4096}


@dataclass
class PrefillStats:
    """Prompt tokens since the backend was made: given (`prompt_tokens`), held by a prefix cache entry
    (`cached_tokens`) and run through the model (`computed_tokens`; the others were cached or computed once
    for several rows that share them)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    computed_tokens: int = 0


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside the smallest set of most likely tokens whose mass reaches `top_p`."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    sorted_probs[sorted_probs.cumsum(-1) - sorted_probs > top_p] = 0.0
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


class TransformersLLM:
    """The `LLM` protocol over a Hugging Face causal LM and its tokenizer.

        llm = TransformersLLM.load("default")                     # SmolLM2-135M-Instruct, float32 on CPU
        llm.generate([llm.chat_prompt("Who wrote Hamlet?")], SamplingParams(max_new_tokens=32))
        llm.score(["The capital of France is"], [" Paris"])       # [[log p(" Paris")]]

    ``TransformersLLM(model, tokenizer)`` wraps a model that lives elsewhere, e.g. the policy an RL
    trainer is updating (generation then sees its current weights; the caller puts it in eval mode; the
    prefix cache is emptied whenever a parameter was changed in place or replaced since the last call).
    `prefix_cache_tokens` is the prefix cache's budget in tokens (0: no prefix cache; None: by the model's device,
    `prefix_cache.PREFIX_CACHE_TOKENS_BY_DEVICE`: on a CPU, off on CUDA, where it measured slower).
    """

    def __init__(self, model, tokenizer, name: str | None = None, max_batch_size: int = 16, progress: bool = False,
                 reuse_prefix: bool = True, pass_cost: int | None = None,
                 prefix_cache_tokens: int | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.model = model
        self.owns_model = False  # True when `load` read it: `close` then lets go of it
        self._tokenizer = tokenizer
        self.name = name or getattr(model, "name_or_path", "") or type(model).__name__
        self.max_batch_size = max_batch_size
        self.progress = progress
        #: Default of `generate`'s and `score`'s `reuse_prefix` (callers such as `agent.env.rollout` do not
        #: pass it): set it to False to recompute every row from scratch, e.g. to measure what reuse gains.
        self.reuse_prefix = reuse_prefix
        self.device = next(model.parameters()).device
        #: What one more prefill pass costs, in tokens computed (`length_groups`; None: by device type).
        self.pass_cost = pass_cost if pass_cost is not None else _PASS_COST.get(self.device.type, _PASS_COST["cuda"])
        #: Passes can be merged into one cache where every cache layer holds all its keys and values (not a
        #: sliding window); otherwise a batch's prefill is one padded pass, with no prefix reused.
        self._mergeable = all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)
        #: The KV caches of finished sequences, kept across calls (`agentic_retriever.base.llm.prefix_cache`): a
        #: prompt that starts with one prefills only its new tokens. None: off (`prefix_cache_tokens` 0, or a
        #: model with sliding-window layers, whose caches cannot be cut into rows).
        prefix_cache_tokens = prefix_cache_budget(prefix_cache_tokens, self.device.type)
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 and self._mergeable else None
        if prefix_cache_tokens > 0 and not self._mergeable:
            log.info("%s has sliding-window cache layers: no prefix cache, no shared prefixes", self.name)
        self._weights = self._weights_version()
        self.prefill_stats = PrefillStats()
        self.vocab_size = model.get_input_embeddings().num_embeddings
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids = frozenset(eos_ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = pad if pad is not None else 0  # pad positions are masked: any id does

    @classmethod
    def load(cls, model: str = "default", dtype: str = "auto", device: str = "auto", max_batch_size: int = 16,
             progress: bool = False, prefix_cache_tokens: int | None = None) -> TransformersLLM:
        """Load a hub name, a local folder or ``default`` (the embedded SmolLM2-135M-Instruct)."""
        path = resolve_llm_name(model)
        torch_device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, torch_device)
        tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(torch_device).eval()
        llm = cls(lm, tokenizer, name=model, max_batch_size=max_batch_size, progress=progress,
                  prefix_cache_tokens=prefix_cache_tokens)
        llm.owns_model = True
        return llm

    def close(self) -> None:
        """Let go of the prefix cache and, for a model `load` read (not one lent by its caller, such as the RL
        trainer's policy), of the model, then return the freed CUDA memory to the device."""
        self.prefix_cache = None
        if self.owns_model:
            self.model = None
        release_device_memory()

    def __enter__(self) -> TransformersLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tokenizer(self):
        return self._tokenizer

    def chat_prompt(self, user_message: str) -> str:
        return render_chat_prompt(self._tokenizer, user_message)

    def encode(self, prompt: Prompt, where: str = "prompt") -> list[int]:
        """Token ids of a prompt: text is tokenized with the tokenizer's special tokens (as vLLM does),
        ids are checked against the vocabulary."""
        if isinstance(prompt, str):
            ids = self._tokenizer(prompt, add_special_tokens=True).input_ids
        else:
            try:
                ids = [operator.index(t) for t in prompt]  # ints, numpy ints; not floats
            except TypeError as error:
                raise ValueError(f"{where}: token ids must be integers ({error})") from error
        if not ids:
            raise ValueError(f"{where} is empty: it needs at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{where} holds {len(bad)} token ids outside 0..{self.vocab_size - 1}, e.g. {bad[0]!r}")
        return ids

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Prompt], params: SamplingParams,
                 reuse_prefix: bool | None = None) -> list[list[Generation]]:
        """Per prompt, `params.n` generations, in prompt order.

        Rows (prompt x sample) are run in batches of at most `max_batch_size`. With `reuse_prefix` (None:
        the `reuse_prefix` attribute, True by default), rows are batched by their token ids (`batch_order`)
        and the prefix that each group of a batch's rows shares is computed once; without it, rows are
        batched by length and computed whole (after the prefix cache's longest entry for each, if any). Greedy
        results are the same either way, and with or without the prefix cache. Sampling with a `seed` is
        reproducible for the same prompts, parameters, `max_batch_size` and `reuse_prefix` (one generator
        serves the whole call, so a row's sample depends on its batch).
        """
        reuse = self.reuse_prefix if reuse_prefix is None else reuse_prefix
        ids = [self.encode(p, f"prompt {i}") for i, p in enumerate(prompts)]
        self._forget_stale_prefixes()
        rows = [prompt_ids for prompt_ids in ids for _ in range(params.n)]
        if params.repetition_penalty != 1.0:
            raise ValueError("the transformers backend does not apply a repetition penalty; use vllm or openai, or "
                             "repetition_penalty 1.0")
        generator = None
        seed = params.seed if params.seeds is None else params.prompt_seeds(len(ids))[0]  # one generator: rows differ
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        order = batch_order(rows, reuse)
        results: list[Generation | None] = [None] * len(rows)
        with tqdm(total=len(rows), desc="generating", unit=" seq", disable=not self.progress) as progress:
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start:start + self.max_batch_size]
                outputs = self._generate_batch([rows[r] for r in chunk], params, generator, reuse, progress)
                for r, output in zip(chunk, outputs):
                    results[r] = output
        return [results[i * params.n:(i + 1) * params.n] for i in range(len(ids))]

    @torch.inference_mode()
    def score(self, prompts: Sequence[Prompt], continuations: Sequence[Sequence[int] | str],
              reuse_prefix: bool | None = None) -> list[list[float]]:
        """Per pair, the log-probability of every continuation token given the prompt and the continuation
        tokens before it (temperature 1; no gradients). A text continuation is tokenized on its own,
        without special tokens, so give ids when the boundary tokenization matters. `reuse_prefix` as in
        `generate` (a shared prefix never reaches into a row's continuation)."""
        if len(prompts) != len(continuations):
            raise ValueError(f"score got {len(prompts)} prompts but {len(continuations)} continuations")
        reuse = self.reuse_prefix if reuse_prefix is None else reuse_prefix
        pairs = []
        for i, (prompt, continuation) in enumerate(zip(prompts, continuations)):
            cont = (self._tokenizer(continuation, add_special_tokens=False).input_ids
                    if isinstance(continuation, str) else continuation)
            cont = self.encode(cont, f"continuation {i}") if len(cont) else []
            pairs.append((self.encode(prompt, f"prompt {i}"), cont))
        self._forget_stale_prefixes()
        rows = [p + c for p, c in pairs]
        order = batch_order(rows, reuse)
        scores: list[list[float]] = [[] for _ in pairs]
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start:start + self.max_batch_size]
            batch = [pairs[r] for r in chunk]
            longest = max(len(cont) for _, cont in batch)
            logits, *_ = self._prefill([rows[r] for r in chunk], [len(p) - 1 for p, _ in batch], reuse,
                                       logits_to_keep=longest + 1)
            for row, (r, (_, cont)) in enumerate(zip(chunk, batch)):
                if cont:  # logits at position j predict token j + 1: the last len(cont) + 1 .. 2 positions
                    window = logits[row, longest - len(cont):longest].float().log_softmax(-1)
                    scores[r] = window.gather(1, torch.tensor(cont, device=self.device)[:, None]).squeeze(1).tolist()
        return scores

    def _prefill(self, rows: list[list[int]], limits: list[int], reuse_prefix: bool,
                 logits_to_keep: int) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, torch.Tensor]:
        """Run the prompts through the model: (logits of the last `logits_to_keep` positions, cache,
        attention mask, next position per row). Row i starts from the longest KV cache at hand for at most
        its first `limits[i]` tokens: a prefix cache entry (`prefix_cache`), or, with `reuse_prefix`, the
        prefix its run of `prefix_groups` shares, computed once for the run (itself after the longest
        prefix cache entry it starts with). Only the rest of each row is computed."""
        self.prefill_stats.prompt_tokens += sum(len(row) for row in rows)
        starts = [self._cached(row, limit) for row, limit in zip(rows, limits)]
        self.prefill_stats.cached_tokens += sum(length for _, length in starts)
        runs = [(start, end, length) for start, end, length in prefix_groups(rows, limits) if end - start > 1
                and length > 0] if reuse_prefix and len(rows) > 1 and self._mergeable else []
        if runs:
            heads = self._heads([rows[start][:length] for start, _, length in runs])
            for (start, end, length), head in zip(runs, heads):
                for r in range(start, end):
                    if length > starts[r][1]:
                        starts[r] = (head, length)
        logits, cache, mask = self._extend(rows, starts, logits_to_keep)
        return logits, cache, mask, torch.tensor([len(row) for row in rows], device=self.device)

    def _cached(self, ids: list[int], limit: int) -> tuple[torch.Tensor | None, int]:
        """The prefix cache's longest entry for at most `limit` tokens of `ids`, and that length."""
        if self.prefix_cache is None or limit < 1:
            return None, 0
        return self.prefix_cache.longest(ids, limit)

    def _heads(self, heads: list[list[int]]) -> list[torch.Tensor]:
        """The KV cache ([layers, 2, kv heads, tokens, head dim]) of each shared prefix, computed after the
        longest prefix cache entry it starts with (nothing to compute when an entry holds all of it). A computed
        prefix goes into the prefix cache, so the next batch of a call (or a later call) starts from it: the
        candidates of one agent context, cut into several batches, compute that context once, and prefixes that
        share it (one per candidate when each is scored for several gold answers) start after it."""
        starts = [self._cached(head, len(head)) for head in heads]
        kvs = [kv if length == len(head) else None for head, (kv, length) in zip(heads, starts)]
        todo = [k for k, kv in enumerate(kvs) if kv is None]
        if todo:
            _, cache, mask = self._extend([heads[k] for k in todo], [starts[k] for k in todo], 1)
            for slot, k in enumerate(todo):
                kvs[k] = row_kv(cache, mask, slot)
                if self.prefix_cache is not None:
                    self.prefix_cache.store(heads[k], kvs[k])
        return kvs

    def _extend(self, rows: list[list[int]], starts: list[tuple[torch.Tensor | None, int]],
                logits_to_keep: int) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """Compute each row after the KV cache it starts from (`starts[i]`: a [layers, 2, kv heads, tokens,
        head dim] tensor whose first `length` positions are the cache of ``rows[i][:length]``, or (None, 0)).
        The rest of the rows go through the model in passes of (nearly) equal length (`length_groups`: little
        padding), whose caches are merged, left-padded, into one cache for decoding. Returns (logits of the
        last `logits_to_keep` positions, right-aligned, the cache, the attention mask)."""
        n = len(rows)
        suffixes = [row[length:] for row, (_, length) in zip(rows, starts)]
        groups = self._length_groups([len(suffix) for suffix in suffixes])
        blocks, where, pieces = [], [(0, 0)] * n, []
        for group in groups:
            past = None
            if any(starts[r][1] for r in group):
                past = stack_rows([cached_row(*starts[r]) for r in group], self.model.config, self.device)
            logits, cache, mask = self._forward([suffixes[r] for r in group], [starts[r][1] for r in group],
                                                past, logits_to_keep)
            for slot, r in enumerate(group):
                where[r] = (len(blocks), slot)
            blocks.append((cache, mask))
            pieces.append(logits)
        self.prefill_stats.computed_tokens += sum(len(suffix) for suffix in suffixes)
        cache, mask = self._merge(blocks, where)
        if len(pieces) == 1:
            logits = pieces[0]
        else:  # each pass's logits, right-aligned (a row's own positions are the last ones in every pass)
            keep = max(piece.shape[1] for piece in pieces)
            logits = pieces[0].new_zeros((n, keep, pieces[0].shape[2]))
            for r, (b, slot) in enumerate(where):
                piece = pieces[b][slot]
                logits[r, keep - piece.shape[0]:] = piece
        return logits, cache, mask

    def _weights_version(self) -> tuple[tuple[int, int], ...]:
        """Where each parameter's data lives and how often it was changed in place: an optimizer step, a
        loaded state dict or replaced weights change it (an RL trainer updates the model this backend wraps)."""
        return tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    def _forget_stale_prefixes(self) -> None:
        """Empty the prefix cache when the weights changed since it was filled: its KV caches are theirs."""
        version = self._weights_version()
        if version != self._weights:
            self._weights = version
            if self.prefix_cache is not None:
                self.prefix_cache.clear()

    def _length_groups(self, lengths: list[int]) -> list[list[int]]:
        if not self._mergeable:  # the caches of separate passes cannot be merged: one padded pass
            return [list(range(len(lengths)))]
        return length_groups(lengths, self.pass_cost)

    def _forward(self, ids: list[list[int]], starts: list[int], past: tuple[DynamicCache, torch.Tensor] | None,
                 logits_to_keep: int) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """One pass of token lists, left-padded to one width, after the cache and attention mask `past`
        (None: nothing cached), the first token of list i at position `starts[i]`. Returns (logits of the last
        `logits_to_keep` positions, the cache, the attention mask over the cache)."""
        width = max(len(t) for t in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, tokens in enumerate(ids):
            input_ids[i, width - len(tokens):] = torch.tensor(tokens)
            new_mask[i, width - len(tokens):] = 1
        input_ids, new_mask = input_ids.to(self.device), new_mask.to(self.device)
        if past is None:
            past = DynamicCache(config=self.model.config), new_mask.new_zeros((len(ids), 0))
        cache, mask = past[0], torch.cat([past[1], new_mask], dim=1)
        positions = (torch.tensor(starts, device=self.device)[:, None] + new_mask.cumsum(1) - 1)
        positions = positions.masked_fill(new_mask == 0, 1)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, logits_to_keep=logits_to_keep)
        return out.logits, cache, mask

    def _merge(self, blocks: list[tuple[DynamicCache, torch.Tensor]],
               where: list[tuple[int, int]]) -> tuple[DynamicCache, torch.Tensor]:
        """One cache and attention mask whose row i is row `where[i][1]` of pass `where[i][0]`'s (cache, mask),
        each pass's keys and values left-padded (masked slots) to the widest. A single pass's cache is
        index-selected in place (any cache type)."""
        if len(blocks) == 1:
            cache, mask = blocks[0]
            order = [slot for _, slot in where]
            if order != list(range(len(mask))):
                index = torch.tensor(order, device=self.device)
                cache.batch_select_indices(index)
                mask = mask[index]
            return cache, mask
        return stack_rows([pass_row(*blocks[b], slot) for b, slot in where], self.model.config, self.device)

    def _generate_batch(self, rows: list[list[int]], params: SamplingParams, generator: torch.Generator | None,
                        reuse_prefix: bool, progress: tqdm) -> list[Generation]:
        """Generate for one batch of rows, dropping each row from the batch once it has finished."""
        logits, cache, mask, positions = self._prefill(rows, [len(r) - 1 for r in rows], reuse_prefix, 1)
        logits = logits[:, -1]
        active = list(range(len(rows)))
        generated: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        results: list[Generation | None] = [None] * len(rows)
        for _ in range(params.max_new_tokens):
            tokens, token_logprobs = self._choose(logits, params, generator)
            keep = []
            for slot, (row, token) in enumerate(zip(active, tokens.tolist())):
                generated[row].append(token)
                if token_logprobs is not None:
                    logprobs[row].append(token_logprobs[slot])
                results[row] = self._finished(generated[row], logprobs[row] if params.logprobs else None, params)
                if results[row] is None:
                    keep.append(slot)
                    continue
                progress.update(1)
                if self.prefix_cache is not None:  # its cache holds every token but the last generated one
                    self.prefix_cache.store(rows[row] + generated[row][:-1], row_kv(cache, mask, slot))
            if not keep:
                break
            if len(keep) < len(active):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, positions, tokens = mask[index], positions[index], tokens[index]
                active = [active[slot] for slot in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            out = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                             past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1]
            positions = positions + 1
        return results

    @staticmethod
    def _choose(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> tuple[torch.Tensor, list[float] | None]:
        """Next token per row (argmax, or a sample after temperature, then top-k, top-p and min-p as vLLM orders
        them) and, when asked, its temperature-1 log-probability."""
        logits = logits.float()
        if params.greedy:
            tokens = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / params.temperature, dim=-1)
            if 0 < params.top_k < probs.shape[-1]:
                kth = probs.topk(params.top_k, dim=-1).values[:, -1:]
                probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
                probs = probs / probs.sum(dim=-1, keepdim=True)  # top-p reads the mass of the k left
            if params.top_p < 1.0:
                probs = _top_p_filter(probs, params.top_p)
            if params.min_p > 0:
                floor = params.min_p * probs.max(dim=-1, keepdim=True).values
                probs = torch.where(probs < floor, torch.zeros_like(probs), probs)
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        if not params.logprobs:
            return tokens, None
        return tokens, logits.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1).tolist()

    def _finished(self, ids: list[int], logprobs: list[float] | None, params: SamplingParams) -> Generation | None:
        """The finished generation when `ids` ends in EOS, completes a stop string or reaches the token
        cap; None while the sequence goes on (a finished row leaves the batch, so `ids` is not appended to
        again). The stop is looked for in a decoded tail first (cheap), and confirmed, with the cut, on the
        whole decoded text."""
        if ids[-1] in self.eos_ids:
            return Generation(self._decode(ids), ids, "stop", None, logprobs)
        if params.stop:
            window = 4 * max(len(s) for s in params.stop) + _STOP_WINDOW_SLACK
            if find_stop(self._decode(ids[-window:]), params.stop) is not None:
                text = self._decode(ids)
                found = find_stop(text, params.stop)
                if found is not None:
                    end, stop = found
                    return Generation(text[:end], ids, "stop", stop, logprobs)
        if len(ids) >= params.max_new_tokens:
            return Generation(self._decode(ids), ids, "length", None, logprobs)
        return None

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)
