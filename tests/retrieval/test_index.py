import dataclasses
import json
import logging
import shutil
import types

import numpy as np
import pytest

from agentic_retriever.base.corpus import Corpus
from agentic_retriever.base.encoder import Encoder, EncoderConfig
from agentic_retriever.index import (
    BM25Params, DenseParams, IndexBuildConfig, IndexManifest, IndexMismatchError, build_index, open_index,
)
from agentic_retriever.index import dense as dense_module
from agentic_retriever.index.dense import chunk_rows
from agentic_retriever.index.identity import index_identity
from tests.fakes import SYNTHETIC_QUERIES as QUERIES
from tests.fakes import synthetic_rows, write_jsonl


def _config(corpus_file, out, model, **dense):
    return IndexBuildConfig(corpus=str(corpus_file), out=str(out), encoder=EncoderConfig(model=model),
                            dense=DenseParams(chunk_size=64, **dense))


def test_flat_search_equals_brute_force_inner_product(corpus_file, tmp_path, tiny_model_dir):
    build_index(_config(corpus_file, tmp_path / "flat", tiny_model_dir))
    index = open_index(tmp_path / "flat")
    corpus = Corpus.open(corpus_file)
    passages = index.encoder.encode_passages([c for batch in corpus.iter_contents() for c in batch])
    queries = ["river castle", "comet near the glacier", "item 42"]
    expected = np.argsort(-(index.encoder.encode_queries(queries) @ passages.T), axis=1)[:, :5]
    result = index.search(queries, 5)
    assert [list(map(int, ids)) for ids in result.ids] == expected.tolist()
    assert all(s == sorted(s, reverse=True) for s in result.scores)


@pytest.mark.slow
def test_hnsw_and_ivfpq_agree_mostly_with_flat(corpus_file, tmp_path, tiny_model_dir):
    build_index(_config(corpus_file, tmp_path / "flat", tiny_model_dir))
    build_index(_config(corpus_file, tmp_path / "hnsw", tiny_model_dir, type="hnsw", hnsw_m=16))
    build_index(_config(corpus_file, tmp_path / "ivfpq", tiny_model_dir, type="ivfpq", nlist=4, pq_m=8, nprobe=4))
    queries = [f"{w} item {i}" for i, w in enumerate(["river", "comet", "falcon", "reef", "lagoon", "summit"])]
    flat = open_index(tmp_path / "flat").search(queries, 10).ids
    hnsw = open_index(tmp_path / "hnsw").search(queries, 10).ids
    ivfpq = open_index(tmp_path / "ivfpq").search(queries, 10).ids
    overlap = lambda a, b: np.mean([len(set(x) & set(y)) / 10 for x, y in zip(a, b)])  # noqa: E731
    assert overlap(hnsw, flat) >= 0.9
    assert overlap(ivfpq, flat) >= 0.3
    assert open_index(tmp_path / "hnsw").index.hnsw.efSearch == DenseParams().ef_search


def _die_on_third_chunk(monkeypatch) -> dict:
    """The encoder raises KeyboardInterrupt (a killed process) when asked for its third chunk of passages;
    returns the counter of chunks encoded (``calls["n"]``)."""
    calls = {"n": 0}
    real = Encoder.encode_passages

    def dies_on_third_chunk(self, texts, show_progress=False):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return real(self, texts, show_progress)

    monkeypatch.setattr(Encoder, "encode_passages", dies_on_third_chunk)
    return calls


