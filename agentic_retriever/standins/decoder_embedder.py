"""A decoder embedder of Qwen3-Embedding's architecture with random weights, where its weights cannot be had.

The tests, the paper config's dry run (`benchmarks/experiments/paper_dry_run/`, ``--retriever decoder``) and the GPU
check (`make gpu-check`) need a decoder embedder without a download: a Qwen3 transformer (`SHAPES`: toy ones, or
Qwen3-Embedding-0.6B's own sizes from its config.json) with seeded random weights and a tokenizer that is here
(SmolLM2's, whose vocabulary sets the embedding table: 49,152 rows rather than 151,669, the rest of the shape is
Qwen3-Embedding's), written by `retriever init` (`base.decoder_embedder.build_decoder_embedder`): last-token
pooling over the appended end token, left padding, Qwen3-Embedding's query instruction. Speed and memory do not
depend on the weights' values; retrieval quality does (a random embedder retrieves at chance).

    python -m agentic_retriever.standins.decoder_embedder --shape tiny --tokenizer DIR --out DIR
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

#: Qwen3 transformer sizes (transformers' Qwen3Config fields); ``qwen3-embedding-0.6b`` is the model's own.
SHAPES: dict[str, dict] = {
    "tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 512},
    "small": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512},
    "qwen3-embedding-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                             "max_position_embeddings": 32768},
}


def random_decoder_embedder(out: str | Path, tokenizer_dir: str | Path, shape: str = "tiny", max_length: int = 512,
                            seed: int = 0) -> Path:
    """Write a random-weight Qwen3 embedder of `shape` (`SHAPES`) with the tokenizer of `tokenizer_dir` at `out`
    (whole or absent, as `retriever init` writes) and return it."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from agentic_retriever.base.decoder_embedder import DecoderEmbedderConfig, build_decoder_embedder

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True, **SHAPES[shape])
    with tempfile.TemporaryDirectory(dir=Path(out).parent if Path(out).parent.is_dir() else None) as tmp:
        Qwen3ForCausalLM(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return build_decoder_embedder(DecoderEmbedderConfig(backbone=tmp, out=str(out), max_length=max_length))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the embedder folder to write")
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer folder")
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args(argv)
    print(random_decoder_embedder(args.out, args.tokenizer, args.shape, args.max_length))


if __name__ == "__main__":
    main()
