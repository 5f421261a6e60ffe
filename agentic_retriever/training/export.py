"""The trained retriever as a drop-in encoder folder (issue: "Export: a drop-in encoder").

The folder is a plain sentence-transformers folder: ``SentenceTransformer(path)`` loads it, and Hugging
Face ``AutoModel.from_pretrained(path)`` loads its transformer (the weights sit at the root), without our code.
Beside the weights it holds:

* the query/passage prefixes as sentence-transformers prompts (``encode_query`` / ``encode_document`` apply
  them) and in ``agentic_retriever.json`` with the query composition mode, which our index builder, server
  and agent read and apply (``Q [SEP] q`` for an Agentic-R retriever);
* ``README.md``, a model card: base model, data statistics, training settings, how to compose queries;
* ``train_manifest.json`` (everything about the run, with the held-out ``selection``: metric, pool, the
  score per checkpoint and which was kept, ``base`` or ``epoch-k``; written last, with the size of every other
  file, so `read_whole_export` can check a folder before it is reused) and the training curves.

The folder is written to a temporary sibling and renamed in (the old one renamed aside first, then removed:
`jsonl.replace_folder`), so it is whole or absent, and one process writes it at a time (``OUT.lock``). `retriever train` writes
it at the end of training; `retriever export` (`export_checkpoint`) writes it from any checkpoint of a run and,
with ``push_to_hub``, then uploads the folder as it is to a Hugging Face Hub model repository (network needed).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentic_retriever.base.encoder import (SEPARATOR, SETTINGS_FILE, Encoder, EncoderConfig, EncoderSettings,
                                            save_model_settings)
from agentic_retriever.base.jsonl import read_json, replace_folder, write_json
from agentic_retriever.base.writer_lock import WriterLock, lock_beside

__all__ = ["MANIFEST_FILE", "RetrieverExportConfig", "export_checkpoint", "model_card", "push_folder_to_hub",
           "read_whole_export", "save_trained_encoder"]

MANIFEST_FILE = "train_manifest.json"

log = logging.getLogger(__name__)


def save_trained_encoder(model, settings: EncoderSettings, out: str | Path, manifest: dict,
                         extras: Callable[[Path], object] | None = None, model_id: str = "") -> Path:
    """Save `model` (a SentenceTransformer) with `settings`, the manifest and the model card to `out`;
    `extras(folder)` may add files (the curves) before the rename. `model_id` is the name the card's example
    loads the model by (a Hub repository; default: a placeholder for the folder's path)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise FileExistsError(f"{out} exists and is not an exported retriever (no {MANIFEST_FILE}); it is left "
                              "untouched: choose another output folder or remove it")
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.prompts = {name: prefix for name, prefix in (("query", settings.query_prefix),
                                                       ("document", settings.passage_prefix)) if prefix}
    model.save(str(tmp), create_model_card=False)
    save_model_settings(tmp, settings)
    (tmp / "README.md").write_text(model_card(settings, manifest, model_id), encoding="utf-8")
    if extras is not None:
        extras(tmp)
    files = {str(path.relative_to(tmp)): path.stat().st_size for path in sorted(tmp.rglob("*")) if path.is_file()}
    write_json(tmp / MANIFEST_FILE, manifest | {"files": files})  # last: it lists what the folder holds
    return replace_folder(tmp, out)