def test_killed_build_resumes_and_equals_an_uninterrupted_build(corpus_file, tmp_path, tiny_model_dir, monkeypatch):
    build_index(_config(corpus_file, tmp_path / "whole", tiny_model_dir))
    calls = _die_on_third_chunk(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        build_index(_config(corpus_file, tmp_path / "resumed", tiny_model_dir))
    state = json.loads(next((tmp_path / "resumed").glob("*.state.json")).read_text())
    assert state["rows_done"] == 128 and not (tmp_path / "resumed" / "manifest.json").exists()

    calls["n"] = -100
    build_index(_config(corpus_file, tmp_path / "resumed", tiny_model_dir))
    assert calls["n"] == -100 + 3  # only the 3 chunks after row 128 were encoded again (300 rows, chunks of 64)
    queries = ["river castle", "item 7", "glacier"]
    whole, resumed = open_index(tmp_path / "whole").search(queries, 8), open_index(tmp_path / "resumed").search(queries, 8)
    assert whole.ids == resumed.ids
    assert np.allclose(whole.scores, resumed.scores)
    assert list((tmp_path / "resumed").glob("embeddings-*")) == []  # not kept by default


def test_a_complete_index_is_reused_not_rebuilt(corpus_file, tmp_path, tiny_model_dir, monkeypatch):
    config = _config(corpus_file, tmp_path / "idx", tiny_model_dir)
    first = build_index(config)
    monkeypatch.setattr(dense_module, "build_dense_index", lambda *a: pytest.fail("rebuilt"))
    assert build_index(dataclasses.replace(config, dense=dataclasses.replace(config.dense, ef_search=7))) == first
    # another type's structural fields do not concern a Flat index
    assert build_index(dataclasses.replace(config, dense=dataclasses.replace(config.dense, hnsw_m=32, nlist=8))) == first


def test_an_index_reused_for_the_same_weights_in_another_folder_opens_them_from_there(corpus_file, tmp_path,
                                                                                     tiny_model_dir):
    first = build_index(_config(corpus_file, tmp_path / "flat", tiny_model_dir))
    moved = tmp_path / "encoder-moved"
    shutil.copytree(tiny_model_dir, moved)
    build_index(_config(corpus_file, tmp_path / "flat", str(moved)))
    manifest = IndexManifest.load(tmp_path / "flat")
    assert manifest.created_at == first.created_at and manifest.build_seconds == first.build_seconds, "not rebuilt"
    assert manifest.encoder["config"]["model"] == str(moved)
    assert open_index(tmp_path / "flat").encoder.config.model == str(moved)


def test_an_hnsw_index_with_another_graph_degree_is_rebuilt(corpus_file, tmp_path, tiny_model_dir):
    config = _config(corpus_file, tmp_path / "idx", tiny_model_dir, type="hnsw", hnsw_m=8)
    first = build_index(config)
    again = build_index(dataclasses.replace(config, dense=dataclasses.replace(config.dense, hnsw_m=16)))
    assert again.params["hnsw_m"] == 16 and first.params["hnsw_m"] == 8


def test_shared_embeddings_dir_encodes_the_corpus_once(corpus_file, tmp_path, tiny_model_dir, monkeypatch):
    shared = dict(embeddings_dir=str(tmp_path / "emb"), keep_embeddings=True)
    build_index(_config(corpus_file, tmp_path / "flat", tiny_model_dir, **shared))
    monkeypatch.setattr(Encoder, "encode_passages", lambda *a, **k: pytest.fail("encoded again"))
    build_index(_config(corpus_file, tmp_path / "hnsw", tiny_model_dir, type="hnsw", **shared))
    assert open_index(tmp_path / "hnsw").search(["river"], 3).ids[0]


def test_opening_with_another_encoder_is_refused(corpus_file, tmp_path, tiny_model_dir):
    build_index(_config(corpus_file, tmp_path / "idx", tiny_model_dir))
    with pytest.raises(IndexMismatchError, match="built with encoder"):
        open_index(tmp_path / "idx", encoder=EncoderConfig(model=tiny_model_dir, query_prefix="query: "))
    open_index(tmp_path / "idx", encoder=EncoderConfig(model=tiny_model_dir))  # the same encoder is accepted


def test_opening_with_another_corpus_is_refused(corpus_file, tmp_path, tiny_model_dir):
    build_index(_config(corpus_file, tmp_path / "idx", tiny_model_dir))
    other = write_jsonl(tmp_path / "other.jsonl", synthetic_rows(301))
    with pytest.raises(IndexMismatchError, match="is not the corpus this index was built from"):
        open_index(tmp_path / "idx", corpus=str(other))


def test_an_incomplete_index_folder_is_not_opened(tmp_path):
    (tmp_path / "idx").mkdir()
    with pytest.raises(FileNotFoundError, match="manifest.json is missing"):
        open_index(tmp_path / "idx")


def test_manifest_records_what_built_the_index(corpus_file, tmp_path, tiny_model_dir):
    build_index(_config(corpus_file, tmp_path / "idx", tiny_model_dir, type="hnsw"))
    manifest = IndexManifest.load(tmp_path / "idx")
    assert (manifest.backend, manifest.index_type, manifest.rows, manifest.dim) == ("dense", "hnsw", 300, 32)
    assert manifest.corpus_sha256 == Corpus.open(corpus_file).sha256
    assert manifest.encoder["model"] == tiny_model_dir and manifest.encoder["composition"] == "query"


def test_question_sep_query_index_composes_the_query_with_the_question(corpus_file, tmp_path, tiny_model_dir):
    config = _config(corpus_file, tmp_path / "idx", tiny_model_dir)
    config.encoder = EncoderConfig(model=tiny_model_dir, composition="question_sep_query")
    build_index(config)
    index = open_index(tmp_path / "idx")
    assert index.composition == "question_sep_query"
    with_question = index.search(["item 5"], 5, questions=["which comet?"])
    composed = index.search(["which comet? [SEP] item 5"], 5)
    assert with_question.ids == composed.ids and np.allclose(with_question.scores, composed.scores)
    assert index.search(["item 5"], 5).ids != with_question.ids


def test_k_larger_than_the_corpus_returns_every_passage(tmp_path, tiny_model_dir):
    corpus_file = write_jsonl(tmp_path / "c.jsonl", synthetic_rows(4))
    build_index(_config(corpus_file, tmp_path / "idx", tiny_model_dir))
    assert sorted(open_index(tmp_path / "idx").search(["x"], 50).ids[0]) == ["0", "1", "2", "3"]


def test_bm25_ranks_the_matching_passage_first_and_returns_passages(corpus_file, tmp_path):
    build_index(IndexBuildConfig(corpus=str(corpus_file), out=str(tmp_path / "bm25"), backend="bm25"))
    index = open_index(tmp_path / "bm25")
    hits = index.retrieve(["item 123"], 3, questions=["ignored by BM25"])[0]
    assert hits[0].id == "123" and hits[0].title == "Topic 123"
    assert hits[0].contents.startswith('"Topic 123"\n') and hits[0].score > hits[1].score
    assert index.composition == "query"


def test_bm25_without_stemming_or_stopwords(corpus_file, tmp_path):
    build_index(IndexBuildConfig(corpus=str(corpus_file), out=str(tmp_path / "bm25"), backend="bm25",
                                 bm25=BM25Params(stemmer=None, stopwords=None)))
    assert open_index(tmp_path / "bm25").search(["holds item 77"], 1).ids == [["77"]]


class _FakeGpuFaiss(types.SimpleNamespace):
    """Stands in for faiss-gpu: records how the index would be cloned onto GPUs."""

    def __init__(self, gpus):
        super().__init__(cloned=None)
        self._gpus = gpus

    def get_num_gpus(self):
        return self._gpus

    def GpuMultipleClonerOptions(self):  # noqa: N802 (FAISS's name)
        return types.SimpleNamespace(shard=False, useFloat16=False)

    def index_cpu_to_all_gpus(self, index, co):
        self.cloned = (index, co)
        return "gpu-index"


def test_flat_index_is_sharded_over_all_gpus_in_fp16():
    faiss = _FakeGpuFaiss(gpus=2)
    assert dense_module._to_all_gpus(faiss, "cpu-index", DenseParams(type="flat")) == "gpu-index"
    index, options = faiss.cloned
    assert index == "cpu-index" and options.shard and options.useFloat16


def test_gpu_placement_rules():
    assert dense_module._to_all_gpus(_FakeGpuFaiss(gpus=0), "i", DenseParams(gpu="auto")) is None
    assert dense_module._to_all_gpus(_FakeGpuFaiss(gpus=2), "i", DenseParams(type="hnsw")) is None
    assert dense_module._to_all_gpus(_FakeGpuFaiss(gpus=2), "i", DenseParams(gpu="off")) is None
    with pytest.raises(RuntimeError, match="faiss-gpu"):
        dense_module._to_all_gpus(_FakeGpuFaiss(gpus=0), "i", DenseParams(gpu="on"))
    with pytest.raises(ValueError, match="cannot search a hnsw index on GPU"):
        dense_module._to_all_gpus(_FakeGpuFaiss(gpus=1), "i", DenseParams(type="hnsw", gpu="on"))


def test_ivfpq_rejects_a_sub_quantiser_count_that_does_not_divide_the_dimension(corpus_file, tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="pq_m=7 must divide the embedding dimension 32"):
        build_index(_config(corpus_file, tmp_path / "idx", tiny_model_dir, type="ivfpq", pq_m=7))


def test_pyserini_engine_without_the_extra_names_the_extra(corpus_file, tmp_path):
    try:
        import pyserini  # noqa: F401
        pytest.skip("pyserini is installed here")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"agentic-retriever\[pyserini\]"):
        build_index(IndexBuildConfig(corpus=str(corpus_file), out=str(tmp_path / "lucene"), backend="bm25",
                                     bm25=BM25Params(engine="pyserini")))
    assert not (tmp_path / "lucene" / "manifest.json").exists()


