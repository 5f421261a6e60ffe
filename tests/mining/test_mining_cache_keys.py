"""Mining's caches key on content, not on names and paths (`agentic_retriever.base.fingerprint`): a model retrained in
place or another index mined into the same folder is recomputed; the same weights or index elsewhere is reused."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import httpx
import pytest

from agentic_retriever.base import fingerprint
from agentic_retriever.base.client import HttpRetrievalClient
from agentic_retriever.base.fingerprint import SIDECAR, llm_fingerprint, model_fingerprint
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from agentic_retriever.mining import MiningConfig, SelectionConfig, mine
from agentic_retriever.retrieval import LocalRetrievalClient
from tests.fakes import FakeAgent, FakeScorer, answer_turn, make_trajectory, make_world, search_turn

OLD = 1_600_000_000 * 10**9  # a modification time long before any fingerprint is computed


@pytest.fixture(autouse=True)
def _warn_again(monkeypatch):
    """Each test sees the warnings that the fingerprint module gives once per process."""
    monkeypatch.setattr(fingerprint, "_warned", set())


def save_tiny_model(folder: Path, seed: int) -> Path:
    """A 1-layer, 8-d Llama with seeded random weights (same shapes, hence same file sizes, for every seed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def age(folder: Path) -> None:
    """Make every file look written long ago (as weights are by the time they are mined)."""
    for path in folder.iterdir():
        os.utime(path, ns=(OLD, OLD))


# ------------------------------------------------------------------------------------------- model fingerprints


def test_a_model_is_identified_by_its_files_not_its_path(tmp_path):
    first = save_tiny_model(tmp_path / "a", seed=0)
    twin = save_tiny_model(tmp_path / "b", seed=0)
    other = save_tiny_model(tmp_path / "c", seed=1)
    assert model_fingerprint(first).startswith("sha256:")
    assert model_fingerprint(first) == model_fingerprint(twin) == model_fingerprint(str(twin) + "/")
    assert model_fingerprint(other) != model_fingerprint(first)
    moved = tmp_path / "moved"
    before = model_fingerprint(first)
    first.rename(moved)
    assert model_fingerprint(moved) == before
    # training leftovers and notes are not the model
    (moved / "training_args.bin").write_bytes(b"x")
    (moved / "sft_manifest.json").write_text("{}")
    (moved / "metrics.jsonl").write_text("{}\n")
    assert model_fingerprint(moved) == before
    (moved / "generation_config.json").write_text('{"temperature": 0.5}')
    assert model_fingerprint(moved) != before


def test_the_fingerprint_is_stored_beside_the_weights_and_recomputed_when_they_change(tmp_path, monkeypatch):
    folder = save_tiny_model(tmp_path / "m", seed=0)
    age(folder)
    hashed = []
    real_hash = fingerprint._hash
    monkeypatch.setattr(fingerprint, "_hash", lambda files, root: hashed.append(root) or real_hash(files, root))
    first = model_fingerprint(folder)
    stored = json.loads((folder / SIDECAR).read_text())
    assert stored["fingerprint"] == first and "model.safetensors" in stored["files"]
    assert model_fingerprint(folder) == first and len(hashed) == 1, "unchanged files: not hashed again"
    save_tiny_model(folder, seed=1)  # retrained in place: same names, same sizes
    assert model_fingerprint(folder) != first and len(hashed) == 2


def test_a_file_rewritten_within_its_timestamp_tick_is_not_trusted(tmp_path, monkeypatch):
    """A file modified right before it was hashed may change again without a new modification time (coarse
    timestamps): like git's racy entries, it is hashed again on the next call."""
    folder = tmp_path / "m"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"A" * 64)
    first = model_fingerprint(folder)
    stat = weights.stat()
    weights.write_bytes(b"B" * 64)  # same size; force the very same modification time
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_mtime_ns == stat.st_mtime_ns
    assert model_fingerprint(folder) != first


