"""The service benchmark against a peer run from a script file (benchmarks/bench_service.py --peer-script), and its
batched-limit rounds. The peer here is a stand-in written for this test with the interface of Search-R1's
``search_r1/search/retrieval_server.py`` (its flags, ``.cuda()``/``.half()`` on the model and inputs, the corpus
through ``datasets``, ``uvicorn.run`` on 0.0.0.0:8000, a progress bar written on every request, a route that fails
unless ``return_scores`` is sent): what the launcher and the benchmark must cope with to run that file unmodified on
a CPU, beside a second server."""

from __future__ import annotations

import textwrap

import pytest
import torch

from agentic_retriever.standins.instant_index import InstantIndex
from tests.fakes import import_benchmark

SEARCH_R1_LIKE_SERVER = textwrap.dedent('''
    import argparse
    import sys

    import datasets
    import faiss
    import torch
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    from transformers import AutoModel, AutoTokenizer

    parser = argparse.ArgumentParser()
    for flag in ("--index_path", "--corpus_path", "--retriever_name", "--retriever_model"):
        parser.add_argument(flag, type=str)
    parser.add_argument("--topk", type=int, default=3)
    args = parser.parse_args()

    index = faiss.read_index(args.index_path)
    corpus = datasets.load_dataset("json", data_files=args.corpus_path, split="train")
    tokenizer = AutoTokenizer.from_pretrained(args.retriever_model)
    model = AutoModel.from_pretrained(args.retriever_model)
    model.eval()
    model.cuda()
    model = model.half()
    app = FastAPI()


    class QueryRequest(BaseModel):
        queries: list
        topk: int = None
        return_scores: bool = False


    def batch_search(queries, topk, return_score):
        sys.stderr.write("Retrieval process: " + "#" * 4000 + "\\r")  # a progress bar on every request (a wide one)
        sys.stderr.flush()
        inputs = tokenizer(queries, padding=True, truncation=True, max_length=256, return_tensors="pt")
        inputs = {k: v.cuda() for k, v in inputs.items()}
        with torch.no_grad():
            hidden = model(**inputs).last_hidden_state
        mask = inputs["attention_mask"][..., None].float()
        vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
        scores, rows = index.search(vectors.cpu().numpy(), topk)
        results = [[corpus[int(r)] for r in rr] for rr in rows]
        return (results, scores.tolist()) if return_score else results


    @app.post("/retrieve")
    def retrieve(request: QueryRequest):
        # unpacked whatever return_scores says: a request without it fails, as on the real server
        results, scores = batch_search(request.queries, request.topk or args.topk, request.return_scores)
        return {"result": [[{"document": d, "score": s} for d, s in zip(docs, row)] if request.return_scores else docs
                           for docs, row in zip(results, scores)]}


    uvicorn.run(app, host="0.0.0.0", port=8000)
''')


@pytest.fixture(scope="module")
def bench_service():
    return import_benchmark("bench_service")


def test_the_peer_script_runs_unmodified_on_the_cpu_and_the_batched_limit_is_reported(dense, tmp_path, bench_service):
    script = tmp_path / "retrieval_server.py"
    script.write_text(SEARCH_R1_LIKE_SERVER)
    figures = bench_service.main(["--index", dense.index_dir, "--peer-script", str(script), "--clients", "1,4",
                                  "--total-requests", "24", "--repeats", "1", "--warmup", "2",
                                  "--limit-clients", "2", "--limit-queries-per-request", "4"])
    # the same encoder weights, pooling and FAISS file: the answers' top-k ids are the peer's (on a CPU, both in fp32,
    # every one; on a GPU both servers encode in fp16, and a near tie may order two passages differently)
    same, compared = figures["same_topk_as_peer"]
    assert compared >= 24 and same >= (compared if not torch.cuda.is_available() else 0.9 * compared)
    assert figures["errors"] == 0
    limit = figures["batched_limit"]
    assert set(limit) == {"peer", "ours"} and all(m["queries_per_s"] > 0 for m in limit.values())
    runs = figures["rounds"]["batched_limit"]["ours"]
    assert runs[0]["queries_per_s"] == pytest.approx(4 * runs[0]["requests_per_s"], rel=0.02)
    share = figures["share_of_batched_limit"]["ours"]
    assert share == pytest.approx(figures["medians"][4]["ours"]["queries_per_s"] / limit["ours"]["queries_per_s"], rel=1e-2)
    assert any(target.startswith("4 clients, one-query requests: >= 90%") for target in figures["targets"])
    # how full our batches were, from our /health (the peer has none): 4 one-query requests at 4 clients at most
    assert all(1 <= r["queries_per_index_call"] <= 4 for r in figures["rounds"][4]["ours"])
    assert 1 <= runs[0]["queries_per_index_call"] <= 8 and "queries_per_index_call" not in figures["rounds"][4]["peer"][0]
    # the index's time per query and busy share of each round of ours, from /health's index_seconds
    assert all(r["index_ms_per_query"] > 0 and 0 < r["index_busy_share"] <= 1 for r in figures["rounds"][4]["ours"])
    # and the index alone in the benchmark's process at the batch sizes those loads formed
    alone = figures["index_alone_ms_per_query"]
    assert set(alone) == {max(1, round(figures["medians"][4]["ours"]["queries_per_index_call"])),
                          max(1, round(limit["ours"]["queries_per_index_call"]))}
    assert all(ms > 0 for ms in alone.values())


def test_two_peers_are_refused(dense, bench_service):
    with pytest.raises(SystemExit):
        bench_service.main(["--index", dense.index_dir, "--peer-script", "x.py", "--peer-url", "http://127.0.0.1:1"])


def test_the_overhead_mode_measures_the_services_own_cpu_per_request(dense, bench_service):
    # enough requests that the server's CPU time (counted in 10 ms clock ticks) is more than a few ticks
    figures = bench_service.main(["--mode", "overhead", "--index", dense.index_dir, "--clients", "1,4",
                                  "--total-requests", "400", "--repeats", "2", "--warmup", "2"])
    assert figures["errors"] == 0 and set(figures["medians"]) == {"1", "4"}
    for clients, runs in figures["rounds"].items():
        assert len(runs) == 2 and all(r["requests"] >= 400 and r["server_cpu_ms_per_request"] > 0 for r in runs)


def test_the_instant_index_answers_every_query_with_real_passages_in_no_time(dense):
    instant = InstantIndex(dense)
    first, second = instant.retrieve(["a", "b"], 3), instant.retrieve(["c"], 2)
    rows = [p.id for hits in first + second for p in hits]
    assert len(rows) == 8 and rows == dense.corpus.ids_at(list(range(8)))
    assert all(p.score == 1.0 and p.contents for hits in first for p in hits)
