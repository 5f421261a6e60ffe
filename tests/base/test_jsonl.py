"""JSONL I/O (agentic_retriever/base/jsonl.py): atomic writes leave the mode open() would give under the umask, and
invalid-JSON errors read cleanly."""

from __future__ import annotations

import contextlib
import os
import stat

import pytest

from agentic_retriever.base.jsonl import (DataFormatError, atomic_write, iter_jsonl, read_json, replace_folder,
                                     temp_folder_beside, write_json, write_jsonl)


@contextlib.contextmanager
def umask(value: int):
    previous = os.umask(value)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


UMASKS = [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]


@pytest.mark.parametrize(("mask", "file_mode", "folder_mode"), UMASKS, ids=lambda v: f"{v:04o}")
def test_atomic_writes_get_the_mode_open_would_give_under_the_umask(tmp_path, mask, file_mode, folder_mode):
    with umask(mask):
        write_json(tmp_path / "manifest.json", {"a": 1})
        write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}, {"b": 2}])
        with atomic_write(tmp_path / "deep" / "blob.bin", "wb") as handle:
            handle.write(b"\x00\x01")
        with open(tmp_path / "plain.txt", "w") as handle:  # the reference: what open() gives
            handle.write("x")
        folder = temp_folder_beside(tmp_path / "model")
    assert mode(tmp_path / "plain.txt") == file_mode
    for name in ("manifest.json", "rows.jsonl", "deep/blob.bin"):
        assert mode(tmp_path / name) == file_mode, name
    assert read_json(tmp_path / "manifest.json") == {"a": 1}
    assert [row for _, row in iter_jsonl(tmp_path / "rows.jsonl")] == [{"a": 1}, {"b": 2}]
    assert (tmp_path / "deep" / "blob.bin").read_bytes() == b"\x00\x01"
    assert folder.is_dir() and folder.parent == tmp_path and folder.name.startswith(".model.")
    assert mode(folder) == folder_mode
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == [folder.name], \
        "no temporary file is left beside the written ones"


def test_a_real_writer_replacing_a_private_file_gets_the_umask_mode(tmp_path):
    from agentic_retriever.base.encoder import SETTINGS_FILE, EncoderSettings, save_model_settings

    target = tmp_path / SETTINGS_FILE
    target.write_text("{}")
    target.chmod(0o600)  # what the old mkstemp-based writer left
    settings = EncoderSettings(model="m", query_prefix="query: ", passage_prefix="", composition="query",
                               pooling="mean", normalize=True, max_length=32, fingerprint="f")
    with umask(0o022):
        save_model_settings(tmp_path, settings)
    assert mode(target) == 0o644
    assert read_json(target)["query_prefix"] == "query: "


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "report.json"
    write_json(target, {"old": True})
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write("half")
        raise RuntimeError("interrupted")
    assert read_json(target) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


@pytest.mark.parametrize(("mask", "file_mode", "folder_mode"), UMASKS, ids=lambda v: f"{v:04o}")
def test_a_replaced_folder_gets_new_file_modes_whatever_its_writers_left(tmp_path, mask, file_mode, folder_mode):
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.bin").write_bytes(b"old")
    with umask(mask):
        building = temp_folder_beside(out)
        (building / "nested").mkdir()
        for name in ("model.safetensors", "nested/config.json"):
            (building / name).write_text("x")
            os.chmod(building / name, 0o600)  # as safetensors leaves its weights
        assert replace_folder(building, out) == out
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["model.safetensors", "nested",
                                                                       "nested/config.json"]
    assert mode(out / "model.safetensors") == mode(out / "nested" / "config.json") == file_mode
    assert mode(out) == folder_mode and not building.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model"], "no probe or building folder left"


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_the_converted_default_llm_folder_gets_the_umask_mode(tmp_path, monkeypatch, mask):
    import agentic_retriever.base.defaults as defaults

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"gguf")
    monkeypatch.setenv("AGENTIC_RETRIEVER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(defaults, "smollm2_gguf_path", lambda: gguf)
    monkeypatch.setattr(defaults, "_convert_gguf", lambda source, out: (out / "config.json").write_text("{}"))
    with umask(mask):
        folder = defaults.smollm2_hf_dir()
    assert (folder / "config.json").is_file()
    assert mode(folder) == 0o777 & ~mask
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "the building folder was renamed"


@pytest.mark.parametrize(("line", "reason"), [
    ('{"a": "unterminated', "Unterminated string starting at column 7"),
    ('{"a": "tab\there"}', "Invalid control character at column 11"),
    ('{"a" 1}', "Expecting ':' delimiter at column 6"),
    ('{"a": }', "Expecting value at column 7"),
])
def test_invalid_json_errors_name_the_reason_and_column_once(tmp_path, line, reason):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"ok": 1}\n\n' + line)  # the last line, without a newline (one would end the string)
    with pytest.raises(DataFormatError) as caught:
        list(iter_jsonl(path))
    assert str(caught.value) == f"{path}:3: invalid JSON ({reason})"
    assert caught.value.line == 3
    assert "at at" not in str(caught.value)


def test_read_json_names_the_line_and_column_of_a_broken_document(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text('{\n  "rows": 3,\n  "name": "cut off')
    with pytest.raises(DataFormatError) as caught:
        read_json(path)
    assert str(caught.value) == f"{path}:3: invalid JSON (Unterminated string starting at column 11)"