def read_whole_export(out: str | Path) -> dict | None:
    """The manifest of the exported folder `out` when the folder holds every file its manifest lists, at the
    recorded size; None when it has no readable manifest or lacks a file (an export predating the file list is
    checked for its weights and settings). A folder reused as finished is checked, not trusted."""
    out = Path(out)
    try:
        manifest = read_json(out / MANIFEST_FILE)
    except (OSError, ValueError):
        return None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        files = None
        needed = [SETTINGS_FILE, "modules.json"]
        if not any((out / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")):
            return None
    else:
        needed = list(files)
    for name in needed:
        path = out / name
        if not path.is_file() or files is not None and path.stat().st_size != files[name]:
            log.warning("%s is not a whole exported retriever: %s is missing or has another size than its manifest "
                        "records", out, name)
            return None
    return manifest


@dataclass
class RetrieverExportConfig:
    """Settings of `agentic-retriever retriever export` (section ``retriever_export``)."""

    checkpoint: str = field(default="", metadata={
        "help": "a checkpoint of `retriever train` (OUT.checkpoints/checkpoint-N) or any sentence-transformers folder",
        "required": True})
    out: str = field(default="", metadata={"help": "the drop-in encoder folder to write", "required": True})
    encoder: EncoderConfig = field(
        default_factory=lambda: EncoderConfig(model="default", composition="question_sep_query"), metadata={
            "help": "the training run's base encoder: its prefixes and query composition are stored with the "
                    "weights (read from the checkpoint instead when it holds agentic_retriever.json)"})
    push_to_hub: str = field(default="", metadata={
        "help": "after writing OUT, upload it to this Hugging Face Hub model repository (user/name; created if "
                "missing; needs network and a write token)"})
    private: bool = field(default=False, metadata={
        "help": "create the Hub repository as private (else the account's default; an existing repository keeps "
                "its visibility)"})
    hub_token_env: str = field(default="HF_TOKEN", metadata={
        "help": "environment variable holding the Hub token (unset or empty: huggingface_hub's stored login)"})


def export_checkpoint(config: RetrieverExportConfig) -> Path:
    """Write the drop-in folder of `config.checkpoint` to `config.out`: the weights, the query/passage conventions,
    a manifest (``exported_from``, the updates the checkpoint had made) and the model card; then, with
    `config.push_to_hub`, upload that folder to the Hub (`push_folder_to_hub`)."""
    from sentence_transformers import SentenceTransformer

    if config.push_to_hub:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(config.push_to_hub)  # a ValueError before any work
    checkpoint = Path(config.checkpoint)
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"retriever export: checkpoint folder {checkpoint} not found")
    conventions = (EncoderConfig(model=str(checkpoint)) if (checkpoint / SETTINGS_FILE).is_file()
                   else config.encoder)
    settings = Encoder(dataclasses.replace(conventions, precision="fp32", device="cpu")).settings
    state = read_json(checkpoint / "trainer_state.json") if (checkpoint / "trainer_state.json").is_file() else {}
    manifest = {"exported_from": str(checkpoint.resolve()), "base_model": config.encoder.model,
                "encoder_settings": dataclasses.asdict(settings), "updates": state.get("global_step"),
                "log_history": state.get("log_history", [])}
    with WriterLock(lock_beside(config.out), f"the retriever output {config.out}"):
        out = save_trained_encoder(SentenceTransformer(str(checkpoint), device="cpu"), settings, config.out,
                                   manifest, model_id=config.push_to_hub)
    if config.push_to_hub:
        token = os.environ.get(config.hub_token_env) if config.hub_token_env else None
        push_folder_to_hub(out, config.push_to_hub, private=config.private, token=token or None)
    return out


def push_folder_to_hub(folder: str | Path, repo_id: str, private: bool = False, token: str | None = None) -> str:
    """Upload `folder` (an exported retriever: weights, prompts, agentic_retriever.json, manifest, model card,
    curves) as it is to the Hub model repository `repo_id`, creating the repository when missing; return the
    commit's URL. What sentence-transformers' ``push_to_hub(local_model_path=...)`` does, without reloading the
    weights or letting it write another model card. Needs network; `token` None uses huggingface_hub's login."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    api = HfApi(token=token)
    try:
        repo = api.create_repo(repo_id, private=private or None, repo_type="model", exist_ok=True)
        commit = api.upload_folder(repo_id=repo.repo_id, folder_path=str(folder), repo_type="model",
                                   commit_message=f"Upload the agentic-retriever export {folder.name}")
    except Exception:
        log.error("the exported folder %s is complete, but its upload to the Hub repository %s failed", folder,
                  repo_id)
        raise
    url = getattr(commit, "commit_url", None) or str(commit)
    log.info("pushed %s to the Hub repository %s (%s)", folder, repo.repo_id, url)
    return url


def _loss_text(run: dict) -> str:
    cross = " + cross-device" if run.get("gather_across_devices") else ""
    cached = " (GradCache)" if run.get("cached") else ""
    infonce = f"InfoNCE, temperature {run.get('temperature')}, in-batch{cross} negatives{cached}"
    kl = (f"KL to softmax({run.get('soft_label_key')} utility / {run.get('label_temperature')}) over each query's "
          f"own passages (REPLUG, arXiv:2301.12652)")
    if run.get("loss") == "soft_label":
        return kl + f", retriever temperature {run.get('temperature')}"
    if run.get("soft_label_weight"):
        return f"{infonce} + {run.get('soft_label_weight')} x {kl}"
    return infonce


def _parameters_text(parameters: dict | None, lora: dict | None) -> str:
    share = f" ({parameters['trainable_parameters']:,} of {parameters['parameters']:,})" if parameters else ""
    if not lora:
        return f"all (full fine-tuning){share}"
    adapter = (f"LoRA rank {lora['rank']}, alpha {lora['alpha']}, dropout {lora['dropout']} on "
               f"{', '.join(lora['target_modules'])}{share}")
    if lora.get("adapter_exported"):
        return (f"{adapter}; **this folder holds the adapter alone**: loading it needs PEFT and the base model its "
                "adapter_config.json names")
    return f"{adapter}; merged into the weights (a plain folder: no PEFT needed)"


def _selection_text(selection: dict | None) -> str:
    if not selection:
        return "none (the last update is exported)"
    scores = ", ".join(f"{name} {score:.4f}" for name, score in selection.get("per_checkpoint", {}).items())
    kept = selection.get("kept")
    verdict = "**the base encoder, unchanged** (no epoch beat it)" if kept == "base" else f"`{kept}`"
    return (f"held-out {selection.get('metric')} on {selection.get('questions_judged', '?')} training questions "
            f"never trained on (pool {selection.get('pool')}/question): {scores}; kept {verdict}")


def model_card(settings: EncoderSettings, manifest: dict, model_id: str = "") -> str:
    """A Hugging Face model card (YAML header + markdown) for the trained retriever; its example loads the model
    as `model_id` (default: a placeholder PATH)."""
    run = manifest.get("settings", {})
    data = manifest.get("data", {})
    composition = {
        "query": "the search query as is",
        "question_sep_query": f"the original question, `{SEPARATOR.strip()}`, then the search query "
                              f"(`Q{SEPARATOR}q`, Agentic-R Eq. 4)",
        "history": f"the question and every query so far joined by `{SEPARATOR.strip()}` (Agentic-R Eq. 6)",
    }[settings.composition]
    # Without the query prefix: encode_query applies it (the "query" prompt), so the example must not add it too.
    example_query = (f"Who founded the company that makes the iPhone?{SEPARATOR}Apple founders"
                     if settings.composition != "query" else "Apple founders")
    prompt_note = (f"encode_query prepends the query prefix {settings.query_prefix!r} (the \"query\" prompt)"
                   if settings.query_prefix else "this model has no query prefix")
    document_note = (f"encode_document prepends {settings.passage_prefix!r}" if settings.passage_prefix
                     else "no passage prefix")
    header = "\n".join([
        "---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
        "tags: [sentence-transformers, feature-extraction, retrieval, agentic-retriever, agentic-r]",
        f"base_model: {json.dumps(str(manifest.get('base_model', '')))}", "---", ""])
    rows = [
        ("base model", f"`{manifest.get('base_model', '')}`"),
        ("query input", composition),
        ("query prefix / passage prefix", f"`{settings.query_prefix!r}` / `{settings.passage_prefix!r}`"),
        ("pooling, normalisation", f"{settings.pooling}, {'L2' if settings.normalize else 'none'}"),
        ("max length", str(settings.max_length)),
        ("training rows / examples", f"{data.get('rows', '?')} / {data.get('examples', '?')}"),
        ("passages per query (N)", str(manifest.get("passages_per_query", "?"))),
        ("loss", _loss_text(run) if run else "not recorded (exported from a checkpoint)"),
        ("global batch (queries)", str(manifest.get("global_batch_queries", "?"))),
        ("learning rate, epochs, updates", f"{run.get('learning_rate')}, {run.get('epochs')}, {manifest.get('updates')}"),
        ("final training loss", f"{manifest.get('train_loss', float('nan')):.4f}"),
        ("model selection", _selection_text(manifest.get("selection"))),
        ("parameters trained", _parameters_text(manifest.get("parameters"), manifest.get("lora"))),
        ("device", str(manifest.get("device", "?"))),
    ]
    table = "\n".join(["| setting | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])
    return f"""{header}
# Agentic-R-style retriever

A dense retriever trained by agentic-retriever on utility-mined search-agent rounds
(Agentic-R, section 4.1): each query's positive is the passage that led the agent to a correct final answer
and is locally relevant; negatives are the other candidates of that round.

{table}

## Use

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer({(model_id or "PATH")!r})
queries = model.encode_query([{example_query!r}])   # {prompt_note}
passages = model.encode_document(['"Apple Inc."\\nApple was founded by Steve Jobs, ...'])   # {document_note}
```

Compose queries as the model was trained ({composition}). agentic-retriever's index builder, retrieval
server and agents read `agentic_retriever.json` and compose them for you; its server accepts the original
questions beside the queries (`"questions": [...]` in `/retrieve`).
"""
