"""Swapping the served index without a restart (POST /admin/swap-index): answers under concurrent load come
wholly from one index, requests pin the index they arrived at, the admin token, bad folders, /health after a
swap, and the `swap_index` call. Indexes A and B are BM25 over two corpora whose passage ids differ (a0.., b0..),
so every query's answer tells which index gave it."""

from __future__ import annotations

import gc
import json
import tempfile
import threading
import weakref
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from agentic_retriever.base.client import RetrievalServiceError
from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.base.precision import TORCH_NAMES, resolve
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from agentic_retriever.index.dense import DenseParams
from agentic_retriever.server import (
    ADMIN_TOKEN_ENV, GENERATION_HEADER, ServerThread, create_app, swap_index,
)
from agentic_retriever.server import slot as slot_module
from tests.fakes import CountingRetrieve, result_ids, wait_until
from tests.retrieval.topics import CONTENTS, QUERIES

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: Swaps may open any folder under the temporary folder pytest's are in (the roots themselves: test_server_gate.py).
ROOTS = [tempfile.gettempdir()]
TOPK = 3


def _build(root, name: str, prefix: str, drop: int = 0) -> str:
    corpus = root / f"{name}.jsonl"
    rows = list(CONTENTS.items())[:len(CONTENTS) - drop]
    corpus.write_text("".join(json.dumps({"id": prefix + pid, "contents": c}) + "\n" for pid, c in rows))
    out = root / name
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(out), backend="bm25"))
    return str(out)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Two BM25 index folders: A (16 passages, ids a0..) and B (14 passages, ids b0..)."""
    root = tmp_path_factory.mktemp("swap")
    return {"A": _build(root, "A", "a"), "B": _build(root, "B", "b", drop=2)}


@pytest.fixture(scope="module")
def expected(folders) -> dict[str, dict[str, list[str]]]:
    """Per index, each query's top-k ids, searched in process."""
    answers = {}
    for name, folder in folders.items():
        index = open_index(folder)
        answers[name] = dict(zip(QUERIES, index.search(QUERIES, TOPK).ids))
    return answers


def _generation(response: httpx.Response) -> int:
    return int(response.headers[GENERATION_HEADER])


def _swap(client, folder: str, headers: dict | None = AUTH):
    return client.post("/admin/swap-index", json={"index": folder}, headers=headers)


# ------------------------------------------------------------------------------------------- under load


def test_swaps_under_concurrent_load_fail_nothing_and_never_mix_indexes(folders, expected):
    """8 clients send small and chunked (12 queries, max_batch_queries 4) requests while A -> B -> A ... swaps 6
    times: every answer is 200, exactly one index's results for all its queries, and the one its header names."""
    app = create_app(open_index(folders["A"]), max_batch_queries=4, admin_token=TOKEN, index_roots=ROOTS)
    stop = threading.Event()
    answers: list[tuple[list[str], httpx.Response]] = []
    failures: list[str] = []

    def client(c: int) -> None:
        with httpx.Client(timeout=60) as http:
            n = 0
            while not stop.is_set():
                n += 1
                queries = QUERIES if n % 3 == 0 else [QUERIES[(c + n + i) % len(QUERIES)] for i in range(1 + n % 3)]
                try:
                    answers.append((queries, http.post(f"{url}/retrieve", json={
                        "queries": queries, "topk": TOPK, "return_scores": True})))
                except httpx.HTTPError as error:
                    failures.append(f"{type(error).__name__}: {error}")

    swaps = []
    with ServerThread(app) as url:
        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for thread in threads:
            thread.start()
        try:
            for i in range(6):
                seen = len(answers)
                wait_until(lambda: len(answers) >= seen + 10, "requests between swaps")
                swaps.append(swap_index(url, folders["B" if i % 2 == 0 else "A"], TOKEN))
            seen = len(answers)
            wait_until(lambda: len(answers) >= seen + 10, "requests after the last swap")
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        health = httpx.get(f"{url}/health", headers=AUTH).json()

    assert failures == []
    assert [s["generation"] for s in swaps] == [1, 2, 3, 4, 5, 6]
    assert health["generation"] == 6 and health["index_dir"] == folders["A"]
    assert health["stats"]["failed_requests"] == 0
    generations = set()
    for queries, response in answers:
        assert response.status_code == 200, response.text
        generation = _generation(response)
        generations.add(generation)
        name = "A" if generation % 2 == 0 else "B"
        assert result_ids(response.json()["result"]) == [expected[name][q] for q in queries], \
            f"generation {generation} must answer from index {name} for all {len(queries)} queries"
    assert generations == set(range(7)), "every generation answered some requests"
    assert any(len(queries) == len(QUERIES) for queries, _ in answers), "some requests were chunked"


