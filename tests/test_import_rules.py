"""Imports run one way (docs/architecture.md, "Import rules").

Every module under ``agentic_retriever/`` and ``agent/`` is parsed with `ast`; every import is collected
(``import x`` and ``from x import y``, relative ones resolved, those inside functions included) as the full
dotted name of what it imports (``from agentic_retriever import index`` -> ``agentic_retriever.index``), and
checked against the rules:

1. `agent` reaches retrieval only through the client protocol and shared types: from `agentic_retriever`
   it imports only the modules in `AGENT_MAY_IMPORT`.
2. `agentic_retriever` never imports `agent`, except the orchestrators (`ORCHESTRATORS`) and the one mining
   seam, `agentic_retriever.mining.environment`, which imports only from `agent.env`.
3. No module imports `agentic_retriever.cli`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentic_retriever", "agent")

#: What `agent` may import from `agentic_retriever`: the client protocol, shared types and shared helpers.
AGENT_MAY_IMPORT = (
    "agentic_retriever.client",    # the retrieval-client protocol (in-process or HTTP)
    "agentic_retriever.corpus",    # shared types: Passage, ScoredPassage
    "agentic_retriever.llm",       # generation backends and the shared llm.device helpers
    "agentic_retriever.eval",      # QA metrics
    "agentic_retriever.jsonl",
    "agentic_retriever.defaults",
    "agentic_retriever.curves",    # shared helper: training curves
    "agentic_retriever.fingerprint",  # shared helper: content fingerprints of models for cache keys
    "agentic_retriever.encoder",   # shared model: embeds an agent's queries (query diversity, when-to-search Eq. 8)
    "agentic_retriever.qa_sources",  # shared reader: QA sets in FlashRAG, Search-R1 and hub form
    "agentic_retriever.precision",  # shared helper: what each role computes in (auto, native)
    "agentic_retriever.sessions",  # shared helper: child processes in sessions of their own (verl runs)
    "agentic_retriever.writer_lock",  # shared helper: one writer per artifact (trajectory files)
)
#: Modules of `agentic_retriever` that may import anything from `agent`: they drive both sides.
ORCHESTRATORS = ("agentic_retriever.cli", "agentic_retriever.commands", "agentic_retriever.demo", "agentic_retriever.loop")
#: The one mining module that imports the agent, and what it may import from it.
MINING_SEAM = "agentic_retriever.mining.environment"
SEAM_MAY_IMPORT = ("agent.env",)
CLI = "agentic_retriever.cli"


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


def agent_violations(imports: list[Import]) -> list[Import]:
    """Rule 1: `agent` imports from `agentic_retriever` only the client protocol, shared types and helpers."""
    return [i for i in imports if _under(i.module, "agent") and _under(i.name, "agentic_retriever")
            and i.name != "agentic_retriever" and not _under(i.name, AGENT_MAY_IMPORT)]


def retriever_violations(imports: list[Import]) -> list[Import]:
    """Rule 2: `agentic_retriever` imports `agent` only in the orchestrators and, from `agent.env`, in the seam."""
    bad = []
    for i in imports:
        if not (_under(i.module, "agentic_retriever") and _under(i.name, "agent")) or _under(i.module, ORCHESTRATORS):
            continue
        if i.module == MINING_SEAM and _under(i.name, SEAM_MAY_IMPORT):
            continue
        bad.append(i)
    return bad


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


def test_agent_reaches_retrieval_only_through_the_client_and_shared_types(imports):
    bad = agent_violations(imports)
    assert not bad, _report(f"agent/ may import from agentic_retriever only {', '.join(AGENT_MAY_IMPORT)}", bad)


def test_agentic_retriever_imports_the_agent_only_in_orchestrators_and_the_mining_seam(imports):
    bad = retriever_violations(imports)
    assert not bad, _report(f"agentic_retriever/ imports agent only in {', '.join(ORCHESTRATORS)} and in "
                            f"{MINING_SEAM} (from {', '.join(SEAM_MAY_IMPORT)} only)", bad)


def test_nothing_imports_the_cli(imports):
    bad = cli_violations(imports)
    assert not bad, _report(f"no module imports {CLI}", bad)


def test_the_mining_seam_exists_and_imports_the_agent_through_agent_env(imports):
    seam = [i.name for i in imports if i.module == MINING_SEAM and _under(i.name, "agent")]
    assert seam and all(_under(name, SEAM_MAY_IMPORT) for name in seam), seam


def test_the_checker_catches_violations(tmp_path):
    files = {
        "agent/__init__.py": "",
        "agent/env.py": "from agentic_retriever.client import RetrievalClient\n",
        "agent/dialects/__init__.py": "from agentic_retriever import index\n",
        "agent/dialects/base.py": (
            "from agentic_retriever.corpus import ScoredPassage\n"
            "def f():\n"
            "    from agentic_retriever.index.base import ScoredPassage\n"
            "    import agentic_retriever.training.curves\n"),
        "agentic_retriever/__init__.py": "",
        "agentic_retriever/cli.py": "from agent.rollouts import run_rollout_job\n",
        "agentic_retriever/mining/__init__.py": "",
        "agentic_retriever/mining/environment.py": "from agent.env import rollout\nfrom agent import trajectory\n",
        "agentic_retriever/mining/rounds.py": (
            "from .environment import rollout\n"
            "def g():\n"
            "    from agent.env import Prefix\n"
            "    from ..cli import main\n"),
        "agentic_retriever/mining/deep/x.py": "from ... import cli\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = list(all_imports(tmp_path))

    assert [str(i) for i in agent_violations(found)] == [
        "agent/dialects/__init__.py:1 -> agentic_retriever.index",
        "agent/dialects/base.py:3 -> agentic_retriever.index.base.ScoredPassage",
        "agent/dialects/base.py:4 -> agentic_retriever.training.curves",
    ]
    assert [str(i) for i in retriever_violations(found)] == [
        "agentic_retriever/mining/environment.py:2 -> agent.trajectory",
        "agentic_retriever/mining/rounds.py:3 -> agent.env.Prefix",
    ]
    assert [str(i) for i in cli_violations(found)] == [
        "agentic_retriever/mining/deep/x.py:1 -> agentic_retriever.cli",
        "agentic_retriever/mining/rounds.py:4 -> agentic_retriever.cli.main",
    ]
    assert "agent/dialects/base.py:3 -> agentic_retriever.index.base.ScoredPassage" in _report("rule", agent_violations(found))


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
