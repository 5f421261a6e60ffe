"""An index folder switches from one build to the next atomically (`agentic_retriever.index.generations`): a build
killed before its manifest commit leaves the old index whole, two builds into one folder leave a manifest and data
files of the same build, a folder of an earlier version (data files at the top) opens and is cleaned by a rebuild,
and generation folders no manifest names are removed unless a build holds them."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from pathlib import Path

import faiss
import numpy as np
import pytest

from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.index import BM25Params, DenseParams, IndexBuildConfig, IndexManifest, build_index, open_index
from agentic_retriever.index.generations import FAISS_FILE, LEGACY_DATA, ROW_MAP_FILE, NewGeneration
from tests.fakes import SYNTHETIC_QUERIES as QUERIES
from tests.fakes import synthetic_rows, write_jsonl


def _dense(corpus: Path, out: Path, model: str, **encoder) -> IndexBuildConfig:
    return IndexBuildConfig(corpus=str(corpus), out=str(out), dense=DenseParams(chunk_size=64),
                            encoder=EncoderConfig(model=model, precision="fp32", **encoder))


def _generations(index_dir: Path) -> list[str]:
    return sorted(p.name for p in index_dir.iterdir() if p.name.startswith("data-"))


def _assert_same_answers(a, b) -> None:
    assert a.ids == b.ids
    assert np.allclose(a.scores, b.scores, atol=1e-6)


def _rebuilds(kind: str, tmp_path: Path, model: str) -> tuple[IndexBuildConfig, IndexBuildConfig]:
    """An index build, and a rebuild of the same folder that gives other answers: another encoder (dense) or
    another corpus (BM25: the passages in reverse order under other ids, so every index position is another
    passage, and the ids tell which corpus answered)."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(300))
    if kind == "dense":
        return _dense(corpus, tmp_path / "idx", model), _dense(corpus, tmp_path / "idx", model, passage_prefix="doc: ")
    reversed_rows = [{**row, "id": f"r{row['id']}"} for row in synthetic_rows(300)[::-1]]
    renamed = write_jsonl(tmp_path / "renamed.jsonl", reversed_rows)
    return (IndexBuildConfig(corpus=str(corpus), out=str(tmp_path / "idx"), backend="bm25"),
            IndexBuildConfig(corpus=str(renamed), out=str(tmp_path / "idx"), backend="bm25"))


def _fresh(config: IndexBuildConfig, out: Path):
    """`config` built into a folder of its own, searched."""
    build_index(dataclasses.replace(config, out=str(out)))
    return open_index(out).search(QUERIES, 8)


