"""The transformers backend's prefix cache: KV caches of finished sequences reused by later calls whose
prompts extend them (an agent's next turn), on a tiny random-weight Llama: the outputs must be those of
recomputing every prompt, token for token, while only the new tokens are prefilled."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from agentic_retriever.base.llm import SamplingParams
from agentic_retriever.base.llm.prefix_cache import PrefixCache
from agentic_retriever.base.llm.transformers import TransformersLLM


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """One thread: the tiny model's steps are too small to gain from more on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_causal_lm_dir):
    llm = TransformersLLM.load(tiny_causal_lm_dir, device="cpu", prefix_cache_tokens=0)
    return llm.model, llm.tokenizer


def pair(model_and_tokenizer, max_batch_size: int = 3, prefix_cache_tokens: int = 4096,
         eos: int | None = None) -> tuple[TransformersLLM, TransformersLLM]:
    """(with the prefix cache, without it) over the same weights."""
    model, tokenizer = model_and_tokenizer
    llms = tuple(TransformersLLM(model, tokenizer, max_batch_size=max_batch_size, prefix_cache_tokens=tokens)
                 for tokens in (prefix_cache_tokens, 0))
    if eos is not None:
        for llm in llms:
            llm.eos_ids = frozenset({eos})
    return llms


def tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(100, 49000) for _ in range(count)]


def ids_of(outputs) -> list[list[list[int]]]:
    return [[g.token_ids for g in per_prompt] for per_prompt in outputs]


def assert_same(outputs, reference) -> None:
    assert ids_of(outputs) == ids_of(reference)
    for ours, theirs in zip(outputs, reference):
        for a, b in zip(ours, theirs):
            assert (a.logprobs is None) == (b.logprobs is None)
            if a.logprobs is not None:
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def count_forward_tokens(monkeypatch, llm: TransformersLLM) -> list[int]:
    """Spy on the model: the tokens (padding excluded) each forward pass computes."""
    counts: list[int] = []
    forward = llm.model.forward

    def spy(*args, **kwargs):
        width = kwargs["input_ids"].shape[1]
        counts.append(int(kwargs["attention_mask"][:, -width:].sum()))
        return forward(*args, **kwargs)

    monkeypatch.setattr(llm.model, "forward", spy)
    return counts


def next_turn(rng: random.Random, prompts: list[list[int]], outputs) -> list[list[int]]:
    """Each prompt + its generated turn + an observation of its own length: the environment's next prompt."""
    return [prompt + out[0].token_ids + tokens(rng, rng.randrange(3, 40)) for prompt, out in zip(prompts, outputs)]


def test_later_turns_prefill_only_their_new_tokens_and_generate_what_recomputing_does(model_and_tokenizer,
                                                                                      monkeypatch):
    rng = random.Random(11)
    prompts = [tokens(rng, length) for length in (30, 80, 12, 150, 55)]
    free = pair(model_and_tokenizer)[1].generate(prompts, SamplingParams(max_new_tokens=12))
    cached, plain = pair(model_and_tokenizer, eos=free[0][0].token_ids[3])  # row 0 finishes early
    params = SamplingParams(max_new_tokens=12, logprobs=True)
    counts = count_forward_tokens(monkeypatch, cached)

    for turn in range(3):
        before, forward_before = copy.copy(cached.prefill_stats), sum(counts)
        outputs = cached.generate(prompts, params)
        forward_tokens = sum(counts) - forward_before  # (the spy sees the other backend too: same model)

        assert_same(outputs, plain.generate(prompts, params))
        generated = [len(out[0].token_ids) for out in outputs]
        stats = cached.prefill_stats
        computed = stats.computed_tokens - before.computed_tokens
        if turn == 0:
            assert len(set(generated)) > 1, "precondition: rows leave the batch at different steps"
            assert computed == sum(len(p) for p in prompts)  # unrelated prompts: nothing cached yet
        else:  # each prompt extends its previous one: only the last generated token and the observation
            assert computed == sum(len(p) - len(q) - len(g) + 1 for p, q, g in zip(prompts, previous, last))
            assert stats.cached_tokens - before.cached_tokens == sum(len(p) for p in prompts) - computed
        assert forward_tokens == computed + sum(g - 1 for g in generated)  # and decoding, nothing else
        previous, last = prompts, [out[0].token_ids for out in outputs]
        prompts = next_turn(rng, prompts, outputs)
    assert len(cached.prefix_cache) == len(prompts)  # an entry per sequence: the ones it extended were dropped


def test_a_prompt_sharing_only_the_start_of_a_kept_sequence_reuses_that_start(model_and_tokenizer):
    rng = random.Random(12)
    cached, plain = pair(model_and_tokenizer)
    params = SamplingParams(max_new_tokens=6)
    instructions = tokens(rng, 60)
    cached.generate([instructions + tokens(rng, 20)], params)
    other_questions = [instructions + tokens(rng, 15), instructions[:40] + tokens(rng, 30)]
    before = copy.copy(cached.prefill_stats)

    outputs = cached.generate(other_questions, params)

    assert_same(outputs, plain.generate(other_questions, params))
    assert cached.prefill_stats.cached_tokens - before.cached_tokens >= 60 + 40


