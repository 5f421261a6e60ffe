"""Portable index folders: paths stored relative to the index folder, opened from any working directory and
after the run folder is copied or moved; content guards still refuse other files; older manifests still open."""

import json
import shutil
from pathlib import Path

import pytest

from agentic_retriever.base.encoder import Encoder, EncoderConfig
from agentic_retriever.index import (
    DenseParams, IndexBuildConfig, IndexManifest, IndexMismatchError, build_index, open_index,
)
from tests.fakes import SYNTHETIC_QUERIES as QUERIES
from tests.fakes import synthetic_rows, write_jsonl




def _run_folder(root, tiny_model_dir, monkeypatch, rows=None):
    """A run folder laid out as the quickstart's, built from `root` with paths relative to it (as typed on a
    command line): runs/quickstart/{data/corpus.jsonl, retriever/, index/flat, index/bm25}."""
    run = root / "runs" / "quickstart"
    (run / "data").mkdir(parents=True)
    write_jsonl(run / "data" / "corpus.jsonl", rows or synthetic_rows(300))
    shutil.copytree(tiny_model_dir, run / "retriever")
    monkeypatch.chdir(root)
    build_index(IndexBuildConfig(corpus="runs/quickstart/data/corpus.jsonl", out="runs/quickstart/index/flat",
                                 encoder=EncoderConfig(model="runs/quickstart/retriever"), dense=DenseParams(chunk_size=64)))
    build_index(IndexBuildConfig(corpus="runs/quickstart/data/corpus.jsonl", out="runs/quickstart/index/bm25",
                                 backend="bm25"))
    return run


def _elsewhere(tmp_path, monkeypatch, name="elsewhere"):
    folder = tmp_path / name
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_manifest_stores_local_paths_relative_to_the_index_folder_and_hub_names_as_they_are(tmp_path, tiny_model_dir,
                                                                                          monkeypatch, dense):
    run = _run_folder(tmp_path, tiny_model_dir, monkeypatch)
    stored = json.loads((run / "index" / "flat" / "manifest.json").read_text())
    assert stored["path_base"] == "index"
    assert stored["corpus_path"] == "../../data/corpus.jsonl"
    assert stored["encoder"]["config"]["model"] == stored["encoder"]["model"] == "../../retriever"
    assert stored["build_paths"] == {"corpus_path": str(run / "data" / "corpus.jsonl"),
                                     "encoder.config.model": str(run / "retriever"), "encoder.model": str(run / "retriever")}
    assert json.loads((run / "index" / "bm25" / "manifest.json").read_text())["corpus_path"] == "../../data/corpus.jsonl"
    # the shared dense index of tests/retrieval/conftest.py was built with the hub-style name `default`
    hub = json.loads((Path(dense.index_dir) / "manifest.json").read_text())
    assert hub["encoder"]["config"]["model"] == hub["encoder"]["model"] == "default"
    assert "encoder.config.model" not in hub["build_paths"] and hub["corpus_path"] == "../corpus.jsonl"


def test_an_index_opens_from_any_working_directory(tmp_path, tiny_model_dir, monkeypatch):
    run = _run_folder(tmp_path, tiny_model_dir, monkeypatch)
    expected = {name: open_index(f"runs/quickstart/index/{name}").search(QUERIES, 5) for name in ("flat", "bm25")}
    _elsewhere(tmp_path, monkeypatch)
    for where in (run / "index" / "flat", "../runs/quickstart/index/flat"):
        index = open_index(where)
        assert index.search(QUERIES, 5).ids == expected["flat"].ids
        # a loaded manifest holds the resolved absolute paths (what logs and GET /health report)
        assert index.manifest.corpus_path == str(run / "data" / "corpus.jsonl")
        assert index.encoder.config.model == index.manifest.encoder["model"] == str(run / "retriever")
        assert index.index_dir == str(run / "index" / "flat")
    assert open_index(run / "index" / "bm25").search(QUERIES, 5).ids == expected["bm25"].ids