# ------------------------------------------------------------------------------------------ empty passages

EMPTY_IDS = ["3", "50", "120"]


def _rows_with_empty_passages():
    rows = synthetic_rows(300)
    rows[3] = {"id": "3", "title": "Topic 3", "text": ""}
    rows[50] = {"id": "50", "title": "Topic 50", "text": " \n\t"}
    rows[120] = {"id": "120", "title": "", "text": ""}
    return rows


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_empty_passages_are_counted_logged_and_left_out_on_request(tmp_path, tiny_model_dir, caplog, kind):
    corpus_file = write_jsonl(tmp_path / "c.jsonl", _rows_with_empty_passages())
    with caplog.at_level(logging.WARNING, logger="agentic_retriever.index"):
        whole = build_index(_config(corpus_file, tmp_path / "whole", tiny_model_dir, type=kind))
    assert "3 of 300 passages have empty text (1 of them an empty title too), ids 3, 50, 120" in caplog.text
    assert whole.rows == 300
    assert whole.empty_passages == {"empty_text": 3, "empty_title_and_text": 1, "first_ids": EMPTY_IDS, "dropped": 0}
    config = dataclasses.replace(_config(corpus_file, tmp_path / "lean", tiny_model_dir, type=kind), drop_empty=True)
    lean = build_index(config)
    assert lean.rows == 297 and lean.empty_passages["dropped"] == 3
    assert IndexManifest.load(tmp_path / "lean").empty_passages == lean.empty_passages
    full_index, lean_index = open_index(tmp_path / "whole"), open_index(tmp_path / "lean")
    assert len(lean_index) == lean_index.index.ntotal == 297
    # a passage's own text finds it first: the index positions map back to the right corpus rows
    texts = [f"The {w} near the" for w in ("river", "comet")] + [p.contents for p in Corpus.open(corpus_file).get(["200", "299"])]
    hits = lean_index.retrieve(texts, 5)
    assert [h[0].id for h in hits[2:]] == ["200", "299"]
    assert all(p.title == f"Topic {p.id}" and p.id not in EMPTY_IDS for h in hits for p in h)
    if kind == "flat":
        everything = lean_index.search(["item"], 300)
        assert sorted(everything.ids[0], key=int) == [str(i) for i in range(300) if str(i) not in EMPTY_IDS]
        full = full_index.search(QUERIES, 20)
        kept = lean_index.search(QUERIES, 10)
        for ids, scores, lean_ids, lean_scores in zip(full.ids, full.scores, kept.ids, kept.scores):
            pairs = [(i, s) for i, s in zip(ids, scores) if i not in EMPTY_IDS][:10]
            assert lean_ids == [i for i, _ in pairs] and np.allclose(lean_scores, [s for _, s in pairs])
    # the same settings reuse the index; without drop_empty it is built again, whole
    assert build_index(config).created_at == lean.created_at
    assert (IndexManifest.load(tmp_path / "lean").data_folder(tmp_path / "lean") / "rows.npy").is_file()
    assert build_index(dataclasses.replace(config, drop_empty=False)).rows == 300
    assert not list((tmp_path / "lean").rglob("rows.npy")), "the new build has none, the one it replaced is removed"