def test_continuations_of_one_context_start_from_its_kept_turn(model_and_tokenizer):
    """Global answer correctness: several candidate observations after one context whose previous turn is
    cached; the context is not computed again, the candidates' shared start once."""
    rng = random.Random(13)
    cached, plain = pair(model_and_tokenizer, max_batch_size=8)
    params = SamplingParams(max_new_tokens=8, logprobs=True)
    context = tokens(rng, 120)
    turn = cached.generate([context], params)[0][0].token_ids
    doc = tokens(rng, 6)  # "<information>Doc 1(Title: "
    candidates = [context + turn + doc + tokens(rng, rng.randrange(10, 30)) for _ in range(5)]
    before = copy.copy(cached.prefill_stats)

    outputs = cached.generate(candidates, params)

    assert_same(outputs, plain.generate(candidates, params))
    computed = cached.prefill_stats.computed_tokens - before.computed_tokens
    assert computed == 1 + len(doc) + sum(len(c) - len(context) - len(turn) - len(doc) for c in candidates)


def test_seeded_sampling_with_the_cache_draws_what_it_draws_without(model_and_tokenizer):
    rng = random.Random(14)
    cached, plain = pair(model_and_tokenizer, max_batch_size=4)
    prompts = [tokens(rng, length) for length in (25, 70, 40)]
    for turn, n in enumerate((1, 1, 3)):  # then a group of samples per prompt, as GRPO draws
        params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, n=n, seed=turn, logprobs=True)
        outputs = cached.generate(prompts, params)
        assert_same(outputs, plain.generate(prompts, params))
        prompts = next_turn(rng, prompts, outputs)
    assert cached.prefill_stats.cached_tokens > 0


def test_eviction_keeps_the_budget_and_changes_no_output(model_and_tokenizer):
    rng = random.Random(15)
    budget = 200
    cached, plain = pair(model_and_tokenizer, prefix_cache_tokens=budget)
    params = SamplingParams(max_new_tokens=8)
    prompts = [tokens(rng, length) for length in (60, 90, 20, 250)]  # the last one never fits
    for _ in range(3):
        outputs = cached.generate(prompts, params)
        assert_same(outputs, plain.generate(prompts, params))
        assert 0 < cached.prefix_cache.tokens <= budget
        prompts = next_turn(rng, prompts, outputs)
    assert cached.prefill_stats.cached_tokens > 0