def test_a_run_folder_copied_elsewhere_opens_and_searches_the_same(tmp_path, tiny_model_dir, monkeypatch):
    run = _run_folder(tmp_path, tiny_model_dir, monkeypatch)
    before = {name: open_index(run / "index" / name).retrieve(QUERIES, 8) for name in ("flat", "bm25")}
    copy = tmp_path / "other-machine" / "copied-run"
    shutil.copytree(run, copy)
    shutil.rmtree(tmp_path / "runs")  # the original is gone: only the copy's relative layout can be used
    _elsewhere(tmp_path, monkeypatch)
    for name in ("flat", "bm25"):
        index = open_index(copy / "index" / name)
        assert index.retrieve(QUERIES, 8) == before[name]  # same passages, same scores
        assert index.manifest.corpus_path == str(copy / "data" / "corpus.jsonl")
    assert open_index(copy / "index" / "flat").encoder.config.model == str(copy / "retriever")


def test_an_index_folder_moved_alone_opens_the_files_where_they_were_at_build_time(tmp_path, tiny_model_dir,
                                                                                 monkeypatch):
    run = _run_folder(tmp_path, tiny_model_dir, monkeypatch)
    expected = open_index(run / "index" / "flat").search(QUERIES, 5).ids
    moved = tmp_path / "indexes" / "deeper" / "flat"
    moved.parent.mkdir(parents=True)
    shutil.move(run / "index" / "flat", moved)
    _elsewhere(tmp_path, monkeypatch)
    index = open_index(moved)
    assert index.search(QUERIES, 5).ids == expected
    assert index.manifest.corpus_path == str(run / "data" / "corpus.jsonl")


def test_a_moved_folder_still_refuses_other_files_in_the_places_of_its_corpus_and_encoder(tmp_path, tiny_model_dir,
                                                                                       monkeypatch):
    from agentic_retriever.base.encoder import EncoderSettings, save_model_settings

    run = _run_folder(tmp_path, tiny_model_dir, monkeypatch)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(tmp_path / "runs")
    write_jsonl(copy / "data" / "corpus.jsonl", synthetic_rows(301))
    with pytest.raises(IndexMismatchError, match="is not the corpus this index was built from"):
        open_index(copy / "index" / "bm25")
    write_jsonl(copy / "data" / "corpus.jsonl", synthetic_rows(300))
    open_index(copy / "index" / "flat")  # the same content is accepted
    save_model_settings(copy / "retriever", EncoderSettings(model="x", query_prefix="query: ", passage_prefix="",
                                                            composition="query", pooling="mean", normalize=True,
                                                            max_length=128, fingerprint=""))
    with pytest.raises(IndexMismatchError, match="built with encoder"):
        open_index(copy / "index" / "flat")


def test_missing_files_are_an_error_naming_the_manifest_field_and_the_paths_tried(tmp_path, tiny_model_dir, monkeypatch):
    run = _run_folder(tmp_path, tiny_model_dir, monkeypatch)
    index_dir = run / "index" / "flat"
    created = IndexManifest.load(index_dir).created_at
    (run / "data" / "corpus.jsonl").rename(run / "data" / "renamed.jsonl")
    (run / "retriever").rename(run / "encoder")
    _elsewhere(tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError) as error:
        open_index(index_dir)
    message = str(error.value)
    assert "manifest field 'corpus_path' is '../../data/corpus.jsonl'" in message
    assert str(run / "data" / "corpus.jsonl") in message and "open_index(DIR, corpus=FILE)" in message
    with pytest.raises(FileNotFoundError, match=r"manifest field 'encoder.config.model' is '\.\./\.\./retriever'.*"
                                                r"open_index\(DIR, encoder=EncoderConfig\(model=FOLDER\)\)"):
        open_index(index_dir, corpus=str(run / "data" / "renamed.jsonl"))
    given = open_index(index_dir, corpus=str(run / "data" / "renamed.jsonl"), encoder=EncoderConfig(model=str(run / "encoder")))
    expected = given.search(QUERIES, 5).ids
    # building again with the files where they are now keeps the index and points its manifest at them
    again = build_index(IndexBuildConfig(corpus=str(run / "data" / "renamed.jsonl"), out=str(index_dir),
                                         encoder=EncoderConfig(model=str(run / "encoder")), dense=DenseParams(chunk_size=64)))
    assert again.created_at == created, "not rebuilt"
    assert json.loads((index_dir / "manifest.json").read_text())["corpus_path"] == "../../data/renamed.jsonl"
    assert open_index(index_dir).search(QUERIES, 5).ids == expected


