"""Bi-encoder for queries and passages: a sentence-transformers model plus the retrieval conventions.

What this module adds to `SentenceTransformer.encode` (which does the batching, length sorting and the
forward pass) is only what is ours:

* prefix conventions by model family (e5: ``query: `` / ``passage: ``; bge English models: their query
  instruction; anything else: none), overridable;
* query composition ("Agentic-R: Learning to Retrieve for Agentic Search", section 4.1.2): ``query`` = q;
  ``question_sep_query`` = ``Q [SEP] q`` (Eq. 4, the Agentic-R retriever input);
  ``history`` = ``Q [SEP] q1 [SEP] ... [SEP] qi`` (Eq. 6, the ablation of Table 5);
* the settings stored with the model (``agentic_retriever.json`` in its folder), so an index, the
  server and the agent apply the right composition and prefixes without being told;
* a fingerprint of the weights and settings, so an index refuses an encoder it was not built with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from .adapters import load_sentence_transformer
from .defaults import resolve_model_name
from .precision import PRECISION_ALIASES, Precision, resolve, resolve_native, torch_dtype

log = logging.getLogger(__name__)

CompositionMode = Literal["query", "question_sep_query", "history"]
#: sentence-transformers' pooling modes (its ``Pooling.POOLING_MODES``; a test keeps them in step).
PoolingMode = Literal["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
COMPOSITION_MODES: tuple[str, ...] = ("query", "question_sep_query", "history")
#: sentence-transformers' Transformer module settings that embed plain text: without them it renders each text through
#: the tokenizer's chat template when it finds one (its "message" modality), as a causal LM's tokenizer has.
TEXT_INPUT = {"modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
              "module_output_name": "token_embeddings"}
SEPARATOR = " [SEP] "
#: What an evaluation composes a QA row's search with when it has no agent question: nothing (the bare
#: question), its parent question (``parent_id``), the question itself (``Q [SEP] q`` with Q = q), or the parent
#: where the row names one and the question itself otherwise.
COMPOSE_WITH: tuple[str, ...] = ("none", "parent", "self", "parent_or_self")
SETTINGS_FILE = "agentic_retriever.json"
BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "


@dataclass
class EncoderConfig:
    """How to load and apply a bi-encoder. ``None`` means: take it from the model (folder settings,
    then sentence-transformers prompts, then the family rule)."""

    model: str = dataclasses.field(default="default", metadata={"help": "hub name, local folder, or 'default' (embedded MiniLM)"})
    query_prefix: str | None = dataclasses.field(default=None, metadata={"help": "text put before every query"})
    passage_prefix: str | None = dataclasses.field(default=None, metadata={"help": "text put before every passage"})
    composition: CompositionMode | None = dataclasses.field(default=None, metadata={"help": "query composition mode"})
    pooling: PoolingMode | None = dataclasses.field(default=None, metadata={
        "help": "override the model's pooling (sentence-transformers' modes; lasttoken: decoder embedders, "
                "agentic_retriever.base.decoder_embedder)"})
    normalize: bool = dataclasses.field(default=True, metadata={"help": "L2-normalise embeddings"})
    max_length: int | None = dataclasses.field(default=None, metadata={"help": "max tokens per text (model's own if unset)"})
    batch_size: int = dataclasses.field(default=64, metadata={"help": "texts per forward pass"})
    device: str | None = dataclasses.field(default=None, metadata={"help": "cpu, cuda, cuda:1 ... (auto if unset)"})
    devices: list[str] = dataclasses.field(default_factory=list, metadata={
        "help": "encode passages on several devices at once, one process each (sentence-transformers' multi-process "
                "pool): e.g. cuda:0 cuda:1, or all (every visible GPU); empty: `device` alone. Queries stay on "
                "`device`"})
    precision: Precision = dataclasses.field(default="auto", metadata={
        "help": "weights; auto = fp16 on GPU, fp32 on CPU; native = auto on GPU, bf16 on a CPU with AMX, else fp32"})

    RENAMED: ClassVar[dict[str, str]] = {"dtype": "precision"}
    #: Fields that say how this machine runs the encoder, not what it computes (left out of index manifests).
    MACHINE_FIELDS: ClassVar[tuple[str, ...]] = ("device", "devices", "precision", "batch_size")

    def __post_init__(self):
        self.precision = resolve_native(self.precision, self.device)

    def for_model(self, model: str) -> EncoderConfig:
        """Another model on this machine: `model` with this config's `MACHINE_FIELDS` and the model's own
        conventions (prefixes, composition, pooling from its folder)."""
        return EncoderConfig(model=str(model), **{name: getattr(self, name) for name in self.MACHINE_FIELDS})

    @classmethod
    def from_dict(cls, values: dict) -> EncoderConfig:
        """From a stored config (index manifest, model folder), including ones that spell precision ``dtype``."""
        values = dict(values)
        if "dtype" in values:
            dtype = values.pop("dtype")
            values["precision"] = PRECISION_ALIASES.get(dtype, dtype)
        return cls(**values)


@dataclass(frozen=True)
class EncoderSettings:
    """The resolved conventions an encoder applies; stored in index manifests and model folders."""

    model: str
    query_prefix: str
    passage_prefix: str
    composition: str
    pooling: str
    normalize: bool
    max_length: int
    fingerprint: str


def family_prefixes(model_name: str) -> tuple[str, str]:
    """(query prefix, passage prefix) by model family, from the model's name."""
    name = model_name.lower()
    if re.search(r"(^|[/_-])e5([/_-]|$)", name):
        return "query: ", "passage: "
    if "bge" in name and "m3" not in name and "-zh" not in name:
        return BGE_QUERY_INSTRUCTION, ""
    return "", ""


