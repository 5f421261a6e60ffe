"""The three layers, checked by folder (docs/architecture.md, "Layers").

Every module under ``agentic_retriever/`` and ``agent/`` is parsed with `ast`; every import is collected
(``import x`` and ``from x import y``, relative ones resolved, those inside functions included) as the full
dotted name of what it imports (``from agentic_retriever import index`` -> ``agentic_retriever.index``), and
checked against the rules:

1. Imports point down or sideways within a layer, never up. The layers, by folder: the shared base
   (``agentic_retriever/base/``, with the package's root); above it, beside each other, the retriever's side (the
   rest of ``agentic_retriever/``) and the agent (``agent/``); on top the application (``agentic_retriever/app/``).
2. The two sides of the middle layer meet at two seams only (`SEAMS`): the agent opens a retriever through
   `agentic_retriever.retrieval`, and mining continues the agent through `agentic_retriever.mining.environment`,
   which imports `agent.env` alone.
3. No module imports the CLI.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentic_retriever", "agent")

BASE, RETRIEVER, AGENT, APP = "base", "retriever", "agent", "app"
#: Each layer's height: an import may reach its own height or below.
HEIGHT = {BASE: 0, RETRIEVER: 1, AGENT: 1, APP: 2}
#: The package's root (its version, the table of moved import paths) belongs to the base.
PACKAGE_ROOT = ("agentic_retriever.__version__", "agentic_retriever._moved")
#: Where the retriever's side and the agent meet: (importing module or package, what it may import from the other
#: side).
SEAMS = (
    ("agent", "agentic_retriever.retrieval"),                      # the agent opens a retriever (in process or HTTP)
    ("agentic_retriever.mining.environment", "agent.env"),        # mining continues the agent's trajectories
)
CLI = "agentic_retriever.app.cli"


def layer(name: str) -> str:
    """The layer of the module (or the name inside it) `name`, by the folder it lives in."""
    if name == "agentic_retriever" or _under(name, ("agentic_retriever.base", *PACKAGE_ROOT)):
        return BASE
    if _under(name, "agentic_retriever.app"):
        return APP
    return AGENT if _under(name, "agent") else RETRIEVER


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. "agent.env"
    path: str    # its file, relative to the root
    line: int
    name: str    # what it imports, absolute, e.g. "agentic_retriever.index.base.ScoredPassage"

    def __str__(self) -> str:
        return f"{self.path}:{self.line} -> {self.name}"


def _under(name: str, prefixes: tuple[str, ...] | str) -> bool:
    """Whether the dotted `name` is one of `prefixes` or inside one of them."""
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool, path: str = "<string>") -> Iterator[Import]:
    """Every import in `source` (the module `module`), as absolute dotted names."""
    package = module if is_package else module.rpartition(".")[0]
    nodes = [n for n in ast.walk(ast.parse(source, filename=path)) if isinstance(n, ast.Import | ast.ImportFrom)]
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond the top-level package")
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                yield Import(module, path, node.lineno, base if alias.name == "*" else f"{base}.{alias.name}")


def all_imports(root: Path) -> Iterator[Import]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            yield from imports_of(path.read_text(encoding="utf-8"), module_name(path, root), path.name == "__init__.py",
                                  str(path.relative_to(root)))


def upward_imports(imports: list[Import]) -> list[Import]:
    """Rule 1: imports of a higher layer than the importer's."""
    return [i for i in imports if _under(i.name, PACKAGES) and HEIGHT[layer(i.name)] > HEIGHT[layer(i.module)]]


def crossings_outside_the_seams(imports: list[Import]) -> list[Import]:
    """Rule 2: imports between the retriever's side and the agent other than at `SEAMS`."""
    crossing = [i for i in imports
                if _under(i.name, PACKAGES) and {layer(i.module), layer(i.name)} == {RETRIEVER, AGENT}]
    return [i for i in crossing if not any(_under(i.module, where) and _under(i.name, what) for where, what in SEAMS)]


def cli_violations(imports: list[Import]) -> list[Import]:
    """Rule 3: nothing imports the CLI."""
    return [i for i in imports if _under(i.name, CLI) and i.module != CLI]


def _report(rule: str, bad: list[Import]) -> str:
    return f"{rule}; offending imports:\n" + "\n".join(f"  {i}" for i in bad)


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    found = list(all_imports(ROOT))
    assert len({i.module for i in found}) > 50, "the walk found too few modules: wrong root?"
    return found