def test_an_unwritable_model_folder_keeps_its_fingerprint_under_the_cache_root(tmp_path, monkeypatch):
    folder = save_tiny_model(tmp_path / "m", seed=0)
    age(folder)
    real_write = fingerprint.write_json

    def refuse_beside(path, data):
        if Path(path).parent == folder:
            raise PermissionError(f"read-only: {path}")
        return real_write(path, data)

    monkeypatch.setattr(fingerprint, "write_json", refuse_beside)
    first = model_fingerprint(folder)
    assert not (folder / SIDECAR).exists()
    kept = list((Path(os.environ["AGENTIC_RETRIEVER_CACHE"]) / "fingerprints").glob("*.json"))
    assert any(json.loads(p.read_text())["fingerprint"] == first for p in kept)
    monkeypatch.setattr(fingerprint, "_hash", lambda files, root: pytest.fail("hashed again"))
    assert model_fingerprint(folder) == first


def test_a_cached_hub_model_is_its_commit_and_an_unknown_name_is_itself_with_a_warning(tmp_path, monkeypatch, caplog):
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("c0ffee" * 6 + "beef")
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text(snapshot.name)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert model_fingerprint("org/tiny") == f"hf:org/tiny@{snapshot.name}"
    with caplog.at_level(logging.WARNING):
        assert model_fingerprint("org/not-downloaded") == "org/not-downloaded"
    assert "new weights under the same name are not noticed" in caplog.text


def test_a_served_model_is_its_served_name_with_a_warning(caplog):
    from agentic_retriever.base.llm.openai import OpenAILLM

    llm = OpenAILLM("Qwen/Qwen2.5-72B-Instruct", base_url="http://gpu-node:8000/v1")
    with caplog.at_level(logging.WARNING):
        assert llm_fingerprint(llm) == "Qwen/Qwen2.5-72B-Instruct"
    assert "served over HTTP" in caplog.text


def test_a_loaded_transformers_model_is_fingerprinted_by_its_folder(tmp_path, tiny_causal_lm_dir):
    from agentic_retriever.base.llm.transformers import TransformersLLM
    from agentic_retriever.mining.usage import CountingLLM

    folder = shutil.copytree(tiny_causal_lm_dir, tmp_path / "agent")
    llm = CountingLLM(TransformersLLM.load(str(folder), device="cpu"))
    assert llm.fingerprint == model_fingerprint(tiny_causal_lm_dir) and llm.fingerprint.startswith("sha256:")


# --------------------------------------------------------------------------------------- retriever identities


def test_services_are_identified_by_their_reported_fingerprint_else_by_url_with_a_warning(caplog):
    def service(health: dict | None):
        def handle(request: httpx.Request) -> httpx.Response:
            if health is None:
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(200, json=health)
        return httpx.MockTransport(handle)

    described = {"status": "ok", "backend": "dense", "index_type": "flat", "model": "default", "index_size": 10,
                 "dim": 384, "uptime_s": 1.0, "stats": {"requests": 3}}
    reported = {**described, "encoder_fingerprint": "e" * 32, "corpus_sha256": "c" * 64}
    here = HttpRetrievalClient("http://a:8000", transport=service(reported)).identity()
    there = HttpRetrievalClient("http://b:9000/retrieve", transport=service({**reported, "uptime_s": 99.0})).identity()
    assert here == there and here["encoder_fingerprint"] == "e" * 32 and "url" not in here
    with caplog.at_level(logging.WARNING):
        plain = HttpRetrievalClient("http://a:8000", transport=service(described)).identity()
        restarted = HttpRetrievalClient("http://a:8000", transport=service({**described, "uptime_s": 7})).identity()
        other_url = HttpRetrievalClient("http://b:8000", transport=service(described)).identity()
        no_health = HttpRetrievalClient("http://c:8000", transport=service(None), max_retries=0).identity()
    assert plain == restarted and plain["url"] == "http://a:8000" and plain != other_url
    assert plain != HttpRetrievalClient("http://a:8000", transport=service({**described, "index_size": 11})).identity()
    assert no_health == {"kind": "service", "url": "http://c:8000"}
    assert caplog.text.count("reports no model fingerprint") == 3  # once per service


