"""The import paths of 0.1 that moved into the layers keep working for one release (`agentic_retriever._moved`)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest

from agentic_retriever._moved import MOVED_MODULES, MOVED_NAMES, new_path
from tests.test_import_rules import all_imports, imports_of, module_name

ROOT = Path(__file__).resolve().parents[1]


def _import_warning(old: str):
    sys.modules.pop(old, None)  # an earlier test may have imported it: the warning comes with the first import
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    return module, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_is_the_new_module_with_a_warning_naming_both(old):
    module, messages = _import_warning(old)
    new = importlib.import_module(MOVED_MODULES[old])
    if old in MOVED_NAMES:  # a stand-in that forwards: the module lost names to another one
        assert all(getattr(module, name) is getattr(new, name) for name in new.__all__)
    else:
        assert module is new
    assert any(old in m and MOVED_MODULES[old] in m for m in messages), messages


def test_a_submodule_of_a_moved_package_is_one_module_under_both_names():
    """Found by the path finder under the old name, the file would run a second time: two classes of one name."""
    old, _ = _import_warning("agentic_retriever.llm.transformers")
    from agentic_retriever.base.llm.transformers import TransformersLLM

    assert old.TransformersLLM is TransformersLLM and old.__spec__.name == "agentic_retriever.base.llm.transformers"
    from agentic_retriever.base.llm.protocol import LLM as new_llm
    from agentic_retriever.llm.base import LLM  # the module renamed inside a moved package

    assert LLM is new_llm


def test_patching_the_old_path_patches_the_code_that_runs():
    _import_warning("agentic_retriever.jsonl")
    from agentic_retriever.base import jsonl

    with mock.patch("agentic_retriever.jsonl.write_json") as patched:
        assert jsonl.write_json is patched


@pytest.mark.parametrize(("old", "name"), [(old, name) for old, names in MOVED_NAMES.items() for name in names])
def test_a_name_that_left_its_module_is_still_found_there_with_a_warning(old, name):
    module, _ = _import_warning(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = getattr(module, name)
    assert found is getattr(importlib.import_module(MOVED_NAMES[old][name]), name)
    assert any(f"{old}.{name}" in str(w.message) for w in caught)
    assert module.__doc__ and hasattr(module, "RetrievalConfig" if "client" in old else "stable_hash")


def test_python_dash_m_on_the_old_cli_path_runs_the_cli(tmp_path):
    done = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m", "agentic_retriever.cli",
                           "index", "search", "--index", str(tmp_path / "none"), "--queries", "q"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and "is not a complete index" in done.stderr, done.stderr[-2000:]
    assert "agentic_retriever.cli moved to agentic_retriever.app.cli" in done.stderr


def test_a_path_that_never_existed_still_fails_to_import():
    assert new_path("agentic_retriever.index") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("agentic_retriever.llm.no_such_backend")


def test_nothing_of_ours_imports_an_old_path():
    """The packages, tests, benchmarks and docs' code use the new paths: the old ones are for users' code only."""
    found = list(all_imports(ROOT))
    for folder in ("tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += imports_of(path.read_text(encoding="utf-8"), module_name(path, ROOT),
                                path.name == "__init__.py", str(path.relative_to(ROOT)))
    old = [str(i) for i in found if new_path(i.name) is not None and i.module != "tests.test_moved_paths"]
    assert not old, "\n".join(old)
