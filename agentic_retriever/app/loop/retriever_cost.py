"""What the loop's retriever costs by its size: its shape, the throughputs of `loop plan` scaled to it, and the GPU
memory it takes in the service and in training.

The plan's encoding and training throughputs are e5-base-v2's, the paper's retriever ("Agentic-R: Learning to
Retrieve for Agentic Search", arXiv 2601.11888, section 5.1); `plan._retriever_rates` moves them to another
backbone by its compute: a transformer's forward pass costs about 2 FLOPs per parameter outside the embedding
tables per token (Kaplan et al., "Scaling Laws for Neural Language Models", arXiv 2001.08361, section 2.1;
attention over ~150-token passages adds a few percent, left out). LoRA skips the weight gradients of the frozen
model: Hu et al. ("LoRA", arXiv 2106.09685, section 4.2) measured 25% more training throughput on GPT-3 175B.

Memory per GPU, each term with its source:

* model states: full fine-tuning with AdamW in mixed precision as the trainer runs it (fp32 weights, fp32
  gradients, two fp32 moments: 16 bytes a parameter); under DeepSpeed ZeRO-2 on G GPUs 2 + 14 / G bytes (Rajbhandari
  et al., "ZeRO", arXiv 1910.02054, section 5.1 with K = 12: fp16 weights whole, gradients and optimiser states
  partitioned); LoRA: the frozen weights in fp32 as the trainer loads them (4 bytes) and 16 bytes for each adapter
  parameter;
* activations: Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198,
  section 4.1) count 34 x hidden bytes a token a layer in half precision, without the attention scores (SDPA and
  flash attention keep none). With gradient checkpointing each layer keeps its input (the residual stream, fp32
  under autocast: 4 x hidden bytes a token) and one layer at a time is recomputed. The tokens in flight are the
  step's texts (B queries of `QUERY_TOKENS` and B x (1 + negatives) passages of the mining plan's
  ``passage_tokens``), or with the cached loss (GradCache) one mini-batch of passages.

    shape = encoder_shape("Qwen/Qwen3-Embedding-0.6B")
    shape.parameters, shape.body_parameters      # 595,776,512 and 440,467,456
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KNOWN_SHAPES", "QUERY_TOKENS", "REFERENCE", "EncoderShape", "encoder_shape", "retriever_memory"]

#: The retriever the plan's throughputs were derived for.
REFERENCE = "intfloat/e5-base-v2"
#: Tokens of a composed training query ("Q [SEP] q", with a decoder embedder's instruction).
QUERY_TOKENS = 64
#: Bytes a token a layer of activations in half precision, without attention scores (Korthikanti et al.).
_ACTIVATION_BYTES_PER_HIDDEN = 34
_GIB = 2**30

#: The configs (config.json) of the encoders a plan is often asked about, so that a plan needs no download: the
#: models' own files on the Hugging Face hub.
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "intfloat/e5-base-v2": {"model_type": "bert", "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
                            "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
                            "type_vocab_size": 2},
    "Qwen/Qwen3-Embedding-0.6B": {"model_type": "qwen3", "vocab_size": 151669, "hidden_size": 1024,
                                  "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                                  "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True},
    "Qwen/Qwen3-Embedding-4B": {"model_type": "qwen3", "vocab_size": 151665, "hidden_size": 2560,
                                "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
                                "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True},
    "Qwen/Qwen3-Embedding-8B": {"model_type": "qwen3", "vocab_size": 151665, "hidden_size": 4096,
                                "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                                "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False},
}


@dataclass(frozen=True)
class EncoderShape:
    """An encoder's size: its parameters (all, and in the embedding tables), hidden width and layers, and the
    linear layers' (name, inputs, outputs) for counting a LoRA adapter; `source` says where the config came from."""

    name: str
    parameters: int
    embedding_parameters: int
    hidden: int
    layers: int
    linear_layers: tuple[tuple[str, int, int], ...]
    source: str

    @property
    def body_parameters(self) -> int:
        """The parameters a token's forward pass multiplies (all but the embedding tables)."""
        return self.parameters - self.embedding_parameters

    def adapter_parameters(self, rank: int, target_modules: list[str]) -> int:
        """A LoRA adapter's parameters: rank x (inputs + outputs) of each targeted linear layer (PEFT's
        ``all-linear`` or layer names, matched as the last part of a layer's dotted name)."""
        every = "all-linear" in target_modules
        return sum(rank * (fan_in + fan_out) for name, fan_in, fan_out in self.linear_layers
                   if every or name.rsplit(".", 1)[-1] in target_modules)


def _transformer_config_dir(folder: Path) -> Path:
    """Where a sentence-transformers folder keeps its transformer's config.json (the folder, or its first module's)."""
    if (folder / "config.json").is_file():
        return folder
    modules = folder / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text(encoding="utf-8")):
            if (folder / module.get("path", "") / "config.json").is_file():
                return folder / module["path"]
    raise FileNotFoundError(f"{folder}: no config.json of a transformer (neither in the folder nor in a module of "
                            "its modules.json)")


