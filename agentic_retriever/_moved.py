"""The import paths of 0.1 that moved when the package took its three layers (docs/architecture.md, "Layers"), kept
working for one release: importing an old path gives the module at its new place, with a DeprecationWarning naming
it. They go in 0.2.

An old path is the same module object as the new one (`sys.modules` holds both names), so ``mock.patch`` on either
patches the code that runs. Four names also changed module: importing them from their old module still works
through a stand-in of that module that warns and forwards (`MOVED_NAMES`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

#: Old module (or package) path -> its new path; a package's submodules follow it.
MOVED_MODULES = {
    **{f"agentic_retriever.{name}": f"agentic_retriever.base.{name}" for name in (
        "client", "corpus", "curves", "data", "defaults", "encoder", "fingerprint", "hf_checkpoints", "jsonl", "llm",
        "memory_release", "precision", "qa_sources", "session_guard", "sessions", "writer_lock")},
    "agentic_retriever.llm.base": "agentic_retriever.base.llm.protocol",
    "agentic_retriever.eval.qa": "agentic_retriever.base.qa_metrics",
    **{f"agentic_retriever.{name}": f"agentic_retriever.app.{name}" for name in ("cli", "commands", "demo", "loop")},
    "agentic_retriever.config": "agentic_retriever.app.config_loader",
}
#: Names that left their module: old module -> {name: the module that now holds it}.
MOVED_NAMES = {
    "agentic_retriever.client": {"LocalRetrievalClient": "agentic_retriever.retrieval",
                                 "open_client": "agentic_retriever.retrieval",
                                 "SearchConfig": "agentic_retriever.retrieval"},
    "agentic_retriever.fingerprint": {"index_identity": "agentic_retriever.index.identity"},
}
REMOVED_IN = "0.2"


def new_path(old: str) -> str | None:
    """Where the module of 0.1 called `old` is now (the longest moved prefix decides), None if it did not move."""
    for prefix in sorted(MOVED_MODULES, key=len, reverse=True):
        if old == prefix or old.startswith(prefix + "."):
            return MOVED_MODULES[prefix] + old[len(prefix):]
    return None


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path goes in {REMOVED_IN}", DeprecationWarning, stacklevel=3)


class _Forwarding(types.ModuleType):
    """An old module whose names now live in two modules: each attribute read from the one that holds it."""

    def __init__(self, old: str, module: types.ModuleType, moved: dict[str, str]):
        super().__init__(old, module.__doc__)
        self._module, self._moved = module, moved

    def __getattr__(self, name: str):
        if name.startswith("__"):
            return getattr(self._module, name)
        holder = self._moved.get(name)
        if holder is None:
            return getattr(self._module, name)
        _warn(f"{self.__name__}.{name}", f"{holder}.{name}")
        return getattr(importlib.import_module(holder), name)

    def __dir__(self):
        return sorted(set(dir(self._module)) | set(self._moved))


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of the old paths (`MOVED_MODULES`) with the modules at their new ones."""

    def find_spec(self, fullname, path=None, target=None):
        new = new_path(fullname)
        found = importlib.util.find_spec(new) if new is not None else None  # imports its parents, not the module
        if found is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=found.submodule_search_locations is not None)

    def create_module(self, spec):
        new = new_path(spec.name)
        _warn(spec.name, new)
        module = importlib.import_module(new)
        if spec.name in MOVED_NAMES:
            return _Forwarding(spec.name, module, MOVED_NAMES[spec.name])
        spec.loader_state = module.__spec__  # the import system sets the module's __spec__ to this one: restored below
        return module

    def get_code(self, fullname: str):
        """What ``python -m OLD`` runs: the module at its new path as ``__main__`` (``python -m
        agentic_retriever.cli`` runs the CLI as before)."""
        new = new_path(fullname)
        _warn(fullname, new)
        return compile(f"import runpy; runpy.run_module({new!r}, run_name='__main__', alter_sys=True)",
                       f"<{fullname}, moved to {new}>", "exec")

    def exec_module(self, module) -> None:
        """Nothing to run (the module ran under its new path); the module keeps the spec of its new path."""
        if module.__spec__.loader_state is not None:
            module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Put the finder first on `sys.meta_path` (before the path finder, which would load a moved package's files a
    second time under the old name), once."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
