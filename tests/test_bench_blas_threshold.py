"""The BLAS-crossover benchmark (benchmarks/bench_blas_threshold.py): its crossover arithmetic, and one small sweep
through the real FAISS that leaves the library's threshold in place. Its figures are benchmarks/RESULTS.md's ("Exact
search in batches")."""

from __future__ import annotations

from agentic_retriever.index.dense import import_faiss
from tests.fakes import import_benchmark

bench = import_benchmark("bench_blas_threshold")


def _line(nq: int, ratio: float) -> dict:
    return {"nq": nq, "nq_x_d": nq * 100, "sequential_over_blas": ratio}


def test_the_crossover_is_where_blas_wins_at_that_batch_and_every_larger_one():
    lines = [_line(1, 0.9), _line(2, 1.3), _line(4, 0.95), _line(8, 2.0), _line(16, 4.0)]
    assert bench.crossover(lines) == 800  # 2 wins alone; from 8 on, every larger batch
    assert bench.crossover([_line(1, 0.5), _line(2, 0.8)]) is None
    assert bench.crossover([_line(1, 1.1), _line(2, 3.0)]) == 100


def test_a_sweep_times_both_paths_says_which_one_the_library_takes_and_keeps_its_threshold():
    faiss = import_faiss()
    tuned = faiss.cvar.distance_compute_blas_threshold
    results = bench.main(["--shapes", "64x2000", "--batches", "1", "256", "--repeats", "1"])
    lines = results["shapes"]["64x2000"]["lines"]
    assert [line["nq"] for line in lines] == [1, 256]
    assert all(line["blas_ms_per_query"] > 0 and line["sequential_ms_per_query"] > 0 for line in lines)
    assert [line["library_takes"] for line in lines] == [
        "blas" if nq * 64 >= tuned else "sequential" for nq in (1, 256)]
    assert faiss.cvar.distance_compute_blas_threshold == tuned == results["threshold"]