def encoder_shape(model: str) -> EncoderShape:
    """The shape of the encoder `model` names: ``default`` (the embedded MiniLM), a local folder (its config, or an
    adapter folder's base), one of `KNOWN_SHAPES`, or any other hub name (its config.json, downloaded by
    transformers). Parameters are counted on the meta device: nothing is allocated."""
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoModel

    from agentic_retriever.base.adapters import adapter_base
    from agentic_retriever.base.defaults import resolve_model_name

    path = resolve_model_name(model)
    if Path(path).is_dir():
        base = adapter_base(path)
        if base is not None:
            return encoder_shape(base)
        config, source = AutoConfig.from_pretrained(_transformer_config_dir(Path(path))), f"the config of {path}"
    elif path in KNOWN_SHAPES:
        known = dict(KNOWN_SHAPES[path])
        config = AutoConfig.for_model(known.pop("model_type"), **known)
        source = f"{path}'s config.json (its sizes in retriever_cost.KNOWN_SHAPES)"
    else:
        try:
            config, source = AutoConfig.from_pretrained(path), f"{path}'s config.json"
        except OSError as error:
            raise ValueError(f"loop plan: the retriever {model!r} is neither a folder here, nor one of "
                             f"{', '.join(KNOWN_SHAPES)}, nor a config transformers could fetch ({error})") from error
    with torch.device("meta"):
        body = AutoModel.from_config(config)
    embedding = sum(p.numel() for m in body.modules() if isinstance(m, nn.Embedding) for p in m.parameters())
    linear = tuple((name, m.in_features, m.out_features) for name, m in body.named_modules()
                   if isinstance(m, nn.Linear))
    return EncoderShape(model, sum(p.numel() for p in body.parameters()), embedding, config.hidden_size,
                        config.num_hidden_layers, linear, source)


def _gib(count: float) -> float:
    return count / _GIB


def retriever_memory(shape: EncoderShape, job, gpus: int, corpus_passages: int) -> dict[str, Any]:
    """GPU memory of the loop's retriever (GiB): the service's query encoder on GPU 0 and its Flat index in fp16 over
    `gpus` GPUs (``loop.service.index_gpu: on``; ``service_gib``: both, on GPU 0), and training per GPU for full
    fine-tuning (DDP and ZeRO-2) and LoRA
    at the config's rank (16 when the config trains fully), with the config's batch, negatives, cached loss and
    checkpointing; ``chosen`` names the row the config runs."""
    train = job.train
    negatives = job.mine.mining.selection.num_negatives
    passages_per_query = 1 + negatives
    texts = train.per_device_batch_size * (1 + passages_per_query)
    if train.cached and train.mini_batch_size < texts:
        tokens = train.mini_batch_size * job.mine.plan.passage_tokens
        in_flight = f"one cached-loss mini-batch: {train.mini_batch_size} of the step's {texts} texts"
    else:
        tokens = train.per_device_batch_size * (QUERY_TOKENS + passages_per_query * job.mine.plan.passage_tokens)
        in_flight = f"{train.per_device_batch_size} queries x (1 + {passages_per_query}) texts"
    per_layer = _ACTIVATION_BYTES_PER_HIDDEN * shape.hidden * tokens
    if train.gradient_checkpointing:
        activations = 4 * shape.hidden * tokens * shape.layers + per_layer
    else:
        activations = per_layer * shape.layers
    rank = train.lora.rank or 16
    adapter = shape.adapter_parameters(rank, list(train.lora.target_modules))
    states = {"full (DDP)": 16 * shape.parameters,
              f"full (ZeRO-2 over {gpus})": (2 + 14 / gpus) * shape.parameters,
              f"LoRA r={rank} ({', '.join(train.lora.target_modules)})": 4 * shape.parameters + 16 * adapter}
    names = list(states)
    chosen = names[2] if train.lora.rank else names[1] if train.deepspeed else names[0]
    dim = shape.hidden
    return {"encoder": shape.name, "parameters": shape.parameters, "body_parameters": shape.body_parameters,
            "adapter_parameters": adapter, "dim": dim, "source": shape.source,
            "service_encoder_gib": _gib(2 * shape.parameters),
            "index_per_gpu_gib": _gib(corpus_passages * dim * 2 / gpus),
            "service_gib": _gib(2 * shape.parameters + corpus_passages * dim * 2 / gpus),
            "tokens_in_flight": tokens, "in_flight": in_flight,
            "checkpointing": train.gradient_checkpointing, "activations_gib": _gib(activations),
            "training": {name: {"states_gib": _gib(value), "total_gib": _gib(value + activations)}
                         for name, value in states.items()},
            "chosen": chosen}