def _as_previous_version(index_dir, **paths):
    """Rewrite a manifest as the previous version wrote it: paths as given at build time, no path fields."""
    data = json.loads((index_dir / "manifest.json").read_text())
    for key in ("path_base", "build_paths", "empty_passages"):
        data.pop(key)
    data["corpus_path"] = paths["corpus_path"]
    if "model" in paths:
        data["encoder"]["model"] = data["encoder"]["config"]["model"] = paths["model"]
    (index_dir / "manifest.json").write_text(json.dumps(data, indent=2))


def test_previous_version_manifests_open_from_the_folder_they_were_built_in_and_are_upgraded_by_a_build(
        tmp_path, tiny_model_dir, monkeypatch):
    run = _run_folder(tmp_path, tiny_model_dir, monkeypatch)
    corpus_abs = str(run / "data" / "corpus.jsonl")
    _as_previous_version(run / "index" / "flat", corpus_path=corpus_abs, model="runs/quickstart/retriever")
    _as_previous_version(run / "index" / "bm25", corpus_path=corpus_abs)
    created = IndexManifest.load(run / "index" / "flat").created_at
    expected = open_index("runs/quickstart/index/flat").search(QUERIES, 5).ids  # from the build's folder
    assert open_index("runs/quickstart/index/flat").encoder.config.model == str(run / "retriever")
    _elsewhere(tmp_path, monkeypatch)
    assert open_index(run / "index" / "bm25").search(["item 12"], 1).ids == [["12"]]  # absolute corpus path
    with pytest.raises(FileNotFoundError, match=r"manifest field 'encoder.config.model' is 'runs/quickstart/retriever' "
                                                r"\(written by an earlier version"):
        open_index(run / "index" / "flat")
    # the same build, run again from the folder it ran in, keeps the index and writes portable paths
    monkeypatch.chdir(tmp_path)
    build_index(IndexBuildConfig(corpus="runs/quickstart/data/corpus.jsonl", out="runs/quickstart/index/flat",
                                 encoder=EncoderConfig(model="runs/quickstart/retriever"), dense=DenseParams(chunk_size=64)))
    manifest = json.loads((run / "index" / "flat" / "manifest.json").read_text())
    assert manifest["created_at"] == created and manifest["path_base"] == "index"
    assert manifest["encoder"]["config"]["model"] == "../../retriever"
    _elsewhere(tmp_path, monkeypatch, "elsewhere-again")
    assert open_index(run / "index" / "flat").search(QUERIES, 5).ids == expected


def test_a_previous_version_relative_encoder_path_that_looks_like_a_hub_name(tmp_path, tiny_model_dir, monkeypatch):
    import agentic_retriever.index as index_module

    run = _run_folder(tmp_path, tiny_model_dir, monkeypatch)
    _as_previous_version(run / "index" / "flat", corpus_path=str(run / "data" / "corpus.jsonl"), model="retriever")
    monkeypatch.chdir(run)
    assert open_index(run / "index" / "flat").encoder.config.model == str(run / "retriever")  # found as given
    _elsewhere(tmp_path, monkeypatch)

    class NotOnTheHub(Encoder):
        def __init__(self, config=None):
            raise OSError(f"{config.model} is not a local folder and not a model identifier on the hub")

    monkeypatch.setattr(index_module, "Encoder", NotOnTheHub)
    with pytest.raises(FileNotFoundError, match=r"manifest field 'encoder.config.model' is 'retriever'.*"
                                                r"loading it as a hub name failed \(OSError"):
        open_index(run / "index" / "flat")