@pytest.mark.parametrize("kind", ["dense", "bm25"])
def test_a_build_killed_before_its_manifest_commit_leaves_the_old_index_whole(kind, tmp_path, tiny_model_dir,
                                                                               monkeypatch):
    old_config, new_config = _rebuilds(kind, tmp_path, tiny_model_dir)
    out = Path(old_config.out)
    old = build_index(old_config)
    before = open_index(out).search(QUERIES, 8)
    expected_new = _fresh(new_config, tmp_path / "fresh")
    assert expected_new.ids != before.ids, "the rebuild must change the answers, or this test proves nothing"
    killed_at = tmp_path / "killed"

    def killed(manifest, index_dir):  # the data files are written: what a kill now leaves on disk is copied
        shutil.copytree(out, killed_at)
        raise KeyboardInterrupt("killed before the manifest commit")

    monkeypatch.setattr(IndexManifest, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        build_index(new_config)
    monkeypatch.undo()
    for folder in (out, killed_at):
        assert IndexManifest.load(folder) == old
        _assert_same_answers(open_index(folder).search(QUERIES, 8), before)
    assert len(_generations(killed_at)) == 2, "the killed build had written its data files"
    assert _generations(out) == [old.data_dir], "a build that fails removes its own data files"
    for folder in (out, killed_at):  # a rerun completes the new index and removes the killed build's data files
        again = build_index(dataclasses.replace(new_config, out=str(folder)))
        assert _generations(folder) == [again.data_dir] != [old.data_dir]
        _assert_same_answers(open_index(folder).search(QUERIES, 8), expected_new)


def test_two_builds_into_one_folder_leave_a_manifest_and_data_of_the_same_build(corpus_file, tmp_path,
                                                                                 tiny_model_dir, monkeypatch):
    """The interleaving that pairs wrong when data files are switched before the manifest: B writes its FAISS
    file, then C writes its own, C commits, and B commits last. Both finish, and the folder serves B's index."""
    out = tmp_path / "idx"
    build_index(_dense(corpus_file, out, tiny_model_dir))
    configs = {"B": _dense(corpus_file, out, tiny_model_dir, passage_prefix="doc: "),
               "C": _dense(corpus_file, out, tiny_model_dir, passage_prefix="passage: ")}
    expected = {name: _fresh(config, tmp_path / f"fresh-{name}") for name, config in configs.items()}
    assert expected["B"].ids != expected["C"].ids
    b_written, c_committed = threading.Event(), threading.Event()
    real_write, real_save = faiss.write_index, IndexManifest.save

    def write_index(index, path):
        if threading.current_thread().name == "C":
            assert b_written.wait(120), "B never wrote its index"
        real_write(index, path)
        if threading.current_thread().name == "B":
            b_written.set()

    def save(manifest, index_dir):
        if threading.current_thread().name == "B":
            assert c_committed.wait(120), "C never committed"
        real_save(manifest, index_dir)
        if threading.current_thread().name == "C":
            c_committed.set()

    monkeypatch.setattr(faiss, "write_index", write_index)
    monkeypatch.setattr(IndexManifest, "save", save)
    errors: dict[str, BaseException] = {}

    def build(name: str) -> None:
        try:
            build_index(configs[name])
        except BaseException as error:  # reported below, with the thread's name
            errors[name] = error
            b_written.set()
            c_committed.set()

    threads = [threading.Thread(target=build, args=(name,), name=name) for name in configs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monkeypatch.undo()
    assert errors == {}
    manifest = IndexManifest.load(out)
    assert manifest.encoder["config"]["passage_prefix"] == "doc: ", "the last commit (B's) wins"
    _assert_same_answers(open_index(out).search(QUERIES, 8), expected["B"])


def _as_earlier_version(index_dir: Path) -> None:
    """Rewrite an index folder the way earlier versions laid it out: the data files at the top of the folder and
    a manifest without ``data_dir``."""
    manifest = json.loads((index_dir / "manifest.json").read_text())
    data = index_dir / manifest.pop("data_dir")
    for item in data.iterdir():
        item.rename(index_dir / item.name)
    data.rmdir()
    (index_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_an_index_folder_of_an_earlier_version_opens_and_a_rebuild_leaves_no_top_level_data(tmp_path,
                                                                                              tiny_model_dir):
    rows = synthetic_rows(300)
    rows[3] = {"id": "3", "title": "Topic 3", "text": ""}  # dropped: the folder has rows.npy too
    corpus = write_jsonl(tmp_path / "corpus.jsonl", rows)
    old_config = dataclasses.replace(_dense(corpus, tmp_path / "idx", tiny_model_dir), drop_empty=True)
    build_index(old_config)
    before = open_index(tmp_path / "idx").search(QUERIES, 8)
    _as_earlier_version(tmp_path / "idx")
    assert {FAISS_FILE, ROW_MAP_FILE} <= {p.name for p in (tmp_path / "idx").iterdir()}
    assert _generations(tmp_path / "idx") == [] and IndexManifest.load(tmp_path / "idx").data_dir is None
    legacy = open_index(tmp_path / "idx")
    _assert_same_answers(legacy.search(QUERIES, 8), before)
    assert "3" not in {i for ids in legacy.search(["item"], 300).ids for i in ids}, "rows.npy is read from the top"

    new_config = dataclasses.replace(old_config, encoder=EncoderConfig(model=tiny_model_dir, precision="fp32",
                                                                       passage_prefix="doc: "))
    expected = _fresh(new_config, tmp_path / "fresh")
    assert expected.ids != before.ids
    rebuilt = build_index(new_config)
    assert not [name for name in LEGACY_DATA if (tmp_path / "idx" / name).exists()]
    assert _generations(tmp_path / "idx") == [rebuilt.data_dir]
    _assert_same_answers(open_index(tmp_path / "idx").search(QUERIES, 8), expected)


def test_a_commit_removes_generations_no_build_holds_and_keeps_the_one_being_written(corpus_file, tmp_path):
    out = tmp_path / "idx"
    config = IndexBuildConfig(corpus=str(corpus_file), out=str(out), backend="bm25")
    build_index(config)
    abandoned = out / f"data-{'0' * 32}"  # left by a build killed outright
    (abandoned / "bm25").mkdir(parents=True)
    with NewGeneration(out) as writing:  # another build, still writing its data files
        rebuilt = build_index(dataclasses.replace(config, bm25=BM25Params(k1=1.2)))
        assert _generations(out) == sorted([rebuilt.data_dir, writing.path.name])
    assert _generations(out) == [rebuilt.data_dir], "the build that did not commit removed its own folder"
    assert open_index(out).search(["item 12"], 1).ids == [["12"]]


@pytest.mark.parametrize("data_dir", ["../elsewhere", "/tmp", "data-xyz", 3])
def test_a_manifest_naming_a_data_folder_outside_its_generations_is_refused(corpus_file, tmp_path, data_dir):
    out = tmp_path / "idx"
    build_index(IndexBuildConfig(corpus=str(corpus_file), out=str(out), backend="bm25"))
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "data_dir": data_dir}))
    with pytest.raises(ValueError, match=r"manifest.json: field 'data_dir' is .*not the name of a generation"):
        open_index(out)


def test_a_generation_removed_after_its_manifest_was_read_is_an_error_naming_it(corpus_file, tmp_path):
    out = tmp_path / "idx"
    built = build_index(IndexBuildConfig(corpus=str(corpus_file), out=str(out), backend="bm25"))
    manifest = IndexManifest.load(out)
    shutil.rmtree(out / built.data_dir)
    with pytest.raises(FileNotFoundError, match=f"names the data folder '{built.data_dir}' \\(field 'data_dir'\\)"):
        manifest.data_folder(out)