GILLEY = "Mickey Gilley"
WORLD = make_world({
    "urban cowboy club": [(90, GILLEY), (85, None), (70, GILLEY), (95, "Gilley's Club")] + [(20, None)] * 16,
    "gilleys club founder": [(80, GILLEY), (80, GILLEY), (40, None)] + [(15, None)] * 19,
})


def trajectory_file(tmp_path: Path) -> Path:
    hits = [WORLD.corpus[i] for i in WORLD.topics["urban cowboy club"][:3]]
    trajectory = make_trajectory("t1", "Who founded the honky tonk of Urban Cowboy?", [GILLEY],
                                 [search_turn("urban cowboy club", hits), search_turn("gilleys club founder", hits),
                                  answer_turn(GILLEY)], GILLEY)
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(trajectory.to_json()) + "\n")
    return path


def config(**overrides) -> MiningConfig:
    settings = {"progress": False, "plot": False, "scorer_batch_prompts": 4, "gac_batch_pairs": 40,
                "selection": SelectionConfig(), **overrides}
    return MiningConfig(**settings)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    """BM25 indexes over the mining world: ``a``, ``b`` (another corpus: one passage left out) and ``k1``
    (the corpus of ``a``, other BM25 parameters)."""
    root = tmp_path_factory.mktemp("indexes")

    def corpus(name: str, leave_out: tuple[str, ...] = ()) -> str:
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n"
                                for p in WORLD.corpus.values() if p.id not in leave_out))
        return str(path)

    full = corpus("full")
    cache = str(root / "cache")
    build_index(IndexBuildConfig(corpus=full, out=str(root / "a"), backend="bm25", corpus_cache=cache))
    build_index(IndexBuildConfig(corpus=corpus("fewer", ("urban_cowboy_club-0",)), out=str(root / "b"),
                                 backend="bm25", corpus_cache=cache))
    config = IndexBuildConfig(corpus=full, out=str(root / "k1"), backend="bm25", corpus_cache=cache)
    config.bm25.k1 = 1.5
    build_index(config)
    return {name: root / name for name in ("a", "b", "k1")}


def test_a_local_index_is_identified_by_its_manifest_content_not_its_folder(indexes, tmp_path):
    copy = shutil.copytree(indexes["a"], tmp_path / "elsewhere" / "a-copy")
    a = LocalRetrievalClient(open_index(indexes["a"])).identity()
    assert LocalRetrievalClient(open_index(copy)).identity() == a
    assert LocalRetrievalClient(open_index(indexes["a"], threads=2)).identity() == a, "threads change no result"
    assert LocalRetrievalClient(open_index(indexes["b"])).identity() != a
    assert LocalRetrievalClient(open_index(indexes["k1"])).identity() != a
    assert str(indexes["a"]) not in json.dumps(a)


def candidate_ids(result) -> list[list[str]]:
    records = [json.loads(line) for line in (result.out_dir / "rounds.jsonl").read_text().splitlines()]
    return [[c["id"] for c in r["candidates"]] for r in records]


def test_another_index_mined_into_the_same_folder_recomputes_the_candidates(indexes, tmp_path):
    path, out = trajectory_file(tmp_path), tmp_path / "mining"

    def run(index: Path):
        agent, scorer = FakeAgent(), FakeScorer()
        result = mine(path, LocalRetrievalClient(open_index(index)), agent, scorer, config(), out)
        return result, result.stats["this_run"]["candidates"], agent, scorer

    first, candidates, _, _ = run(indexes["a"])
    assert candidates["computed"] == 2 and "urban_cowboy_club-0" in candidate_ids(first)[0]
    assert first.stats["retriever"]["corpus_sha256"]
    # the same index again: every stage reused
    again, candidates, agent, scorer = run(indexes["a"])
    assert (candidates["computed"], candidates["reused"]) == (0, 2) and agent.calls == [] and scorer.calls == []
    # another index into the same folder (the trajectories still say "fake-retriever"): recomputed from it
    other, candidates, _, scorer = run(indexes["b"])
    assert candidates["computed"] == 2 and scorer.calls
    assert "urban_cowboy_club-0" not in sum(candidate_ids(other), [])
    assert other.stats["retriever"] != first.stats["retriever"]
    # the first index from another folder: its stored candidates (and everything after them) are reused
    copy = shutil.copytree(indexes["a"], tmp_path / "copy-of-a")
    moved, candidates, agent, scorer = run(copy)
    assert candidates["computed"] == 0 and agent.calls == [] and scorer.calls == []
    assert moved.rows_path.read_bytes() == first.rows_path.read_bytes()