def test_a_request_in_flight_finishes_on_the_index_it_arrived_at(folders, expected):
    """A chunked request whose first chunk is being searched when the swap lands keeps its index for every chunk;
    a request arriving after the swap is searched on the new index, never in the same index call."""
    first = open_index(folders["A"])
    release = threading.Event()
    counter = CountingRetrieve(first, hold_first=release)
    first.retrieve = counter
    app = create_app(first, max_batch_queries=4, admin_token=TOKEN, index_roots=ROOTS)
    responses = {}
    with ServerThread(app) as url, httpx.Client(timeout=60) as http:
        big = threading.Thread(target=lambda: responses.__setitem__("big", http.post(
            f"{url}/retrieve", json={"queries": QUERIES, "topk": TOPK})))
        big.start()
        wait_until(lambda: len(counter.calls) == 1, "the big request's first chunk to be searched")
        swapped = swap_index(url, folders["B"], TOKEN)
        late = threading.Thread(target=lambda: responses.__setitem__("late", http.post(
            f"{url}/retrieve", json={"queries": QUERIES[:2], "topk": TOPK})))
        late.start()
        wait_until(lambda: app.state.batcher.stats.requests == 2, "the late request to be queued")
        release.set()
        big.join()
        late.join()
    assert swapped["generation"] == 1 and swapped["previous"]["index_dir"] == folders["A"]
    big_ids = [[hit["id"] for hit in hits] for hits in responses["big"].json()["result"]]
    assert big_ids == [expected["A"][q] for q in QUERIES] and _generation(responses["big"]) == 0
    late_ids = [[hit["id"] for hit in hits] for hits in responses["late"].json()["result"]]
    assert late_ids == [expected["B"][q] for q in QUERIES[:2]] and _generation(responses["late"]) == 1
    assert [q for call in counter.calls for q in call] == QUERIES, "index A searched the big request's chunks only"
    assert len(counter.calls) > 1, "the big request was searched in chunks"


def test_a_replaced_index_is_released_once_no_request_uses_it(folders):
    with TestClient(create_app(open_index(folders["A"]), admin_token=TOKEN, index_roots=ROOTS)) as client:
        assert _swap(client, folders["B"]).status_code == 200
        replaced = weakref.ref(client.app.state.slot.current.index)
        assert client.post("/retrieve", json={"queries": ["mercury"]}).status_code == 200
        assert _swap(client, folders["A"]).status_code == 200
        gc.collect()
        assert replaced() is None, "the generation-1 index is still referenced after the swap"


# ------------------------------------------------------------------------------------------- the token


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                                     {"Authorization": "Bearer"}])
def test_a_swap_without_the_right_token_is_refused_with_401(folders, expected, headers):
    with TestClient(create_app(open_index(folders["A"]), admin_token=TOKEN, index_roots=ROOTS)) as client:
        response = _swap(client, folders["B"], headers)
        answer = client.post("/retrieve", json={"queries": QUERIES[:3]})
        health = client.get("/health", headers=AUTH).json()
    assert response.status_code == 401
    assert "token" in response.json()["detail"] and TOKEN not in response.text
    assert health["generation"] == 0 and health["index_dir"] == folders["A"]
    assert [[h["id"] for h in hits] for hits in answer.json()["result"]] == [expected["A"][q] for q in QUERIES[:3]]


def test_admin_is_off_without_a_token_and_the_403_says_how_to_turn_it_on(folders, monkeypatch):
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    with TestClient(create_app(open_index(folders["A"]))) as client:
        response = _swap(client, folders["B"])
        health = client.get("/health", headers=AUTH).json()
    assert response.status_code == 403
    assert ADMIN_TOKEN_ENV in response.json()["detail"] and "admin_token" in response.json()["detail"]
    assert health["admin"] is False and health["generation"] == 0 and health["index_dir"] == "A"  # its name only


def test_the_environment_variable_turns_admin_on(folders, monkeypatch):
    monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
    with TestClient(create_app(open_index(folders["A"]))) as client:
        assert _swap(client, folders["B"], {"Authorization": "Bearer wrong"}).status_code == 401
        response = _swap(client, folders["B"])
    assert response.status_code == 200 and response.json()["generation"] == 1


# ------------------------------------------------------------------------------------------- bad folders


