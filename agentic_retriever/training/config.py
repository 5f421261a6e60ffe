"""Settings of the retriever trainer (light to import: the CLI builds its parser from them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..encoder import EncoderConfig

__all__ = ["RetrieverTrainConfig"]


def _paper_encoder() -> EncoderConfig:
    return EncoderConfig(model="default", composition="question_sep_query")


@dataclass
class RetrieverTrainConfig:
    """Settings of `agentic-retriever retriever train` (defaults: the paper's, section 5.1; see
    configs/agentic_r.yaml for the full recipe and configs/quickstart.yaml for the CPU one)."""

    data: str = field(default="", metadata={"help": "training rows: Agentic-R (mine output) or FlagEmbedding JSONL"})
    corpus: str = field(default="", metadata={"help": "corpus the rows' passage ids refer to"})
    out: str = field(default="", metadata={"help": "folder of the trained encoder (checkpoints go to OUT.checkpoints)"})
    encoder: EncoderConfig = field(default_factory=_paper_encoder)
    temperature: float = field(default=0.01, metadata={"help": "InfoNCE temperature tau (Eq. 5)"})
    learning_rate: float = field(default=2e-5, metadata={"help": "peak learning rate (AdamW)"})
    epochs: float = field(default=2.0, metadata={"help": "passes over the examples"})
    max_steps: int = field(default=-1, metadata={"help": "stop after this many updates (-1: epochs decide)"})
    per_device_batch_size: int = field(default=32, metadata={"help": "queries per device and step (B)"})
    num_negatives: int | None = field(default=15, metadata={"help": "sampled negatives per query (N - 1); none: the data's"})
    warmup_ratio: float = field(default=0.1, metadata={"help": "share of updates with a linear warm-up"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    precision: Literal["auto", "fp32", "fp16", "bf16"] = field(default="auto", metadata={
        "help": "mixed precision; auto: fp16 on GPU (the paper), fp32 on CPU"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations (paper: on)"})
    cached: bool = field(default=False, metadata={"help": "GradCache loss: big global batches in bounded memory"})
    mini_batch_size: int = field(default=32, metadata={"help": "texts per forward pass of the cached loss"})
    gather_across_devices: bool = field(default=True, metadata={"help": "cross-device negatives (Eq. 5)"})
    batch_sampler: Literal["default", "no_duplicates"] = field(default="default", metadata={
        "help": "no_duplicates keeps a text from appearing twice in a batch (no false in-batch negatives)"})
    deepspeed: str = field(default="", metadata={"help": "DeepSpeed JSON config (extra [deepspeed]); e.g. configs/deepspeed_zero2.json"})
    skip_bad_rows: bool = field(default=False, metadata={"help": "skip and count rows with unknown passage ids or too few negatives"})
    save_steps: int = field(default=100, metadata={"help": "checkpoint every N updates (a rerun resumes from the last)"})
    logging_steps: int = field(default=5, metadata={"help": "log loss, learning rate and in-batch accuracy every N updates"})
    seed: int = field(default=0, metadata={"help": "seed of shuffling and initialisation"})
    progress: bool = field(default=True, metadata={"help": "progress bar"})

    def validate(self) -> None:
        for name in ("data", "out"):
            if not getattr(self, name):
                raise ValueError(f"retriever training needs --{name}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.per_device_batch_size < 1 or self.mini_batch_size < 1:
            raise ValueError("per_device_batch_size and mini_batch_size must be at least 1")
        if self.num_negatives is not None and self.num_negatives < 1:
            raise ValueError(f"num_negatives must be at least 1, got {self.num_negatives}")
        if self.precision not in ("auto", "fp32", "fp16", "bf16"):
            raise ValueError(f"precision must be auto, fp32, fp16 or bf16, got {self.precision!r}")
        if self.batch_sampler not in ("default", "no_duplicates"):
            raise ValueError(f"batch_sampler must be default or no_duplicates, got {self.batch_sampler!r}")
