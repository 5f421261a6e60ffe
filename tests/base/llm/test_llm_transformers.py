"""The transformers backend's generation loop, on a tiny random-weight Llama (mechanics, not quality)."""

from __future__ import annotations

import random

import pytest
import torch

from agentic_retriever.base.llm import LLM, LLMConfig, SamplingParams, load_llm
from agentic_retriever.base.llm.batching import batch_order, common_prefix_length, length_groups, prefix_groups
from agentic_retriever.base.llm.text import find_stop
from agentic_retriever.base.llm.transformers import TransformersLLM

PROMPTS = ["The river", "A castle on the mountain near the old harbor", "Question: who wrote Hamlet?\n", "x"]
CONTEXT = "Context: the falcon flew over the glacier toward the library at dawn. " * 4


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The tiny model's steps are too small to gain from threads, and threads that wait for a busy
    core spin: one thread keeps this module fast on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llm(tiny_causal_lm_dir) -> TransformersLLM:
    """Without the prefix cache: these tests pin what one call computes (test_llm_prefix_cache.py: across calls)."""
    return TransformersLLM.load(tiny_causal_lm_dir, device="cpu", prefix_cache_tokens=0)


def with_batch_size(llm: TransformersLLM, max_batch_size: int) -> TransformersLLM:
    return TransformersLLM(llm.model, llm.tokenizer, name=llm.name, max_batch_size=max_batch_size,
                           prefix_cache_tokens=0)


def ids_of(outputs) -> list[list[list[int]]]:
    return [[g.token_ids for g in per_prompt] for per_prompt in outputs]


def full_logprobs(llm: TransformersLLM, prompt_ids: list[int], continuation: list[int]) -> list[float]:
    """Reference: log-softmax of one unbatched forward pass over prompt + continuation."""
    with torch.no_grad():
        logits = llm.model(torch.tensor([prompt_ids + continuation])).logits[0].float().log_softmax(-1)
    return [logits[len(prompt_ids) - 1 + i, token].item() for i, token in enumerate(continuation)]


def record_batches(monkeypatch, llm: TransformersLLM) -> list[tuple[int, int]]:
    """Spy on the model's forward passes: (batch size, new tokens) of each call."""
    calls: list[tuple[int, int]] = []
    forward = llm.model.forward

    def spy(*args, **kwargs):
        calls.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    monkeypatch.setattr(llm.model, "forward", spy)
    return calls


def test_load_llm_builds_the_transformers_backend(tiny_causal_lm_dir):
    llm = load_llm(LLMConfig(backend="transformers", model=tiny_causal_lm_dir, device="cpu", max_batch_size=3))
    assert isinstance(llm, LLM) and isinstance(llm, TransformersLLM)
    assert llm.max_batch_size == 3 and llm.model.dtype == torch.float32 and llm.name == tiny_causal_lm_dir


def test_batched_greedy_equals_one_prompt_at_a_time(llm):
    params = SamplingParams(max_new_tokens=12)
    alone = [llm.generate([p], params)[0] for p in PROMPTS]
    assert ids_of(llm.generate(PROMPTS, params)) == ids_of(alone)
    assert ids_of(with_batch_size(llm, 2).generate(PROMPTS, params)) == ids_of(alone)  # split into batches
    first = alone[0][0]
    assert len(first.token_ids) == 12 and first.finish_reason == "length" and first.stop_string is None
    assert first.text == llm.tokenizer.decode(first.token_ids, skip_special_tokens=True)


def test_token_id_prompts_equal_text_prompts(llm):
    params = SamplingParams(max_new_tokens=8)
    as_ids = [llm.tokenizer(p).input_ids for p in PROMPTS]
    assert ids_of(llm.generate(as_ids, params)) == ids_of(llm.generate(PROMPTS, params))


