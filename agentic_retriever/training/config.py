"""Settings of the retriever trainer (light to import: the CLI builds its parser from them)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from agentic_retriever.base.curves import validate_report_to
from agentic_retriever.base.encoder import COMPOSE_WITH, EncoderConfig
from agentic_retriever.base.precision import Precision, resolve_native

__all__ = ["LOSSES", "SELECT_METRIC_PATTERN", "SOFT_LABEL_KEYS", "LoraSettings", "RetrieverTrainConfig"]

LOSSES = ("infonce", "soft_label")
#: Per-passage utilities a soft-label target can be built from (see `data.passage_utility`).
SOFT_LABEL_KEYS = ("gac", "local_utility", "gac+lr")
#: Held-out metrics model selection can maximise: mrr@k, recall@k or ndcg@k (eval.retrieval's definitions).
SELECT_METRIC_PATTERN = re.compile(r"^(mrr|recall|ndcg)@([1-9][0-9]*)$")


@dataclass
class LoraSettings:
    """LoRA ("LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685) on the encoder's transformer,
    by PEFT (`training.lora`), as tevatron, FlagEmbedding and sentence-transformers train decoder embedders of
    billions of parameters: the weights stay frozen and each targeted linear layer learns W + alpha / r * B A.
    Rank 0 trains every weight (the paper's full fine-tuning)."""

    rank: int = field(default=0, metadata={"help": "rank r of each update (0: full fine-tuning, no adapter)"})
    alpha: float = field(default=32.0, metadata={"help": "scale alpha of the update (alpha / r * B A)"})
    dropout: float = field(default=0.05, metadata={"help": "dropout on the adapter's input"})
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"], metadata={
        "help": "layers that get an adapter: module names (q_proj k_proj v_proj o_proj ...) or all-linear"})
    merge: bool = field(default=True, metadata={
        "help": "export the adapter merged into the weights: a plain sentence-transformers folder that loads "
                "without PEFT; false: the adapter alone, which PEFT loads over the base model"})

    def validate(self) -> None:
        if self.rank < 0:
            raise ValueError(f"lora.rank must be at least 0 (0: no adapter), got {self.rank}")
        if self.rank and not self.alpha > 0:
            raise ValueError(f"lora.alpha must be positive, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if self.rank and not self.target_modules:
            raise ValueError("lora.target_modules must name at least one layer (or all-linear)")


def _paper_encoder() -> EncoderConfig:
    return EncoderConfig(model="default", composition="question_sep_query")


@dataclass
class RetrieverTrainConfig:
    """Settings of `agentic-retriever retriever train` (defaults: the paper's, section 5.1; see
    configs/agentic_r.yaml for the full recipe and configs/quickstart.yaml for the CPU one).

    The objective: ``loss`` infonce is Eq. 5 ("Agentic-R: Learning to Retrieve for Agentic Search", section 4.1.2),
    plus ``soft_label_weight`` x the REPLUG KL term when that weight is positive; ``loss`` soft_label is the
    KL term alone (see `losses`). Model selection (``select_on``) keeps the base or the epoch that scores best
    on held-out training questions (see `checkpoint_selection`)."""

    #: Keys that moved to another section (refused, naming where they live now).
    MOVED: ClassVar[dict[str, str]] = {"num_negatives": (
        "the negatives per row are mining's, mine_run.mining.selection.num_negatives; training takes every row's "
        "negatives and refuses a file whose rows differ")}

    data: str = field(default="", metadata={"help": "training rows: Agentic-R (mine run output) or FlagEmbedding JSONL",
                                            "derive": "{workdir}/mining/retriever_train.jsonl"})
    corpus: str = field(default="", metadata={"help": "corpus the rows' passage ids refer to",
                                              "derive": "{workdir}/data/corpus.jsonl"})
    out: str = field(default="", metadata={"help": "folder of the trained encoder (checkpoints go to OUT.checkpoints)",
                                           "derive": "{workdir}/retriever"})
    encoder: EncoderConfig = field(default_factory=_paper_encoder)
    loss: Literal["infonce", "soft_label"] = field(default="infonce", metadata={
        "help": "infonce: Eq. 5 (+ soft_label_weight x KL); soft_label: the REPLUG KL to the rows' utilities alone"})
    soft_label_weight: float = field(default=0.0, metadata={
        "help": "with loss infonce: weight w of the KL term added to Eq. 5 (0: Eq. 5 alone)"})
    soft_label_key: Literal["gac", "local_utility", "gac+lr"] = field(default="gac", metadata={
        "help": "per-passage utility of the KL target: gac (em where gac is missing), local_utility, or their sum"})
    label_temperature: float = field(default=0.1, metadata={
        "help": "temperature of the KL target softmax(utility / label_temperature)"})
    temperature: float = field(default=0.01, metadata={
        "help": "InfoNCE temperature tau (Eq. 5), also the KL's retriever side"})
    learning_rate: float = field(default=2e-5, metadata={"help": "peak learning rate (AdamW)"})
    epochs: float = field(default=2.0, metadata={"help": "passes over the examples"})
    max_steps: int = field(default=-1, metadata={"help": "stop after this many updates (-1: epochs decide)"})
    per_device_batch_size: int = field(default=32, metadata={"help": "queries per device and step (B)"})
    warmup_ratio: float = field(default=0.1, metadata={
        "help": "linear warm-up over ceil(ratio x updates) updates, the first one already at a non-zero rate"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    precision: Precision = field(default="auto", metadata={
        "help": "mixed precision; auto: fp16 on GPU (the paper), fp32 on CPU; native: auto on GPU, bf16 autocast on "
                "a CPU with AMX, fp32 on other CPUs"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations (paper: on)"})
    cached: bool = field(default=False, metadata={"help": "GradCache loss: big global batches in bounded memory"})
    mini_batch_size: int = field(default=32, metadata={"help": "texts per forward pass of the cached loss"})
    gather_across_devices: bool = field(default=True, metadata={"help": "cross-device negatives (Eq. 5)"})
    batch_sampler: Literal["default", "no_duplicates"] = field(default="no_duplicates", metadata={
        "help": "no_duplicates keeps a text from appearing twice in a batch (no false in-batch negatives)"})
    select_on: str = field(default="", metadata={
        "help": "held-out QA JSONL (supporting_titles) to keep the best of base and epochs on; never the dev set"})
    select_index: str = field(default="", metadata={
        "help": "index folder built with the base encoder; its top-select_pool passages form the re-ranking pool",
        "derive": "{index}"})
    select_metric: str = field(default="mrr@10", metadata={
        "help": "held-out metric to maximise: mrr@k, recall@k, ndcg@k"})
    select_pool: int = field(default=50, metadata={"help": "base-encoder passages per held-out question in the pool"})
    select_compose_with: list[str] = field(default_factory=lambda: ["self"], metadata={
        "help": "the inputs a held-out question is scored with; their mean decides. self: Q [SEP] q with Q = q = "
                "the question; none: the bare question; parent: composed with its parent question (select_parents). "
                "Select on the inputs you report"})
    select_parents: str = field(default="", metadata={
        "help": "QA JSONL of the held-out rows' parent questions (by parent_id), for select_compose_with parent"})
    lora: LoraSettings = field(default_factory=LoraSettings)
    deepspeed: str = field(default="", metadata={"help": "DeepSpeed JSON config (extra [deepspeed]); e.g. configs/deepspeed_zero2.json"})
    skip_bad_rows: bool = field(default=False, metadata={"help": "skip and count rows with unknown passage ids or too few negatives"})
    save_steps: int = field(default=100, metadata={"help": "checkpoint every N updates (a rerun resumes from the last)"})
    logging_steps: int = field(default=5, metadata={"help": "log loss, learning rate and in-batch accuracy every N updates"})
    seed: int = field(default=0, metadata={"help": "seed of shuffling and initialisation"})
    progress: bool = field(default=True, metadata={"help": "progress bar"})
    report_to: list[str] = field(default_factory=lambda: ["auto"], metadata={
        "help": "where the logs also go (Hugging Face report_to, events in OUT.logs): auto (tensorboard when "
                "installed), tensorboard, wandb, none; metrics.jsonl and the curves PNG are always written"})

    @property
    def uses_soft_labels(self) -> bool:
        """Whether the objective has the KL term (and so needs per-passage utilities in the rows)."""
        return self.loss == "soft_label" or self.soft_label_weight > 0

    def __post_init__(self):
        # training runs on the first GPU when there is one (or under torchrun, each process's), else on the CPU
        self.precision = resolve_native(self.precision, None)

    def validate(self) -> None:
        for name in ("data", "out"):
            if not getattr(self, name):
                raise ValueError(f"retriever training needs --{name}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.per_device_batch_size < 1 or self.mini_batch_size < 1:
            raise ValueError("per_device_batch_size and mini_batch_size must be at least 1")
        if self.precision not in ("auto", "native", "fp32", "fp16", "bf16"):
            raise ValueError(f"precision must be auto, native, fp32, fp16 or bf16, got {self.precision!r}")
        if self.batch_sampler not in ("default", "no_duplicates"):
            raise ValueError(f"batch_sampler must be default or no_duplicates, got {self.batch_sampler!r}")
        if not 0 <= self.warmup_ratio <= 1:
            raise ValueError(f"warmup_ratio must be in [0, 1], got {self.warmup_ratio}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.soft_label_weight < 0:
            raise ValueError(f"soft_label_weight must be at least 0, got {self.soft_label_weight}")
        if self.loss == "soft_label" and self.soft_label_weight:
            raise ValueError("loss soft_label is the KL term alone; to mix it with Eq. 5 use loss infonce with "
                             f"soft_label_weight {self.soft_label_weight}")
        if self.soft_label_key not in SOFT_LABEL_KEYS:
            raise ValueError(f"soft_label_key must be one of {', '.join(SOFT_LABEL_KEYS)}, got {self.soft_label_key!r}")
        if not self.label_temperature > 0:
            raise ValueError(f"label_temperature must be positive, got {self.label_temperature}")
        if self.select_on and not self.select_index:
            raise ValueError("--select-on needs --select-index (an index built with the base encoder: the pool)")
        if not SELECT_METRIC_PATTERN.match(self.select_metric):
            raise ValueError(f"select_metric must be mrr@k, recall@k or ndcg@k, got {self.select_metric!r}")
        if self.select_pool < 1:
            raise ValueError(f"select_pool must be at least 1, got {self.select_pool}")
        unknown = [mode for mode in self.select_compose_with if mode not in COMPOSE_WITH]
        if unknown or not self.select_compose_with or len(set(self.select_compose_with)) < len(self.select_compose_with):
            raise ValueError(f"select_compose_with must list distinct inputs of {', '.join(COMPOSE_WITH)}, "
                             f"got {self.select_compose_with}")
        if self.select_on and "parent" in self.select_compose_with and not self.select_parents:
            raise ValueError("select_compose_with parent needs --select-parents (the QA file of the parent questions)")
        self.lora.validate()
        validate_report_to(self.report_to)