def compose_query(query: str, mode: str, question: str | None = None, history: Sequence[str] | None = None) -> str:
    """Build the retriever input for one search call (Agentic-R, Eq. 4 and Eq. 6).

    Without the original question every mode falls back to the plain query, so agents that send only
    queries still work against a context-aware retriever.
    """
    if mode not in COMPOSITION_MODES:
        raise ValueError(f"unknown composition mode {mode!r}; choose one of {', '.join(COMPOSITION_MODES)}")
    if mode == "query" or not question:
        return query
    if mode == "question_sep_query":
        return f"{question}{SEPARATOR}{query}"
    return SEPARATOR.join([question, *(history or ()), query])


def read_model_settings(model_path: str) -> dict:
    """Settings stored in a model folder by `save_model_settings` (empty for other models)."""
    path = Path(model_path) / SETTINGS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def save_model_settings(model_dir: str | Path, settings: EncoderSettings) -> None:
    from .jsonl import write_json

    stored = {k: v for k, v in dataclasses.asdict(settings).items() if k in ("query_prefix", "passage_prefix", "composition")}
    write_json(Path(model_dir) / SETTINGS_FILE, stored | {"separator": SEPARATOR})


class Encoder:
    """Encodes queries (with composition and prefix) and passages into L2-normalised float32 vectors."""

    def __init__(self, config: EncoderConfig | None = None):
        import torch
        from sentence_transformers import SentenceTransformer, models

        self.config = config = config or EncoderConfig()
        path = resolve_model_name(config.model)
        device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._device, self._pool = device, None
        if "all" in config.devices and config.devices != ["all"]:
            raise ValueError(f"EncoderConfig.devices: all stands alone, got {config.devices}")
        if config.pooling is None:
            self.model = load_sentence_transformer(path, device)
        else:
            transformer = models.Transformer(path, **TEXT_INPUT)
            dim = (getattr(transformer, "get_embedding_dimension", None) or transformer.get_word_embedding_dimension)()
            self.model = SentenceTransformer(modules=[transformer, models.Pooling(dim, config.pooling)], device=device)
        if config.max_length:
            self.model.max_seq_length = config.max_length
        fingerprint = self._weights_fingerprint()
        self.model.to(torch_dtype(resolve(config.precision, device, "encoder")))
        self.model.eval()
        #: What the weights compute in ("float32", "bfloat16", "float16"): embeddings differ with it.
        self.weights_dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")

        stored = read_model_settings(path)
        st_prompts = getattr(self.model, "prompts", None) or {}
        family_query, family_passage = family_prefixes(config.model if config.model != "default" else path)
        query_prefix = _first_set(config.query_prefix, stored.get("query_prefix"), st_prompts.get("query") or None, family_query)
        passage_prefix = _first_set(config.passage_prefix, stored.get("passage_prefix"),
                                    st_prompts.get("passage") or st_prompts.get("document") or None, family_passage)
        composition = _first_set(config.composition, stored.get("composition"), "query")
        compose_query("", composition)  # validates the mode
        pooling = config.pooling or _pooling_mode(self.model)
        if pooling == "lasttoken":
            _check_end_token(self.model.tokenizer, path)
        settings = (query_prefix, passage_prefix, composition, pooling, config.normalize, self.model.max_seq_length)
        self.settings = EncoderSettings(
            model=config.model, query_prefix=query_prefix, passage_prefix=passage_prefix, composition=composition,
            pooling=pooling, normalize=config.normalize, max_length=self.model.max_seq_length,
            fingerprint=hashlib.sha256(f"{fingerprint}|{settings!r}".encode()).hexdigest()[:32],
        )

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    def compose(self, queries: Sequence[str], questions: Sequence[str | None] | None = None,
                histories: Sequence[Sequence[str] | None] | None = None) -> list[str]:
        """Retriever inputs for a batch of search calls: composition mode, then the query prefix."""
        _check_parallel(queries, questions, "questions")
        _check_parallel(queries, histories, "histories")
        mode, prefix = self.settings.composition, self.settings.query_prefix
        return [
            prefix + compose_query(q, mode, questions[i] if questions else None, histories[i] if histories else None)
            for i, q in enumerate(queries)
        ]

    def encode_queries(self, queries: Sequence[str], questions: Sequence[str | None] | None = None,
                       histories: Sequence[Sequence[str] | None] | None = None, show_progress: bool = False) -> np.ndarray:
        return self._encode(self.compose(queries, questions, histories), show_progress)

    def encode_passages(self, passages: Sequence[str], show_progress: bool = False) -> np.ndarray:
        """Encode passage texts (Search-R1 ``contents``); the passage prefix is added here. With several
        ``devices``, more than a batch of them is spread over their processes (`passage_devices`)."""
        prefix = self.settings.passage_prefix
        texts = [prefix + p for p in passages] if prefix else list(passages)
        if len(self.passage_devices) < 2 or len(texts) <= self.config.batch_size:
            return self._encode(texts, show_progress)
        if self._pool is None:
            self._pool = self.model.start_multi_process_pool(self.passage_devices)  # moves the model to the CPU
        embeddings = self.model.encode(texts, pool=self._pool, batch_size=self.config.batch_size,
                                       normalize_embeddings=self.config.normalize, convert_to_numpy=True,
                                       show_progress_bar=show_progress)
        return np.ascontiguousarray(embeddings, dtype=np.float32)

    @property
    def passage_devices(self) -> list[str]:
        """The devices passages are encoded on: ``devices`` (``all``: every visible GPU), else none (``device``)."""
        if self.config.devices != ["all"]:
            return list(self.config.devices)
        import torch

        if not torch.cuda.is_available():
            raise ValueError("EncoderConfig.devices all needs visible GPUs (CUDA_VISIBLE_DEVICES); none is")
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]

    def close(self) -> None:
        """Stop the processes of several ``devices`` (if started) and bring the model back to its device."""
        if self._pool is not None:
            self.model.stop_multi_process_pool(self._pool)
            self._pool = None
            self.model.to(self._device)

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _encode(self, texts: list[str], show_progress: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if len(texts) <= self.config.batch_size and not show_progress and self._one_pass_equals_encode():
            return self._encode_one_batch(texts)
        embeddings = self.model.encode(
            texts, batch_size=self.config.batch_size, show_progress_bar=show_progress,
            normalize_embeddings=self.config.normalize, convert_to_numpy=True,
        )
        return np.ascontiguousarray(embeddings, dtype=np.float32)

    def _one_pass_equals_encode(self) -> bool:
        """False for a model whose `encode` also adds a default prompt or truncates its embeddings."""
        return (getattr(self.model, "default_prompt_name", None) is None
                and getattr(self.model, "truncate_dim", None) is None)

    def _encode_one_batch(self, texts: list[str]) -> np.ndarray:
        """`texts` as one forward pass: what `SentenceTransformer.encode` computes for a single batch, without its
        per-call bookkeeping (mode switch, device resolution, length sort, progress bar). That bookkeeping is
        about a tenth of the time of one short query on a CPU, which is what a retrieval service answering a
        lone agent pays on every request (benchmarks/RESULTS.md, "Retrieval service")."""
        import torch

        preprocess = getattr(self.model, "preprocess", None) or self.model.tokenize  # sentence-transformers < 5
        features = preprocess(texts)
        device = self.model.device
        features = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
        with torch.inference_mode():
            embeddings = self.model(features)["sentence_embedding"]
            if self.config.normalize:
                embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=-1)
            return np.ascontiguousarray(embeddings.float().cpu().numpy(), dtype=np.float32)

    def _weights_fingerprint(self) -> str:
        """Hash of every parameter and buffer, taken before any dtype cast so CPU and GPU loads agree."""
        import torch

        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()


