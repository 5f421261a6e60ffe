"""The scale benchmark's own arithmetic and data (benchmarks/bench_scale.py): the power-law fit and its projection
error, the random embeddings and the synthetic corpus, and one (size, type) measured through the library's build
path. The figures themselves are benchmarks/RESULTS.md's ("How cost grows with the corpus")."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from agentic_retriever.base.corpus import Corpus
from agentic_retriever.index.dense import DenseParams, fill_faiss_index

from tests.fakes import BENCHMARKS, import_benchmark

scale = import_benchmark("bench_scale")


def test_an_exact_power_law_is_recovered_and_projected_with_no_spread():
    sizes = [1_000, 10_000, 100_000]
    fit = scale.fit_power_law(sizes, [3e-6 * n ** 1.5 for n in sizes])
    assert fit["b"] == pytest.approx(1.5) and fit["a"] == pytest.approx(3e-6)
    projected = scale.project(fit, 21_015_324)
    assert projected["value"] == pytest.approx(3e-6 * 21_015_324 ** 1.5, rel=1e-6)
    assert projected["error_factor"] == pytest.approx(1.0, abs=1e-6)


def test_the_error_factor_grows_with_the_spread_and_the_distance_of_the_projection():
    sizes = [1_000, 10_000, 100_000]
    noisy = scale.fit_power_law(sizes, [n * f for n, f in zip(sizes, (1.0, 1.3, 0.9))])
    near, far = scale.project(noisy, 200_000), scale.project(noisy, 21_015_324)
    assert 1.0 < near["error_factor"] < far["error_factor"]
    # the residual standard deviation of a line through three log points, one degree of freedom
    x, y = np.log(sizes), np.log([1_000, 13_000, 90_000])
    b, a = np.polyfit(x, y, 1)
    assert noisy["residual_sd"] == pytest.approx(math.sqrt(((y - a - b * x) ** 2).sum() / 1))


def test_two_sizes_fit_exactly_and_say_they_have_no_error_estimate_one_size_is_refused():
    fit = scale.fit_power_law([100, 1_000], [1.0, 5.0])
    assert fit["residual_sd"] is None and scale.project(fit, 10_000)["error_factor"] is None
    assert scale.project(fit, 10_000)["value"] == pytest.approx(25.0)
    with pytest.raises(ValueError, match="two distinct sizes"):
        scale.fit_power_law([100, 100], [1.0, 2.0])


def test_random_embeddings_are_unit_norm_seeded_and_written_once(tmp_path):
    path = tmp_path / "e.npy"
    first = np.array(scale.random_embeddings(path, 1_000, 16, chunk=300))
    assert first.shape == (1_000, 16) and first.dtype == np.float32
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    written = path.stat().st_mtime_ns
    assert np.array_equal(np.asarray(scale.random_embeddings(path, 1_000, 16)), first)
    assert path.stat().st_mtime_ns == written  # reused, not rewritten
    assert not np.array_equal(np.asarray(scale.random_embeddings(tmp_path / "f.npy", 1_000, 16, seed=1)), first)
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_the_synthetic_corpus_opens_as_a_library_corpus_with_wiki18_length_passages(tmp_path):
    path = tmp_path / "corpus.jsonl"
    scale.write_synthetic_corpus(path, 1_234, chunk=500)
    corpus = Corpus.open(path, cache_dir=tmp_path / "cache")
    assert len(corpus) == 1_234 and corpus.ids_at([0, 1_233]) == ["0", "1233"]
    passage = corpus.passages_at([7])[0]
    assert passage.title and len(passage.text.split()) == 100


def test_a_build_is_the_librarys_build_and_its_figures_are_reported(tmp_path):
    """The worker builds through `fill_faiss_index` (the same index a dense build makes from these embeddings) and
    reports the index's bytes, peak memory and search times; run as the benchmark runs it, in its own process."""
    embeddings = scale.random_embeddings(tmp_path / "e.npy", 3_000, 32)
    corpus = tmp_path / "corpus.jsonl"
    scale.write_synthetic_corpus(corpus, 3_000)
    args = {"embeddings": str(tmp_path / "e.npy"), "type": "flat", "params": {}, "queries": 4, "topk": 3,
            "encoder_ms": [0.0, 0.0], "service_requests": 10, "corpus": str(corpus), "corpus_cache": str(tmp_path / "c")}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_scale.py"), "--worker", "flat-3000", json.dumps(args)],
                          capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    import faiss

    library_index = fill_faiss_index(DenseParams(type="flat"), embeddings, chunk=1_000)
    assert figures["index_bytes"] == faiss.serialize_index(library_index).nbytes >= 3_000 * 32 * 4
    assert figures["search_batch1_ms"] > 0 and figures["search_batch64_ms"] > 0
    assert figures["service_1_rps"] > 0 and figures["service_64_rps"] > 0