def test_each_sequence_stops_at_its_own_stop_string_while_the_others_go_on(llm, monkeypatch):
    free = llm.generate(PROMPTS[:3], SamplingParams(max_new_tokens=14))
    pieces = [llm.tokenizer.decode(g[0].token_ids[a:b]) for g, (a, b) in zip(free, [(2, 4), (9, 11)])]
    stops = [piece.strip() or piece for piece in pieces]  # a stop for row 0 early, row 1 late, none chosen for row 2
    expected = []
    for output in free:
        ids = output[0].token_ids
        ends = [k for k in range(1, len(ids) + 1) if find_stop(llm.tokenizer.decode(ids[:k]), stops)]
        expected.append(ends[0] if ends else len(ids))
    assert expected[0] < expected[1] < 14 == expected[2], "precondition: rows finish at different steps"
    calls = record_batches(monkeypatch, llm)

    stopped = llm.generate(PROMPTS[:3], SamplingParams(max_new_tokens=14, stop=stops))

    for output, free_output, length in zip(stopped, free, expected):
        g = output[0]
        assert g.token_ids == free_output[0].token_ids[:length]
        full_text = llm.tokenizer.decode(g.token_ids)
        if length < 14:
            end, stop = find_stop(full_text, stops)
            assert (g.finish_reason, g.stop_string, g.text) == ("stop", stop, full_text[:end])
            assert g.text.endswith(stop)
        else:
            assert (g.finish_reason, g.stop_string, g.text) == ("length", None, full_text)
    batch_sizes = [b for b, new in calls if new == 1]  # decode steps
    assert batch_sizes[0] == 3 and batch_sizes[-1] == 1 and batch_sizes == sorted(batch_sizes, reverse=True)


def test_a_token_that_overruns_the_stop_string_is_kept_but_the_text_is_cut(llm):
    free = llm.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10))[0][0]
    token_texts = [llm.tokenizer.decode([t]) for t in free.token_ids]
    k = next(i for i, t in enumerate(token_texts) if len(t.strip()) >= 3)
    stop = token_texts[k].strip()[:2]  # the first two characters of a token: completing it overruns
    assert find_stop(llm.tokenizer.decode(free.token_ids[:k]), [stop]) is None, "precondition: no earlier stop"

    g = llm.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10, stop=[stop]))[0][0]

    assert g.token_ids == free.token_ids[:k + 1] and g.stop_string == stop and g.finish_reason == "stop"
    assert g.text.endswith(stop) and llm.tokenizer.decode(g.token_ids).startswith(g.text)
    assert len(g.text) < len(llm.tokenizer.decode(g.token_ids))


def test_an_eos_token_finishes_the_sequence(llm):
    free = llm.generate([PROMPTS[1]], SamplingParams(max_new_tokens=10))[0][0]
    eos = free.token_ids[3]
    assert eos not in free.token_ids[:3], "precondition"
    stopping = TransformersLLM(llm.model, llm.tokenizer)
    stopping.eos_ids = frozenset({eos})

    g = stopping.generate([PROMPTS[1]], SamplingParams(max_new_tokens=10))[0][0]

    assert g.token_ids == free.token_ids[:4] and g.finish_reason == "stop" and g.stop_string is None


def test_seeded_sampling_is_reproducible_and_n_samples_differ(llm):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=3, seed=7)
    first = llm.generate(PROMPTS[:2], params)
    again = llm.generate(PROMPTS[:2], params)
    other_seed = llm.generate(PROMPTS[:2], SamplingParams(max_new_tokens=8, temperature=1.0, n=3, seed=8))
    assert [len(per_prompt) for per_prompt in first] == [3, 3]
    assert ids_of(first) == ids_of(again)
    assert ids_of(first) != ids_of(other_seed)
    assert len({tuple(g.token_ids) for g in first[0]}) == 3


def test_top_p_that_keeps_only_the_best_token_is_greedy(llm):
    greedy = llm.generate(PROMPTS, SamplingParams(max_new_tokens=6))
    nucleus = llm.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=1.5, top_p=1e-6, seed=0))
    assert ids_of(nucleus) == ids_of(greedy)


