"""The trained retriever as a drop-in encoder folder (issue: "Export: a drop-in encoder").

The folder is a plain sentence-transformers folder: ``SentenceTransformer(path)`` loads it, and Hugging
Face ``AutoModel.from_pretrained(path)`` loads its transformer (the weights sit at the root), without our code.
Beside the weights it holds:

* the query/passage prefixes as sentence-transformers prompts (``encode_query`` / ``encode_document`` apply
  them) and in ``agentic_retriever.json`` with the query composition mode, which our index builder, server
  and agent read and apply (``Q [SEP] q`` for an Agentic-R retriever);
* ``README.md``, a model card: base model, data statistics, training settings, how to compose queries;
* ``train_manifest.json`` (everything about the run, with the held-out ``selection``: metric, pool, the
  score per checkpoint and which was kept, ``base`` or ``epoch-k``) and the training curves.

The folder is written to a temporary sibling and renamed, so it is complete or absent. `retriever train` writes
it at the end of training; `retriever export` (`export_checkpoint`) writes it from any checkpoint of a run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..encoder import SEPARATOR, SETTINGS_FILE, Encoder, EncoderConfig, EncoderSettings, save_model_settings
from ..jsonl import read_json, write_json

__all__ = ["MANIFEST_FILE", "RetrieverExportConfig", "export_checkpoint", "model_card", "save_trained_encoder"]

MANIFEST_FILE = "train_manifest.json"


def save_trained_encoder(model, settings: EncoderSettings, out: str | Path, manifest: dict,
                         extras: Callable[[Path], object] | None = None) -> Path:
    """Save `model` (a SentenceTransformer) with `settings`, the manifest and the model card to `out`;
    `extras(folder)` may add files (the curves) before the rename."""
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
    write_json(tmp / MANIFEST_FILE, manifest)
    (tmp / "README.md").write_text(model_card(settings, manifest), encoding="utf-8")
    if extras is not None:
        extras(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


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


def export_checkpoint(config: RetrieverExportConfig) -> Path:
    """Write the drop-in folder of `config.checkpoint` to `config.out`: the weights, the query/passage conventions,
    a manifest (``exported_from``, the updates the checkpoint had made) and the model card."""
    from sentence_transformers import SentenceTransformer

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
    return save_trained_encoder(SentenceTransformer(str(checkpoint), device="cpu"), settings, config.out, manifest)


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


def _selection_text(selection: dict | None) -> str:
    if not selection:
        return "none (the last update is exported)"
    scores = ", ".join(f"{name} {score:.4f}" for name, score in selection.get("per_checkpoint", {}).items())
    kept = selection.get("kept")
    verdict = "**the base encoder, unchanged** (no epoch beat it)" if kept == "base" else f"`{kept}`"
    return (f"held-out {selection.get('metric')} on {selection.get('questions_judged', '?')} training questions "
            f"never trained on (pool {selection.get('pool')}/question): {scores}; kept {verdict}")


def model_card(settings: EncoderSettings, manifest: dict) -> str:
    """A Hugging Face model card (YAML header + markdown) for the trained retriever."""
    run = manifest.get("settings", {})
    data = manifest.get("data", {})
    composition = {
        "query": "the search query as is",
        "question_sep_query": f"the original question, `{SEPARATOR.strip()}`, then the search query "
                              f"(`Q{SEPARATOR}q`, Agentic-R Eq. 4)",
        "history": f"the question and every query so far joined by `{SEPARATOR.strip()}` (Agentic-R Eq. 6)",
    }[settings.composition]
    example_query = f"{settings.query_prefix}" + ("Who founded the company that makes the iPhone?"
                                                  f"{SEPARATOR}Apple founders" if settings.composition != "query"
                                                  else "Apple founders")
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

model = SentenceTransformer("PATH")
queries = model.encode_query([{example_query!r}])   # the query prefix is applied as the "query" prompt
passages = model.encode_document(['"Apple Inc."\\nApple was founded by Steve Jobs, ...'])
```

Compose queries as the model was trained ({composition}). agentic-retriever's index builder, retrieval
server and agents read `agentic_retriever.json` and compose them for you; its server accepts the original
questions beside the queries (`"questions": [...]` in `/retrieve`).
"""