def test_bm25_leaves_empty_passages_out_on_request(tmp_path, caplog):
    corpus_file = write_jsonl(tmp_path / "c.jsonl", _rows_with_empty_passages())
    with caplog.at_level(logging.WARNING, logger="agentic_retriever.index"):
        whole = build_index(IndexBuildConfig(corpus=str(corpus_file), out=str(tmp_path / "whole"), backend="bm25"))
    assert "3 of 300 passages have empty text" in caplog.text and whole.empty_passages["dropped"] == 0
    lean = build_index(IndexBuildConfig(corpus=str(corpus_file), out=str(tmp_path / "lean"), backend="bm25", drop_empty=True))
    assert (lean.rows, lean.empty_passages["empty_text"], lean.dropped) == (297, 3, 3)
    index = open_index(tmp_path / "lean")
    hits = index.retrieve(["item 200", "item 299", "Topic"], 3)
    assert [h[0].id for h in hits[:2]] == ["200", "299"]
    assert all(p.title == f"Topic {p.id}" for h in hits for p in h)
    every = index.search(["item"], 300).ids[0]
    assert len(every) <= 297 and not set(every) & set(EMPTY_IDS)


# ---------------------------------------------------------------------------------------- resume granularity

def test_the_default_chunk_is_a_tenth_of_the_corpus_within_bounds():
    assert [chunk_rows(DenseParams(), n) for n in (1, 300, 2_560, 10_033, 1_000_000)] == [256, 256, 256, 1_004, 16_384]
    assert chunk_rows(DenseParams(chunk_size=64), 1_000_000) == 64
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        chunk_rows(DenseParams(chunk_size=0), 10)