def test_logprobs_are_the_temperature_one_log_softmax_of_a_full_forward_pass(llm):
    for params in (SamplingParams(max_new_tokens=6, logprobs=True),
                   SamplingParams(max_new_tokens=6, logprobs=True, temperature=0.7, seed=3)):
        outputs = llm.generate(PROMPTS[:3], params)
        for prompt, output in zip(PROMPTS[:3], outputs):
            g = output[0]
            assert len(g.logprobs) == len(g.token_ids)
            reference = full_logprobs(llm, llm.tokenizer(prompt).input_ids, g.token_ids)
            assert g.logprobs == pytest.approx(reference, abs=1e-4)
    assert llm.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))[0][0].logprobs is None


def test_score_gives_the_log_probs_of_given_continuations(llm):
    prompts = [CONTEXT + "Answer:", CONTEXT + "Final answer:", "The river"]
    continuations = [llm.tokenizer(" Paris").input_ids, llm.tokenizer(" the Nile river").input_ids, " flows"]

    scores = llm.score(prompts, continuations)

    for prompt, continuation, score in zip(prompts, continuations, scores):
        ids = llm.tokenizer(continuation).input_ids if isinstance(continuation, str) else continuation
        assert score == pytest.approx(full_logprobs(llm, llm.tokenizer(prompt).input_ids, ids), abs=1e-4)
    assert llm.score(["The river"], [[]]) == [[]]
    with pytest.raises(ValueError, match="2 prompts but 1 continuations"):
        llm.score(["a", "b"], [[1]])


def test_a_shared_prefix_is_computed_once_and_changes_nothing(llm, monkeypatch):
    candidates = [CONTEXT + f"Candidate passage {i}: the {word} is here." for i, word in
                  enumerate("river mountain castle violin comet harbor".split())]
    params = SamplingParams(max_new_tokens=10, logprobs=True)
    without = llm.generate(candidates, params, reuse_prefix=False)
    calls = record_batches(monkeypatch, llm)

    reused = llm.generate(candidates, params)

    shared = common_prefix_length([llm.tokenizer(c).input_ids for c in candidates])
    assert shared > 40 and calls[0] == (1, shared)  # the prefix alone, once
    assert calls[1][0] == len(candidates) and calls[1][1] < 20  # then only the suffixes, batched
    assert ids_of(reused) == ids_of(without)
    for a, b in zip(reused, without):
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    scored = [llm.score(candidates, [[11, 12]] * len(candidates), reuse_prefix=flag) for flag in (True, False)]
    assert [s for row in scored[0] for s in row] == pytest.approx([s for row in scored[1] for s in row], abs=1e-4)