def _first_set(*values):
    return next(v for v in values if v is not None)


def _pooling_mode(model) -> str:
    for module in model:
        mode = getattr(module, "pooling_mode", None) or getattr(module, "get_pooling_mode_str", lambda: None)()
        if mode:
            return mode if isinstance(mode, str) else "+".join(mode)
    return "unknown"


def ends_with_end_token(tokenizer) -> bool:
    """Whether `tokenizer` ends a text with a special token it appends (what last-token pooling should read): its
    end-of-sequence token, or another one, as Qwen3-Embedding's appends ``<|endoftext|>`` while its eos_token is
    ``<|im_end|>``."""
    ids, plain = tokenizer("probe")["input_ids"], tokenizer("probe", add_special_tokens=False)["input_ids"]
    return len(ids) > len(plain) and ids[-1] != plain[-1] and ids[-1] in tokenizer.all_special_ids


def _check_end_token(tokenizer, path: str) -> None:
    """Warn when a last-token-pooled model's tokenizer does not end texts with its end-of-sequence token: the
    embedding would then be the hidden state of each text's last word, not of the token the model was trained to
    summarise into (`decoder_embedder`)."""
    if not ends_with_end_token(tokenizer):
        log.warning("%s pools its last token, but its tokenizer does not end a text with an end-of-sequence token: "
                    "each embedding is its text's last word's; `agentic-retriever retriever init --backbone %s` "
                    "writes the model as a decoder embedder that appends it", path, path)


def _check_parallel(queries: Sequence, other: Sequence | None, name: str) -> None:
    if other is not None and len(other) != len(queries):
        raise ValueError(f"{name} must be parallel to queries: got {len(other)} for {len(queries)} queries")
