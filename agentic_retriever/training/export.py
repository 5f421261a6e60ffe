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

The folder is written to a temporary sibling and renamed, so it is complete or absent.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from ..encoder import SEPARATOR, EncoderSettings, save_model_settings
from ..jsonl import write_json

__all__ = ["MANIFEST_FILE", "model_card", "save_trained_encoder"]

MANIFEST_FILE = "train_manifest.json"


def save_trained_encoder(model, settings: EncoderSettings, out: str | Path, manifest: dict,
                         extras: Callable[[Path], object] | None = None) -> Path:
    """Save `model` (a SentenceTransformer) with `settings`, the manifest and the model card to `out`;
    `extras(folder)` may add files (the curves) before the rename."""
    out = Path(out)
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
        ("loss", _loss_text(run)),
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