def test_every_import_points_down_or_within_its_layer(imports):
    bad = upward_imports(imports)
    assert not bad, _report("base < retriever | agent < app: no import reaches a higher layer", bad)


def test_the_retriever_and_the_agent_meet_only_at_the_seams(imports):
    bad = crossings_outside_the_seams(imports)
    assert not bad, _report("between the retriever's side and the agent only " +
                            "; ".join(f"{where} -> {what}" for where, what in SEAMS), bad)


def test_nothing_imports_the_cli(imports):
    bad = cli_violations(imports)
    assert not bad, _report(f"no module imports {CLI}", bad)


def test_each_seam_is_used_and_every_layer_has_modules(imports):
    """A renamed seam or an emptied folder would make the rules above pass vacuously."""
    for where, what in SEAMS:
        assert any(_under(i.module, where) and _under(i.name, what) for i in imports), (where, what)
    assert {layer(i.module) for i in imports} == set(HEIGHT)


def test_the_checker_catches_violations(tmp_path):
    files = {
        "agent/__init__.py": "",
        "agent/env.py": ("from agentic_retriever.base.client import RetrievalClient\n"
                         "from agentic_retriever import __version__\n"),
        "agent/rollouts.py": "from agentic_retriever.retrieval import open_client\n",
        "agent/dialects/__init__.py": "from agentic_retriever import index\n",
        "agent/dialects/base.py": (
            "from agentic_retriever.base.corpus import ScoredPassage\n"
            "def f():\n"
            "    from agentic_retriever.index.base import SearchIndex\n"
            "    import agentic_retriever.app.loop\n"),
        "agentic_retriever/__init__.py": "from . import _moved\n",
        "agentic_retriever/base/__init__.py": "",
        "agentic_retriever/base/jsonl.py": "from ..index import open_index\nfrom .corpus import Passage\n",
        "agentic_retriever/app/cli.py": "from agent.rollouts import run_rollout_job\nfrom ..index import open_index\n",
        "agentic_retriever/mining/__init__.py": "",
        "agentic_retriever/mining/environment.py": "from agent.env import rollout\nfrom agent import trajectory\n",
        "agentic_retriever/mining/rounds.py": (
            "from .environment import rollout\n"
            "def g():\n"
            "    from agent.env import Prefix\n"
            "    from ..app.cli import main\n"),
        "agentic_retriever/mining/deep/x.py": "from ...app import cli\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = list(all_imports(tmp_path))

    assert [str(i) for i in upward_imports(found)] == [
        "agentic_retriever/base/jsonl.py:1 -> agentic_retriever.index.open_index",
        "agentic_retriever/mining/deep/x.py:1 -> agentic_retriever.app.cli",
        "agentic_retriever/mining/rounds.py:4 -> agentic_retriever.app.cli.main",
        "agent/dialects/base.py:4 -> agentic_retriever.app.loop",
    ]
    assert [str(i) for i in crossings_outside_the_seams(found)] == [
        "agentic_retriever/mining/environment.py:2 -> agent.trajectory",
        "agentic_retriever/mining/rounds.py:3 -> agent.env.Prefix",
        "agent/dialects/__init__.py:1 -> agentic_retriever.index",
        "agent/dialects/base.py:3 -> agentic_retriever.index.base.SearchIndex",
    ]
    assert [str(i) for i in cli_violations(found)] == [
        "agentic_retriever/mining/deep/x.py:1 -> agentic_retriever.app.cli",
        "agentic_retriever/mining/rounds.py:4 -> agentic_retriever.app.cli.main",
    ]
    assert "agent/dialects/base.py:3 -> agentic_retriever.index.base.SearchIndex" in _report(
        "rule", crossings_outside_the_seams(found))


def test_every_import_of_our_own_modules_resolves(imports):
    """Imports inside functions run only when called: a module that moved must not leave one behind."""
    import importlib

    def missing(module: str) -> bool:
        """Whether `module` (or a package on its path) does not exist; a missing third-party dependency raises."""
        try:
            importlib.import_module(module)
            return False
        except ModuleNotFoundError as error:
            if error.name and _under(module, error.name):
                return True
            raise

    def resolves(name: str) -> bool:
        parent, _, leaf = name.rpartition(".")
        return not missing(name) or (not missing(parent) and hasattr(importlib.import_module(parent), leaf))

    broken = [i for i in imports if _under(i.name, PACKAGES) and not resolves(i.name)]
    assert not broken, _report("imports of modules or names that do not exist", broken)
