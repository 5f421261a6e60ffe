"""The per-stage result store: keyed, append-only, resumable, lazy, single-writer."""

from __future__ import annotations

import hashlib
import json

import pytest

from agentic_retriever.base.fingerprint import stable_hash
from agentic_retriever.base.jsonl import DataFormatError
from agentic_retriever.mining.store import StageStore, StoreLockedError


def test_stable_hash_is_canonical():
    assert stable_hash({"a": 1, "b": [1, 2]}) == stable_hash({"b": [1, 2], "a": 1})
    assert stable_hash({"a": 1}) != stable_hash({"a": 2}) and len(stable_hash("x")) == 32


def test_stable_hash_gives_the_keys_existing_caches_were_named_by():
    """Mining's stores were keyed by BLAKE2b-128 of the canonical JSON, s3's naive-RAG files by SHA-256 of the same
    text: the one hash gives both, so no cache written before is orphaned."""
    obj = {"b": [1, "é"], "a": None}
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
    assert stable_hash(obj) == hashlib.blake2b(text, digest_size=16).hexdigest()
    assert stable_hash(obj, 16, "sha256") == hashlib.sha256(text).hexdigest()[:16]
    with pytest.raises(ValueError, match="blake2b and sha256"):
        stable_hash(obj, algorithm="md5")
    with pytest.raises(ValueError, match="even number"):
        stable_hash(obj, 7)


def test_put_get_and_reopen(tmp_path):
    path = tmp_path / "stage.jsonl"
    with StageStore(path) as store:
        assert store.put({"k1": {"v": 1}, "k2": {"v": [2, "é"]}}) == 2
        assert store.get("k2") == {"v": [2, "é"]} and store.get("nope") is None
        assert "k1" in store and len(store) == 2
    with StageStore(path) as store:
        assert sorted(store.keys()) == ["k1", "k2"] and store.get("k1") == {"v": 1}
        store.put([("k3", {"v": 3})])
        assert store.get("k3") == {"v": 3} and store.get("k1") == {"v": 1}
    assert len(path.read_text().splitlines()) == 3


def test_a_key_is_written_once(tmp_path):
    with StageStore(tmp_path / "s.jsonl") as store:
        store.put({"k": {"v": 1}})
        assert store.put([("k", {"v": 2}), ("j", {"v": 3}), ("j", {"v": 4})]) == 1
        assert store.get("k") == {"v": 1} and store.get("j") == {"v": 3}
    keys = [json.loads(line)["key"] for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert keys == ["k", "j"]


def test_a_partial_last_line_from_a_crash_is_cut_off(tmp_path):
    path = tmp_path / "s.jsonl"
    with StageStore(path) as store:
        store.put({"k": {"v": 1}})
    with open(path, "a") as handle:
        handle.write('{"key": "half", "value": {"v"')
    with StageStore(path) as store:
        assert list(store.keys()) == ["k"]
        store.put({"half": {"v": 2}})
        assert store.get("half") == {"v": 2}
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["k", "half"]


def test_a_corrupt_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"key": "k", "value": {}}\nnot json\n')
    with pytest.raises(DataFormatError, match=r"s\.jsonl:2"):
        StageStore(path)


def test_one_writer_per_store(tmp_path):
    with StageStore(tmp_path / "s.jsonl"), pytest.raises(StoreLockedError, match="being written by another process"):
        StageStore(tmp_path / "s.jsonl")
    StageStore(tmp_path / "s.jsonl").close()  # free again


def test_compact_keeps_only_the_live_records(tmp_path):
    with StageStore(tmp_path / "s.jsonl") as store:
        store.put({f"k{i}": {"v": i} for i in range(5)})
        assert store.compact(["k3", "k1"]) == 3
        assert sorted(store.keys()) == ["k1", "k3"] and store.get("k3") == {"v": 3}
        store.put({"k9": {"v": 9}})
        assert store.get("k9") == {"v": 9}
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == 3