def test_weights_retrained_in_place_are_scored_again_and_the_same_weights_elsewhere_are_not(tmp_path):
    path, out = trajectory_file(tmp_path), tmp_path / "mining"
    scorer_dir, agent_dir = save_tiny_model(tmp_path / "scorer", 0), save_tiny_model(tmp_path / "agent", 1)

    def run(scorer_at: Path = scorer_dir, agent_at: Path = agent_dir, cfg: MiningConfig | None = None):
        agent, scorer = FakeAgent(), FakeScorer()
        agent.name, scorer.name = str(agent_at), str(scorer_at)  # the fakes stand for the models in these folders
        result = mine(path, WORLD, agent, scorer, cfg or config(), out)
        return result, result.stats["this_run"], agent, scorer

    first, this_run, _, _ = run()
    assert all(this_run[stage]["computed"] > 0 for stage in ("candidates", "sub_answers", "local_relevance", "gac"))
    assert first.stats["scorer_fingerprint"] == model_fingerprint(scorer_dir)
    # unchanged weights: every cache hit
    _, this_run, agent, scorer = run()
    assert agent.calls == [] and scorer.calls == [] and all(s["computed"] == 0 for s in this_run.values())
    # the scorer retrained in place (same path, same file sizes): sub-answers and LR again, nothing else
    save_tiny_model(scorer_dir, seed=2)
    _, this_run, agent, scorer = run()
    assert this_run["sub_answers"]["computed"] == 1 and this_run["local_relevance"]["computed"] == 2
    assert this_run["candidates"]["computed"] == 0 and this_run["gac"]["computed"] == 0 and agent.calls == []
    # the agent retrained in place: GAC again (answer likelihood too), nothing else
    save_tiny_model(agent_dir, seed=3)
    _, this_run, agent, scorer = run()
    assert this_run["gac"]["computed"] > 0 and agent.calls and scorer.calls == []
    likelihood = config(gac_mode="answer_likelihood")
    run(cfg=likelihood)
    save_tiny_model(agent_dir, seed=4)
    _, this_run, agent, _ = run(cfg=likelihood)
    assert this_run["gac"]["computed"] > 0 and agent.calls
    # the same weights copied to other folders: nothing recomputed
    scorer_copy = shutil.copytree(scorer_dir, tmp_path / "scorer-copy")
    agent_copy = shutil.copytree(agent_dir, tmp_path / "agent-copy")
    _, this_run, agent, scorer = run(scorer_at=scorer_copy, agent_at=agent_copy, cfg=likelihood)
    assert scorer.calls == [] and agent.calls == [] and all(s["computed"] == 0 for s in this_run.values())


def test_a_client_without_identity_keeps_the_label_keys_and_says_so(tmp_path, caplog):
    path, out = trajectory_file(tmp_path), tmp_path / "mining"
    with caplog.at_level(logging.WARNING):
        first = mine(path, WORLD, FakeAgent(), FakeScorer(), config(), out)
    assert "has no identity()" in caplog.text and first.stats["retriever"] is None
    assert first.stats["this_run"]["candidates"]["computed"] == 2
    again = mine(path, WORLD, FakeAgent(), FakeScorer(), config(), out)
    assert again.stats["this_run"]["candidates"]["computed"] == 0
    relabelled = mine(path, WORLD, FakeAgent(), FakeScorer(), config(retriever_id="r2"), out)
    assert relabelled.stats["this_run"]["candidates"]["computed"] == 2