def test_chat_prompt_renders_one_user_turn_with_the_generation_prompt(llm):
    text = llm.chat_prompt("Who wrote Hamlet?")
    assert text == llm.tokenizer.apply_chat_template([{"role": "user", "content": "Who wrote Hamlet?"}],
                                                     tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n")


def test_bad_prompts_are_refused_with_the_reason(llm):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        llm.generate(["fine", []], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="prompt 0 holds 1 token ids outside"):
        llm.generate([[1, 10**7]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="prompt 0: token ids must be integers"):
        llm.generate([[1, 2.5]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="unknown device"):
        TransformersLLM.load("unused", device="tpu-ish")


def record_passes(monkeypatch, llm: TransformersLLM) -> list[dict]:
    """Spy on the model's forward passes: input ids, attention mask and cached length of each call."""
    calls: list[dict] = []
    forward = llm.model.forward

    def spy(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        calls.append({"ids": kwargs["input_ids"].clone(), "mask": kwargs.get("attention_mask"),
                      "cached": cache.get_seq_length() if cache is not None else 0})
        return forward(*args, **kwargs)

    monkeypatch.setattr(llm.model, "forward", spy)
    return calls


def gac_like_prompts(llm: TransformersLLM) -> tuple[list[list[int]], list[int], list[list[int]], int]:
    """Continuation prompts shaped like global answer correctness: per round, the chat prompt and the
    round's context (long; round 2 of question A extends round 1's, as a trajectory does), then one
    candidate passage as the observation. Returns (prompts shuffled, round of each, round contexts, the
    longest observation in tokens)."""
    def encode(text: str) -> list[int]:
        return llm.tokenizer.encode(text, add_special_tokens=False)

    think = "<think>" + "The falcon saw the comet over the glacier, so the castle must face the river. " * 3
    turn1 = think + "I need the river first.</think>\n<search>which river runs past the castle</search>"
    real_obs = "\n\n<information>Doc 1(Title: Harbor) " + "the harbor trade grew along the river. " * 20 + \
               "</information>\n\n<think>Now the mountain.</think>\n<search>mountain above the harbor</search>"
    questions = {"A": "Which comet was seen from the castle on the mountain?", "B": "Who built the old library?"}
    contexts = [  # (question, response so far, ending with a search call)
        ("A", turn1),
        ("A", turn1 + real_obs),
        ("B", think + "Look it up.</think>\n<search>old library builder</search>"),
    ]
    heads = [encode(llm.chat_prompt(questions[q])) + encode(text) for q, text in contexts]
    words = ["river", "mountain", "castle", "violin", "comet", "harbor", "desert", "glacier"]
    prompts, owners, longest = [], [], 0
    for r, head in enumerate(heads):
        for c, word in enumerate(words[:4]):
            observation = encode(f"\n\n<information>Doc 1(Title: {word.title()} {c}) The {word} of round {r} "
                                 f"lies near the {words[(c + r + 3) % 8]}.</information>\n\n")
            prompts.append(head + observation)
            owners.append(r)
            longest = max(longest, len(observation))
    shuffled = list(range(len(prompts)))
    random.Random(3).shuffle(shuffled)
    return [prompts[i] for i in shuffled], [owners[i] for i in shuffled], heads, longest


@pytest.mark.parametrize("max_batch_size", [16, 4, 3])
def test_gac_continuations_batch_by_round_and_reuse_each_round_context(llm, monkeypatch, max_batch_size):
    prompts, owners, heads, observation = gac_like_prompts(llm)
    assert min(len(h) for h in heads) > 3 * observation, "precondition: the contexts are the long part"
    batched = with_batch_size(llm, max_batch_size)
    params = SamplingParams(max_new_tokens=6, logprobs=True)
    without = batched.generate(prompts, params, reuse_prefix=False)
    calls = record_passes(monkeypatch, batched)

    reused = batched.generate(prompts, params)

    assert ids_of(reused) == ids_of(without)  # in prompt order, as computed from scratch
    for a, b in zip(reused, without):
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    prefix_passes = [k for k, call in enumerate(calls) if call["cached"] == 0]  # by length, maybe several a batch
    suffix_passes = [k for k, call in enumerate(calls) if call["cached"] > 0 and call["ids"].shape[1] > 1]
    covered = set()
    for k in prefix_passes:
        heads_run = [row[mask.bool()].tolist() for row, mask in zip(calls[k]["ids"], calls[k]["mask"])]
        for run in heads_run:  # each prefix computed once covers a whole round context
            rounds = [r for r, head in enumerate(heads) if run[:len(head)] == head]
            assert rounds, "a shared prefix stops inside a round context"
            covered.add(max(rounds, key=lambda r: len(heads[r])))
    assert covered == set(owners)
    assert suffix_passes  # and no row recomputes any of its context:
    assert all(calls[k]["ids"].shape[1] <= observation for k in suffix_passes)
    if max_batch_size == 16:  # one batch: the round contexts each computed once, except that round 2's rows
        # sort among round 1's (after the same "Doc 1(Title: "), which may then be computed twice
        assert len(heads) <= sum(calls[k]["ids"].shape[0] for k in prefix_passes) <= len(heads) + 1


def test_batch_order_keeps_rows_sharing_a_prefix_together_and_groups_them():
    a, b = list(range(100, 160)), list(range(300, 340))
    rows = [a + [1], b + [5], a + [2], [7, 8], b + [6, 9], a + [3], [7, 9, 9]]
    order = batch_order(rows, reuse_prefix=True)
    assert sorted(order) == list(range(len(rows)))
    families = [{3, 6}, {1, 4}, {0, 2, 5}]  # shortest family first
    assert [set(order[:2]), set(order[2:4]), set(order[4:])] == families
    assert batch_order(rows, reuse_prefix=False) == sorted(range(len(rows)), key=lambda r: len(rows[r]))

    batch = [rows[r] for r in order]
    runs = prefix_groups(batch, [len(row) - 1 for row in batch])
    assert runs == [(0, 2, 1), (2, 4, 40), (4, 7, 60)]
    assert prefix_groups([a + [1], a + [1]], [len(a)] * 2) == [(0, 2, len(a))]  # capped by the limits
    assert prefix_groups([[1, 2], [3, 4]], [0, 1]) == [(0, 1, 0), (1, 2, 1)]


def test_length_groups_weigh_padding_against_one_more_pass():
    assert length_groups([9, 6, 1], pass_cost=32) == [[0, 1, 2]]  # 11 padding tokens: cheaper than a pass
    assert length_groups([500, 20, 480, 250, 10, 245], pass_cost=32) == [[1, 4], [3, 5], [0, 2]]
    assert length_groups([500, 20, 480, 250, 10, 245], pass_cost=10**6) == [[0, 1, 2, 3, 4, 5]]
    assert length_groups([100, 50, 100], pass_cost=0) == [[1], [0, 2]]


def test_prefill_passes_group_rows_of_equal_length_and_change_nothing(llm, monkeypatch):
    """Prompts of very different lengths: the prefill runs them (prefixes, then suffixes) in passes of
    (nearly) equal length, whose caches are merged for batched decoding, with the results of one prompt at
    a time."""
    rng = random.Random(5)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(100, 49000) for _ in range(count)]

    base = tokens(200)  # two prompts share it, with suffixes of very different lengths
    prompts = [tokens(length) for length in (300, 60, 420, 150, 62, 300, 145, 58)] + [base + tokens(10),
                                                                                     base + tokens(190)]
    lengths = [len(p) for p in prompts]
    assert 1 - sum(lengths) / (len(lengths) * max(lengths)) > 0.4, "precondition: one pass would be mostly padding"
    params = SamplingParams(max_new_tokens=8, logprobs=True)
    alone = [llm.generate([p], params)[0] for p in prompts]
    to_score = prompts + [prompts[1][:1]]  # and a one-token prompt: no prefix to reuse
    continuations = [tokens(k % 4 + 1) for k in range(len(to_score))]
    references = [full_logprobs(llm, p, c) for p, c in zip(to_score, continuations)]
    calls = record_passes(monkeypatch, llm)

    batched = llm.generate(prompts, params)

    assert ids_of(batched) == ids_of(alone)
    for a, b in zip(batched, alone):
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    for call in calls:  # prefill and decode passes: the padding among each pass's new tokens
        width = call["ids"].shape[1]
        new_mask = call["mask"][:, -width:]
        assert new_mask.sum().item() >= 0.9 * new_mask.numel()
    prefill = [call for call in calls if call["ids"].shape[1] > 1]
    assert len(prefill) >= 4 and max(call["ids"].shape[0] for call in prefill) >= 2  # grouped, not one a pass
    assert max(call["cached"] for call in prefill) >= len(base)  # the shared prefix was computed once
    assert sum(call["ids"].shape[1] for call in prefill if call["cached"] >= len(base)) < 190 + 10 + 2

    for flag in (True, False):
        scored = llm.score(to_score, continuations, reuse_prefix=flag)
        assert [len(s) for s in scored] == [len(c) for c in continuations]
        assert [s for row in scored for s in row] == pytest.approx([s for row in references for s in row], abs=1e-4)