def test_updated_weights_empty_the_cache(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    cached = TransformersLLM(model, tokenizer, prefix_cache_tokens=4096)
    params = SamplingParams(max_new_tokens=6)
    prompt = tokens(random.Random(16), 50)
    extended = prompt + cached.generate([prompt], params)[0][0].token_ids + [500, 501]
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # as an optimizer step does, in place
    before = cached.prefill_stats.cached_tokens

    outputs = cached.generate([extended], params)

    assert cached.prefill_stats.cached_tokens == before
    assert_same(outputs, TransformersLLM(model, tokenizer, prefix_cache_tokens=0).generate([extended], params))


def test_half_precision_weights_reuse_the_cache_on_cpu(tiny_causal_lm_dir):
    rng = random.Random(17)
    cached = TransformersLLM.load(tiny_causal_lm_dir, dtype="bfloat16", device="cpu")
    assert cached.model.dtype == torch.bfloat16 and cached.prefix_cache is not None
    params = SamplingParams(max_new_tokens=6, logprobs=True)
    prompts = [tokens(rng, 40), tokens(rng, 70)]
    outputs = cached.generate(prompts, params)
    prompts = next_turn(rng, prompts, outputs)

    outputs = cached.generate(prompts, params)

    assert all(len(out[0].token_ids) == 6 and len(out[0].logprobs) == 6 for out in outputs)
    assert cached.prefill_stats.cached_tokens > 0


def kv(length: int, value: float = 0.0) -> torch.Tensor:
    return torch.full((1, 2, 1, length, 1), value)


def test_prefix_cache_finds_the_longest_shared_prefix_within_the_limit():
    cache = PrefixCache(max_tokens=100)
    cache.store([1, 2, 3, 4], kv(4, 1.0))
    cache.store([1, 2, 9], kv(3, 2.0))
    found, length = cache.longest([1, 2, 3, 4, 5], limit=10)
    assert length == 4 and found[0, 0, 0, 0, 0] == 1.0
    assert cache.longest([1, 2, 3, 4, 5], limit=2)[1] == 2
    assert cache.longest([1, 2, 9, 9], limit=10)[0][0, 0, 0, 0, 0] == 2.0
    assert cache.longest([7, 1, 2], limit=10) == (None, 0)
    with pytest.raises(ValueError, match="3 positions cannot be the cache of 2 tokens"):
        cache.store([1, 2], kv(3))


def test_prefix_cache_drops_what_a_sequence_extends_then_the_least_recently_used():
    cache = PrefixCache(max_tokens=9)
    cache.store([1, 2], kv(2))
    cache.store([1, 2, 3, 4], kv(4))  # extends [1, 2]: one entry
    assert (len(cache), cache.tokens) == (1, 4)
    cache.store([5, 6, 7], kv(3))
    cache.longest([1, 2, 3], limit=3)  # [1, 2, 3, 4] is now the most recently used
    cache.store([8, 9, 10], kv(3))  # 10 tokens: [5, 6, 7] goes
    assert (len(cache), cache.tokens) == (2, 7)
    assert cache.longest([5, 6], limit=2) == (None, 0) and cache.longest([1, 2, 3, 4], limit=4)[1] == 4
    cache.store(list(range(20, 30)), kv(10))  # longer than the budget: not kept, nothing evicted
    assert (len(cache), cache.tokens) == (2, 7)
    with pytest.raises(ValueError, match="at least 1 token"):
        PrefixCache(max_tokens=0)


def test_the_default_budget_follows_the_device_the_cache_measured_faster_on(model_and_tokenizer):
    """Unset, the budget is the device's (on a CPU, off on CUDA, where it measured slower); a set budget, 0
    included, holds on any device; the loader's setting reaches the backend."""
    from agentic_retriever.base.llm import LLMConfig, load_llm
    from agentic_retriever.base.llm.prefix_cache import DEFAULT_PREFIX_CACHE_TOKENS, prefix_cache_budget

    model, tokenizer = model_and_tokenizer
    assert TransformersLLM(model, tokenizer).prefix_cache.max_tokens == DEFAULT_PREFIX_CACHE_TOKENS  # a CPU model
    assert TransformersLLM(model, tokenizer, prefix_cache_tokens=0).prefix_cache is None
    assert [prefix_cache_budget(None, "cuda"), prefix_cache_budget(4096, "cuda"), prefix_cache_budget(0, "cpu"),
            prefix_cache_budget(None, "mps")] == [0, 4096, 0, 0]
    path = model.name_or_path
    assert load_llm(LLMConfig(model=path, device="cpu", prefix_cache_tokens=512)).prefix_cache.max_tokens == 512
    assert load_llm(LLMConfig(model=path, device="cpu", enable_prefix_caching=False)).prefix_cache is None


def test_scoring_many_golds_per_candidate_computes_the_agent_context_once(model_and_tokenizer):
    """Answer-likelihood GAC with a list answer: every candidate observation after one agent context is scored
    for several golds, so the rows share the context, then each candidate's observation. Cut into batches of 4,
    the context is computed once, not once per candidate or per batch: each shared prefix a batch computes is
    kept for the next ones."""
    rng = random.Random(16)
    cached, plain = pair(model_and_tokenizer, max_batch_size=4)
    context, lead = tokens(rng, 150), tokens(rng, 3)
    observations = [tokens(rng, rng.randrange(10, 30)) for _ in range(6)]
    golds = [tokens(rng, n) for n in (2, 4, 5)]
    prompts = [context + observation + lead for observation in observations for _ in golds]
    continuations = [gold for _ in observations for gold in golds]
    before = copy.copy(cached.prefill_stats)

    scores = cached.score(prompts, continuations)

    for ours, theirs in zip(scores, plain.score(prompts, continuations)):
        assert ours == pytest.approx(theirs, abs=1e-4)
    computed = cached.prefill_stats.computed_tokens - before.computed_tokens
    after_context = sum(len(p) + len(c) - len(context) for p, c in zip(prompts, continuations))
    assert computed <= len(context) + after_context


def test_the_backend_takes_its_default_budget_from_the_device_its_model_is_on(model_and_tokenizer, monkeypatch):
    """`TransformersLLM` itself reads its model's device: a model on a device the table does not name (the meta
    device stands in for an accelerator) gets no cache, and the table's entry for that device when it has one."""
    import agentic_retriever.base.llm.prefix_cache as prefix_cache
    from transformers import AutoModelForCausalLM

    model, tokenizer = model_and_tokenizer
    with torch.device("meta"):
        elsewhere = AutoModelForCausalLM.from_config(model.config)
    assert TransformersLLM(elsewhere, tokenizer).prefix_cache is None
    monkeypatch.setitem(prefix_cache.PREFIX_CACHE_TOKENS_BY_DEVICE, "meta", 1234)
    assert TransformersLLM(elsewhere, tokenizer).prefix_cache.max_tokens == 1234
    assert TransformersLLM(elsewhere, tokenizer, prefix_cache_tokens=0).prefix_cache is None