def test_a_killed_build_of_a_small_corpus_resumes_past_its_start_by_default(tmp_path, tiny_model_dir, monkeypatch):
    corpus_file = write_jsonl(tmp_path / "c.jsonl", synthetic_rows(1000))  # default chunk 256: 256, 256, 256, 232

    def config(out):
        return IndexBuildConfig(corpus=str(corpus_file), out=str(tmp_path / out),
                                encoder=EncoderConfig(model=tiny_model_dir), dense=DenseParams(keep_embeddings=True))

    build_index(config("whole"))
    calls = _die_on_third_chunk(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        build_index(config("resumed"))
    state = json.loads(next((tmp_path / "resumed").glob("*.state.json")).read_text())
    assert state["rows_done"] == 512
    calls["n"] = -100
    build_index(config("resumed"))
    assert calls["n"] == -100 + 2  # only the 2 chunks after row 512 were encoded again
    whole, resumed = (np.load(next((tmp_path / name).glob("embeddings-*.npy"))) for name in ("whole", "resumed"))
    assert np.array_equal(whole, resumed)
    assert open_index(tmp_path / "whole").search(QUERIES, 8).ids == open_index(tmp_path / "resumed").search(QUERIES, 8).ids


#: A stand-in for JAX: importing it, or running its top-k, writes a line to the file named by $FAKE_JAX_LOG.
_FAKE_JAX = {
    "jax/__init__.py": "import os\nopen(os.environ['FAKE_JAX_LOG'], 'a').write('import jax\\n')\nfrom . import lax\n",
    "jax/lax.py": "import os\n\ndef top_k(scores, k):\n    open(os.environ['FAKE_JAX_LOG'], 'a').write('top_k\\n')\n"
                  "    import numpy as np\n    order = np.argsort(-np.asarray(scores))[:k]\n"
                  "    return np.asarray(scores)[order], order\n",
}

_BM25_RUN = """
import json, sys
{preload}
import torch
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
build_index(IndexBuildConfig(corpus=sys.argv[1], out=sys.argv[2], backend="bm25", corpus_cache=sys.argv[3]))
hits = open_index(sys.argv[2], corpus_cache=sys.argv[3]).retrieve(["river castle"], 3)
print(json.dumps({{"ids": [p.id for p in hits[0]], "cuda": torch.cuda.is_initialized()}}))
"""


@pytest.mark.parametrize("preload", ["", "import jax"], ids=["jax-installed", "jax-already-imported"])
def test_a_bm25_build_and_search_never_run_jax_or_touch_cuda(corpus_file, tmp_path, preload):
    """bm25s runs a JAX op at import when JAX is installed, and JAX then reserves most of a GPU: with JAX importable
    (a stand-in that logs its use), a BM25 build and search in a fresh process neither import it nor run its top-k,
    and leave CUDA uninitialised; with JAX imported before us, its top-k is still never run."""
    import os
    import subprocess
    import sys

    for name, text in _FAKE_JAX.items():
        (tmp_path / "site" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / name).write_text(text)
    log = tmp_path / "jax.log"
    env = {**os.environ, "FAKE_JAX_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _BM25_RUN.format(preload=preload), str(corpus_file),
                          str(tmp_path / "bm25"), str(tmp_path / "cache")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ids"] and result["cuda"] is False
    used = log.read_text().splitlines() if log.exists() else []
    assert used == ([] if not preload else ["import jax"])  # imported by the caller, never run by a BM25 search


@pytest.mark.slow
def test_an_index_encoded_on_two_devices_equals_one_encoded_on_one_and_stops_its_processes(
        corpus_file, tmp_path, tiny_model_dir, monkeypatch):
    """`encoder.devices` (the paper config: every GPU) spreads the corpus over one process per device
    (sentence-transformers' pool); two CPU processes stand in for GPUs here. Same ranking, embeddings to fp32
    rounding, the processes gone after the build, and the index reusable whatever the devices."""
    psutil = pytest.importorskip("psutil", reason="psutil is not installed (the dev extra has it)")
    single = _config(corpus_file, tmp_path / "one", tiny_model_dir, keep_embeddings=True)
    single = dataclasses.replace(single, encoder=dataclasses.replace(single.encoder, device="cpu", precision="fp32"))
    build_index(single)  # on the CPU in fp32, as the two CPU processes: the comparison holds on a GPU host too
    pools = []
    start = Encoder.encode_passages

    def spying(self, passages, show_progress=False):
        out = start(self, passages, show_progress)
        if self._pool is not None and not pools:
            pools.append([process.pid for process in self._pool["processes"]])
        return out

    monkeypatch.setattr(Encoder, "encode_passages", spying)
    two = dataclasses.replace(single, out=str(tmp_path / "two"),
                              encoder=dataclasses.replace(single.encoder, devices=["cpu", "cpu"], batch_size=8))
    build_index(two)
    assert len(pools) == 1 and len(pools[0]) == 2
    assert not any(psutil.pid_exists(pid) for pid in pools[0])  # the processes ended with the encoding
    embeddings = [np.load(next((tmp_path / name).glob("embeddings-*.npy"))) for name in ("one", "two")]
    np.testing.assert_allclose(embeddings[0], embeddings[1], atol=1e-5)
    assert open_index(tmp_path / "one").search(QUERIES, 5).ids == open_index(tmp_path / "two").search(QUERIES, 5).ids
    monkeypatch.setattr(dense_module, "build_dense_index", lambda *a: pytest.fail("rebuilt"))
    build_index(dataclasses.replace(two, encoder=dataclasses.replace(two.encoder, devices=[])))  # reused


def test_devices_all_without_a_gpu_is_refused_by_name(tiny_model_dir, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    encoder = Encoder(EncoderConfig(model=tiny_model_dir, device="cpu", devices=["all"]))
    with pytest.raises(ValueError, match="devices all needs visible GPUs"):
        encoder.encode_passages(["text"] * 100)
    with pytest.raises(ValueError, match="all stands alone"):
        Encoder(EncoderConfig(model=tiny_model_dir, device="cpu", devices=["all", "cuda:0"]))


def test_passages_encoded_in_bf16_never_share_the_fp32_embeddings_cache_and_change_the_identity(tmp_path,
                                                                                               tiny_model_dir):
    """A shared embeddings folder holds one file per precision: a bf16 build (``precision: native`` on an AMX CPU)
    neither reuses the fp32 file nor leaves its own for an fp32 build, and its index identity (what the loop's and
    the demo's caches key on) differs; an fp32 index keeps the identity it had before the dtype was recorded."""
    corpus_file = write_jsonl(tmp_path / "c.jsonl", synthetic_rows(40))
    shared = tmp_path / "embeddings"

    def build(out, precision):
        return build_index(IndexBuildConfig(
            corpus=str(corpus_file), out=str(tmp_path / out),
            encoder=EncoderConfig(model=tiny_model_dir, precision=precision, device="cpu"),
            dense=DenseParams(keep_embeddings=True, embeddings_dir=str(shared))))

    fp32, bf16 = build("fp32", "fp32"), build("bf16", "bf16")
    files = sorted(p.name for p in shared.glob("embeddings-*.npy"))
    assert len(files) == 2 and files[0].endswith("-bfloat16.npy"), files
    assert (fp32.encoder["dtype"], bf16.encoder["dtype"]) == ("float32", "bfloat16")
    assert index_identity(bf16) == index_identity(fp32) | {"encoder_dtype": "bfloat16"}
    assert "encoder_dtype" not in index_identity(fp32)
    a, b = (np.load(shared / name) for name in files)
    assert not np.array_equal(a, b) and np.all(np.sum(a * b, axis=1) > 0.98)


@pytest.fixture
def faiss_blas_threshold():
    """FAISS's process-wide BLAS threshold, put back as it was after the test."""
    faiss = dense_module.import_faiss()
    before = faiss.cvar.distance_compute_blas_threshold
    yield faiss
    faiss.cvar.distance_compute_blas_threshold = before


def test_the_blas_threshold_is_scaled_to_the_threads_only_from_faiss_own_default(faiss_blas_threshold):
    faiss = faiss_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = dense_module.FAISS_DEFAULT_BLAS_THRESHOLD
    dense_module.import_faiss()
    assert faiss.cvar.distance_compute_blas_threshold == 800 * faiss.omp_get_max_threads()
    faiss.cvar.distance_compute_blas_threshold = 5_000  # a user's own value
    dense_module.import_faiss()
    assert faiss.cvar.distance_compute_blas_threshold == 5_000


def test_a_batch_past_the_blas_threshold_finds_what_each_query_alone_finds(faiss_blas_threshold):
    """The batch goes through BLAS (nq x d over the tuned threshold), a lone query through the sequential kernel:
    the same passages in the same order, scores equal to float32 rounding."""
    faiss = faiss_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = dense_module.FAISS_DEFAULT_BLAS_THRESHOLD
    dim = 96
    nq = dense_module.import_faiss().cvar.distance_compute_blas_threshold // dim + 1
    rng = np.random.default_rng(0)
    passages = rng.standard_normal((3000, dim)).astype(np.float32)
    queries = rng.standard_normal((nq, dim)).astype(np.float32)
    index = faiss.IndexFlatIP(dim)
    index.add(passages)
    scores, rows = index.search(queries, 5)
    alone = [index.search(queries[i:i + 1], 5) for i in range(nq)]
    assert rows.tolist() == [r[0].tolist() for _, r in alone]
    np.testing.assert_allclose(scores, np.concatenate([s for s, _ in alone]), rtol=1e-5, atol=1e-5)
    assert rows.tolist() == np.argsort(-(queries @ passages.T), axis=1)[:, :5].tolist()
