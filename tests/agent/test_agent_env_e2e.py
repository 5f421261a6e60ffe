"""The environment end to end: the transformers backend with a tiny Llama, and a real dense index."""

from __future__ import annotations

import itertools

import pytest
import torch

from agent.dialects import SearchR1Dialect
from agent.env import EnvConfig, Prefix, rollout
from agentic_retriever.base.corpus import ScoredPassage
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.base.llm import LLMConfig, load_llm
from agentic_retriever.index import DenseParams, IndexBuildConfig, build_index, open_index
from agentic_retriever.retrieval import LocalRetrievalClient
from tests.fakes import synthetic_rows, write_jsonl

pytestmark = pytest.mark.slow  # both tests share a module-scoped tiny Llama and a real index, seconds to build

TURN = "<search> river </search>"


def always_search(llm) -> None:
    """Rewire the tiny random Llama into a bigram model that writes `TURN` after a prompt or an observation.

    Attention and MLP outputs are zeroed, so the last hidden state is the current token's embedding; the
    chain's tokens get orthogonal embeddings and an untied output layer maps each to its successor.
    """
    tok, model = llm.tokenizer, llm.model
    prompt_end = tok.encode(llm.chat_prompt("x"), add_special_tokens=False)[-1]
    observation_end = tok.encode("</information>\n\n", add_special_tokens=False)[-1]
    chain = tok.encode(TURN, add_special_tokens=False)
    successors = {prompt_end: chain[0], observation_end: chain[0], **dict(itertools.pairwise(chain))}
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        head = torch.zeros_like(embeddings)
        for k, (token, successor) in enumerate(successors.items()):
            embeddings[token] = 0.0
            embeddings[token, k] = 1.0
            head[successor, k] = 1.0
        model.lm_head.weight = torch.nn.Parameter(head)


@pytest.fixture(scope="module")
def searching_llm(tiny_causal_lm_dir):
    llm = load_llm(LLMConfig(backend="transformers", model=tiny_causal_lm_dir, device="cpu"))
    always_search(llm)
    return llm


@pytest.fixture(scope="module")
def client(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("e2e-index")
    corpus = write_jsonl(folder / "corpus.jsonl", synthetic_rows(40))
    cache = str(folder / "cache")  # module scope: set up before the autouse cache isolation, so name it here
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(folder / "index"), corpus_cache=cache,
                                 encoder=EncoderConfig(model=tiny_model_dir), dense=DenseParams(chunk_size=64)))
    return LocalRetrievalClient(open_index(folder / "index", corpus_cache=cache))


def test_rollout_with_a_real_model_and_index(searching_llm, client):
    config = EnvConfig(max_turns=2, topk=2, max_new_tokens_per_turn=12, observation_max_tokens=400,
                       max_context_tokens=512)
    questions = ["Which river is near the castle?", "Where is item 7 kept?"]
    results = rollout(questions, searching_llm, client, config)
    dialect, tok = SearchR1Dialect(), searching_llm.tokenizer
    for question, result in zip(questions, results):
        expected = client.retrieve(["river"], 2, questions=[question])[0]
        observation = dialect.format_observation([expected])
        assert [t.text for t in result.turns] == [TURN] * 3  # two searches, then the search-disabled turn
        assert [t.retrieved[0].ids for t in result.turns[:2]] == [[p.id for p in expected]] * 2
        assert result.turns[2].retrieved == [] and result.finish_reason == "max_turns" and result.answer is None
        assert result.response_text == (TURN + observation) * 2 + TURN
        generated = [s for s in result.segments if s.generated]
        inserted = [s for s in result.segments if not s.generated]
        assert [tok.decode(s.token_ids, skip_special_tokens=True) for s in generated] == [TURN] * 3
        assert [tok.decode(s.token_ids) for s in inserted] == [observation] * 2
        assert len(result.response_mask) == len(result.response_ids) == sum(len(s.token_ids) for s in result.segments)
    assert rollout(questions, searching_llm, client, config) == results  # deterministic


def test_resumed_rollout_with_a_real_model_and_index(searching_llm, client):
    forced = ScoredPassage("x1", "Forced", "a passage given by the miner", 0.0)
    config = EnvConfig(max_turns=2, topk=1, max_new_tokens_per_turn=12, max_context_tokens=512)
    [result] = rollout(["Which river?"], searching_llm, client, config, prefixes=[Prefix(TURN, [forced])])
    assert result.turns[0].forced and result.turns[0].retrieved[0].ids == ["x1"]
    assert result.response_text.startswith(TURN + '\n\n<information>Doc 1(Title: "Forced") a passage')
    expected = client.retrieve(["river"], 1, questions=["Which river?"])[0]
    assert result.turns[1].retrieved[0].ids == [expected[0].id]
    assert result.finish_reason == "max_turns" and len(result.turns) == 3


def test_later_turns_and_gac_continuations_reuse_the_prefix_cache_and_change_nothing(tiny_causal_lm_dir, client):
    """The backend's prefix cache across the environment's turns (the random Llama writes no tag, so every
    turn ends in an invalid-action message and the next one extends the context): the rollouts are those of
    recomputing every context, and each later turn takes its context up to its last generated token from
    the cache."""
    config = EnvConfig(max_turns=3, topk=2, max_new_tokens_per_turn=10, observation_max_tokens=60,
                       max_context_tokens=1024)
    settings = {"backend": "transformers", "model": tiny_causal_lm_dir, "device": "cpu"}
    cached = load_llm(LLMConfig(**settings))
    plain = load_llm(LLMConfig(**settings, enable_prefix_caching=False))
    assert cached.prefix_cache is not None and plain.prefix_cache is None
    questions = ["Which river is near the castle?", "Where is item 7 kept?", "Who built the tower?"]
    candidates = [ScoredPassage(f"c{k}", f"Candidate {k}", f"candidate passage {k} about the river", 0.0)
                  for k in range(3)]
    gac = [Prefix("<think>look it up</think>\n<search>river castle</search>", [c], 1) for c in candidates]

    for prefixes in (None, gac):
        computed_before = cached.prefill_stats.computed_tokens, plain.prefill_stats.computed_tokens
        cached_before = cached.prefill_stats.cached_tokens
        ours = rollout(questions, cached, client, config, prefixes=prefixes)

        assert [r.response_ids for r in ours] == [r.response_ids for r in rollout(questions, plain, client, config,
                                                                                  prefixes=prefixes)]
        ends = []  # per later turn: the context's length after the previous generated turn
        for result in ours:
            length, generated_ends = len(result.prompt_ids), []
            for segment in result.segments:
                length += len(segment.token_ids)
                if segment.generated:
                    generated_ends.append(length)
            ends.extend(generated_ends[:-1])
        assert len(ends) >= len(questions)
        assert cached.prefill_stats.cached_tokens - cached_before >= sum(end - 1 for end in ends)
        ours_computed = cached.prefill_stats.computed_tokens - computed_before[0]
        assert ours_computed < (plain.prefill_stats.computed_tokens - computed_before[1]) / 2