def test_a_bad_folder_is_refused_naming_it_and_the_old_index_keeps_serving(folders, expected, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("not an index")
    moved = tmp_path / "moved"  # a complete index whose corpus is gone: its manifest loads, opening fails
    moved.mkdir()
    manifest = json.loads((Path(folders["A"]) / "manifest.json").read_text())
    (moved / "manifest.json").write_text(json.dumps({**manifest, "corpus_path": "nowhere/corpus.jsonl"}))
    cases = {str(tmp_path / "missing"): "no such folder", str(tmp_path / "a-file"): "not a folder",
             str(tmp_path / "empty"): "manifest.json is missing", str(moved): "could not be opened"}
    with TestClient(create_app(open_index(folders["A"]), admin_token=TOKEN, index_roots=ROOTS)) as client:
        for folder, reason in cases.items():
            response = _swap(client, folder)
            assert response.status_code == 422, response.text
            assert folder in response.json()["detail"] and reason in response.json()["detail"]
        for body in ({}, {"index": ""}, {"index": folders["B"], "extra": 1}):
            assert client.post("/admin/swap-index", json=body, headers=AUTH).status_code == 422
        answer = client.post("/retrieve", json={"queries": QUERIES})
        health = client.get("/health", headers=AUTH).json()
    assert _generation(answer) == 0
    assert [[h["id"] for h in hits] for hits in answer.json()["result"]] == [expected["A"][q] for q in QUERIES]
    assert health["generation"] == 0 and health["index_dir"] == folders["A"] and health["index_size"] == 16


def test_a_second_swap_while_one_is_loading_gets_409_and_the_old_index_serves_meanwhile(folders, expected,
                                                                                        monkeypatch):
    loading, release = threading.Event(), threading.Event()

    def slow_open(folder, **placement):
        loading.set()
        assert release.wait(60), "the test never released the load"
        return open_index(folder, **placement)

    monkeypatch.setattr(slot_module, "open_index", slow_open)
    result = {}
    with ServerThread(create_app(open_index(folders["A"]), admin_token=TOKEN, index_roots=ROOTS)) as url:
        first = threading.Thread(target=lambda: result.__setitem__("first", swap_index(url, folders["B"], TOKEN)))
        first.start()
        assert loading.wait(60)
        with pytest.raises(RetrievalServiceError) as second:
            swap_index(url, folders["A"], TOKEN)
        during = httpx.post(f"{url}/retrieve", json={"queries": QUERIES[:2]})
        health_during = httpx.get(f"{url}/health", headers=AUTH).json()
        release.set()
        first.join()
        after = httpx.post(f"{url}/retrieve", json={"queries": QUERIES[:2]})
    assert second.value.status_code == 409 and folders["B"] in str(second.value)
    assert health_during["swap_loading"] == folders["B"] and health_during["generation"] == 0
    assert _generation(during) == 0 and [[h["id"] for h in hits] for hits in during.json()["result"]] == \
        [expected["A"][q] for q in QUERIES[:2]]
    assert result["first"]["generation"] == 1
    assert _generation(after) == 1 and [[h["id"] for h in hits] for hits in after.json()["result"]] == \
        [expected["B"][q] for q in QUERIES[:2]]


# ------------------------------------------------------------------------------------------- health


def test_health_describes_the_current_index_after_a_swap(folders, dense):
    with TestClient(create_app(open_index(folders["A"]), admin_token=TOKEN, index_roots=ROOTS)) as client:
        before = client.get("/health", headers=AUTH).json()
        response = _swap(client, dense.index_dir)
        after = client.get("/health", headers=AUTH).json()
    assert before["generation"] == 0 and before["backend"] == "bm25" and before["index_size"] == 16
    assert response.status_code == 200
    swap = response.json()
    assert swap["generation"] == 1 and swap["load_s"] >= 0
    assert swap["previous"]["index_dir"] == folders["A"] and swap["new"]["index_dir"] == dense.index_dir
    assert swap["previous"]["corpus_sha256"] == before["corpus_sha256"]
    m = dense.manifest
    assert swap["new"]["corpus_sha256"] == m.corpus_sha256 != before["corpus_sha256"]
    assert {k: after[k] for k in ("generation", "index_dir", "backend", "index_type", "model", "encoder_fingerprint",
                                  "corpus_sha256", "composition", "index_size", "dim")} == {
        "generation": 1, "index_dir": dense.index_dir, "backend": "dense", "index_type": m.index_type,
        "model": m.encoder["model"], "encoder_fingerprint": m.encoder["fingerprint"], "corpus_sha256": m.corpus_sha256,
        "composition": dense.composition, "index_size": len(dense), "dim": m.dim}
    assert swap["new"] == {k: after[k] for k in swap["new"]}


def test_queries_are_encoded_in_the_services_query_precision_before_and_after_a_swap(folders, dense):
    """`query_precision` reaches the encoder of the index the service starts with and of every index a swap opens
    (the passages keep the build's), and /health says it; a BM25 index has no query encoder."""
    started = open_index(dense.index_dir, query_precision="bf16")
    assert started.encoder.weights_dtype == "bfloat16"
    assert open_index(dense.index_dir).encoder.weights_dtype == TORCH_NAMES[resolve("auto", None, "encoder")], \
        "without it, auto: fp32 on a CPU, fp16 on a GPU"
    app = create_app(started, admin_token=TOKEN, index_roots=ROOTS, query_precision="bf16")
    with TestClient(app) as client:
        before = client.get("/health", headers=AUTH).json()
        assert _swap(client, folders["A"]).status_code == 200
        assert client.get("/health", headers=AUTH).json()["query_dtype"] is None
        assert _swap(client, dense.index_dir).status_code == 200
        after = client.get("/health", headers=AUTH).json()
    assert before["query_dtype"] == after["query_dtype"] == "bfloat16" and after["generation"] == 2


# ------------------------------------------------------------------------------------------- swap_index


def test_swap_index_raises_the_servers_message_on_refusal(folders, tmp_path):
    with ServerThread(create_app(open_index(folders["A"]), admin_token=TOKEN, index_roots=ROOTS)) as url:
        with pytest.raises(RetrievalServiceError) as wrong:
            swap_index(url, folders["B"], "wrong")
        with pytest.raises(RetrievalServiceError) as missing:
            swap_index(url + "/retrieve", str(tmp_path / "missing"), TOKEN)
        answer = swap_index(url, folders["B"], TOKEN)
    assert wrong.value.status_code == 401 and "wrong admin token" in str(wrong.value)
    assert missing.value.status_code == 422 and f"index folder {tmp_path / 'missing'}: no such folder" in \
        str(missing.value)
    assert answer["generation"] == 1 and answer["new"]["index_size"] == 14
    with pytest.raises(RetrievalServiceError, match="could not be reached"):
        swap_index(url, folders["B"], TOKEN, timeout_s=5)


# ------------------------------------------------------------------------------------------- placement


@pytest.fixture(scope="module")
def recorded_on_gpus(dense, tmp_path_factory) -> str:
    """A dense index whose build recorded ``dense.gpu: on`` (sharded over the GPUs when opened as built)."""
    out = tmp_path_factory.mktemp("placement") / "on-gpus"
    build_index(IndexBuildConfig(corpus=dense.manifest.corpus_path, out=str(out),
                                 encoder=EncoderConfig(precision="fp32"), dense=DenseParams(gpu="on")))
    return str(out)


def test_a_swap_places_the_new_index_where_the_service_keeps_its_index_not_where_its_build_said(folders,
                                                                                                   recorded_on_gpus):
    """A service started with its index in host memory (``index_gpu="off"``) keeps every swapped-in index there,
    whatever the folder's build recorded; /health says where the index is searched and queries are encoded."""
    with TestClient(create_app(open_index(folders["A"], gpu="off"), admin_token=TOKEN, index_gpu="off",
                               index_roots=ROOTS)) as client:
        before = client.get("/health", headers=AUTH).json()
        response = _swap(client, recorded_on_gpus)
        after = client.get("/health", headers=AUTH).json()
    assert before["search_device"] == "cpu" and before["query_device"] is None  # BM25: no encoder
    assert response.status_code == 200, response.text
    assert after["search_device"] == "cpu" and after["query_device"] == str(open_index(recorded_on_gpus, gpu="off")
                                                                            .encoder.model.device)


def test_without_a_service_placement_a_swap_opens_the_index_as_its_build_recorded(folders, recorded_on_gpus):
    """``index_gpu`` None: the folder's own ``gpu: on`` holds, so FAISS without GPUs refuses the swap by name (and
    with faiss-gpu on a GPU host, the index is sharded over the GPUs)."""
    import faiss

    with TestClient(create_app(open_index(folders["A"]), admin_token=TOKEN, index_roots=ROOTS)) as client:
        response = _swap(client, recorded_on_gpus)
        health = client.get("/health", headers=AUTH).json()
    if getattr(faiss, "get_num_gpus", lambda: 0)() == 0:
        assert response.status_code == 422 and "gpu=on but FAISS sees no GPU" in response.json()["detail"]
        assert health["generation"] == 0 and health["index_dir"] == folders["A"]
    else:
        assert response.status_code == 200 and "GPU" in health["search_device"]