def test_the_row_store_worker_converts_opens_and_reads(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    scale.write_synthetic_corpus(corpus, 2_000)
    figures = scale.row_store({"corpus": str(corpus), "corpus_cache": str(tmp_path / "cache")})
    assert figures["rows"] == 2_000 and figures["corpus_bytes"] == corpus.stat().st_size
    assert figures["convert_s"] > figures["open_s"] > 0 and figures["read64_ms"] > 0


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_index_bytes_are_counted_as_faiss_writes_them_without_a_copy(kind):
    import faiss

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((2000, 16), dtype=np.float32)
    index = fill_faiss_index(DenseParams(type=kind, nlist=8, pq_m=4, train_size=2000, hnsw_m=8), vectors, chunk=500)
    assert scale.serialized_bytes(index) == faiss.serialize_index(index).nbytes > 0


@pytest.mark.parametrize("ending, raised", [("os.kill(os.getpid(), signal.SIGKILL)", scale.WorkerKilled),
                                            ("sys.exit(1)", RuntimeError)])
def test_a_worker_killed_by_a_signal_is_told_from_one_that_failed(tmp_path, monkeypatch, ending, raised):
    """The out-of-memory killer's SIGKILL becomes a skipped run (`WorkerKilled`); a worker's own error stays an error."""
    monkeypatch.setattr(scale, "start_worker", lambda script, name, args, threads, log: subprocess.Popen(
        [sys.executable, "-c", f"import os, signal, sys; {ending}"], stdout=subprocess.PIPE, text=True))
    with pytest.raises(raised) as error:
        scale.run_worker("flat-5000000", {}, tmp_path, 1)
    assert (type(error.value) is scale.WorkerKilled) == (raised is scale.WorkerKilled)
    if raised is scale.WorkerKilled:
        assert "killed by signal 9" in str(error.value)


def test_fits_cover_each_type_and_figure_with_two_sizes_or_more():
    runs = [{"rows": n, "type": "flat", "build_s": n / 1e5, "index_bytes": n * 3072} for n in (1_000, 10_000)]
    runs.append({"rows": 1_000, "type": "hnsw", "build_s": 1.0})   # one size: no fit
    fits = scale.fits_and_projections(runs, 21_015_324)
    assert {(f["type"], f["figure"]) for f in fits} == {("flat", "build_s"), ("flat", "index_bytes")}
    size = next(f for f in fits if f["figure"] == "index_bytes")
    assert size["projection"]["value"] == pytest.approx(21_015_324 * 3072)


def test_the_benchmark_end_to_end_writes_its_table_plot_and_projection(tmp_path):
    out = tmp_path / "scale"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_scale.py"), "--out", str(out), "--sizes", "1000",
                           "2000", "4000", "--types", "flat", "--dim", "16", "--queries", "4", "--service-requests", "10",
                           "--encoder-ms", "0", "0", "--bandwidth-gib", "0.01", "--target", "100000"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads((out / "scale.json").read_text())
    assert [(r["type"], r["rows"]) for r in payload["runs"]] == [
        ("row store", 1000), ("flat", 1000), ("row store", 2000), ("flat", 2000), ("row store", 4000), ("flat", 4000)]
    size = next(f for f in payload["fits"] if f["type"] == "flat" and f["figure"] == "index_bytes")
    assert size["fit"]["b"] == pytest.approx(1.0, abs=0.01)  # a Flat index is its vectors
    assert size["projection"]["value"] == pytest.approx(100_000 * 16 * 4, rel=0.02)
    assert all(r["search_batch1_vs_bound"] > 0 for r in payload["runs"] if r["type"] == "flat")
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob("embeddings-*")) and not list(out.glob("corpus-*"))  # removed without --keep
    assert "projected to 100,000 rows" in done.stdout
