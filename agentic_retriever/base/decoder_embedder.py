"""A decoder LM as a bi-encoder: the embedder families search-agent work uses in 2026 (Qwen3-Embedding, RTriever,
e5-mistral, gte-Qwen) are causal LMs read at their last token.

Agentic-R ("Agentic-R: Learning to Retrieve for Agentic Search", Limitations) trains e5-base-v2 and names larger
retriever backbones as its open direction; Qwen3-Embedding ("Qwen3 Embedding: Advancing Text Embedding and
Reranking Through Foundation Models", arXiv:2506.05176, section 2) fixes the recipe this module writes down:

* the embedding is the hidden state of the last token, an end-of-sequence token the tokenizer appends (so a
  truncated text still ends in it), with left padding (the last position is the last real token in every row);
  sentence-transformers' ``lasttoken`` pooling reads the last token under the attention mask on either side;
* queries carry an instruction, ``Instruct: {task}\\nQuery:{query}``, passages none; Agentic-R's ``Q [SEP] q``
  is composed inside it (the query prefix comes before the composed text: `Encoder.compose`).

`build_decoder_embedder` (``agentic-retriever retriever init``) writes any causal LM folder or hub name as such a
sentence-transformers folder: ``SentenceTransformer(path)`` and our `Encoder` load it as they load MiniLM, and
`retriever train` fine-tunes it fully or with LoRA (`training.config.LoraSettings`). A model that already is a
decoder embedder (Qwen3-Embedding) needs none of this: its folder loads as it is.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .defaults import resolve_llm_name
from .encoder import TEXT_INPUT, ends_with_end_token
from .jsonl import replace_folder, temp_folder_beside
from .precision import TORCH_NAMES

__all__ = ["DEFAULT_QUERY_INSTRUCTION", "DecoderEmbedderConfig", "build_decoder_embedder", "query_prompt"]

log = logging.getLogger(__name__)

#: Qwen3-Embedding's instruction for web-search retrieval (its model card's example task).
DEFAULT_QUERY_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass
class DecoderEmbedderConfig:
    """Settings of `agentic-retriever retriever init` (section ``retriever_init``)."""

    backbone: str = field(default="default", metadata={
        "help": "causal LM: hub name, local folder, or 'default' (the embedded SmolLM2-135M-Instruct)"})
    out: str = field(default="", metadata={"help": "the embedder folder to write", "required": True})
    query_instruction: str = field(default=DEFAULT_QUERY_INSTRUCTION, metadata={
        "help": "task of the query prompt 'Instruct: {task}\\nQuery:' (empty: no query prompt)"})
    max_length: int = field(default=512, metadata={"help": "max tokens per text, the end token included"})
    dtype: str = field(default="fp32", metadata={
        "help": "weights as saved: fp32, bf16 or fp16 (training keeps fp32 master weights whatever is saved)"})


def query_prompt(instruction: str) -> str:
    """The query prompt of an instruction, in Qwen3-Embedding's form; empty for no instruction."""
    return f"Instruct: {instruction}\nQuery:" if instruction else ""


def build_decoder_embedder(config: DecoderEmbedderConfig) -> Path:
    """Write `config.backbone` as a sentence-transformers embedder folder at `config.out` (written beside it, then
    renamed in: whole or absent) and return it: the transformer without its LM head, ``lasttoken`` pooling and L2
    normalisation, a tokenizer that appends the end-of-sequence token and pads on the left, and the query prompt."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import AutoTokenizer

    if not config.out:
        raise ValueError("retriever init: give the output folder (out)")
    if config.dtype not in TORCH_NAMES:
        raise ValueError(f"retriever init: dtype {config.dtype!r} is none of {', '.join(TORCH_NAMES)}")
    out = Path(config.out)
    if out.is_dir() and any(out.iterdir()) and not (out / "modules.json").is_file():
        raise FileExistsError(f"{out} exists and is not a sentence-transformers folder; it is left untouched: choose "
                              "another output folder or remove it")
    backbone = resolve_llm_name(config.backbone)
    building = temp_folder_beside(out)
    try:
        tokenizer = AutoTokenizer.from_pretrained(backbone, model_max_length=config.max_length)
        appends_end_token(tokenizer)
        tokenizer.chat_template = None  # an embedder reads plain text (TEXT_INPUT); the folder carries no template
        transformer = Transformer(backbone, **TEXT_INPUT,
                                  model_kwargs={"dtype": getattr(torch, TORCH_NAMES[config.dtype])})
        transformer.processor = tokenizer
        dim = transformer.get_embedding_dimension()
        prompts = {"query": query_prompt(config.query_instruction), "document": ""}
        model = SentenceTransformer(modules=[transformer, Pooling(dim, "lasttoken"), Normalize()], device="cpu",
                                    prompts={name: text for name, text in prompts.items() if text})
        model.save(str(building), create_model_card=False)
        replace_folder(building, out)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    log.info("wrote %s as a decoder embedder to %s (last-token pooling, %d-d, max %d tokens)", backbone, out, dim,
             config.max_length)
    return out


def appends_end_token(tokenizer) -> None:
    """Make a fast tokenizer end every text with its end-of-sequence token (after truncation, so a cut text keeps
    it) and pad on the left; a tokenizer that already appends it (Qwen3-Embedding's) is left as it is, and one
    without an end-of-sequence token is an error. What the tokenizer puts before the text (a BOS) is kept."""
    from tokenizers.processors import TemplateProcessing

    eos, eos_id = tokenizer.eos_token, tokenizer.eos_token_id
    if eos is None or eos_id is None:
        raise ValueError(f"{tokenizer.name_or_path}: the tokenizer has no end-of-sequence token, which last-token "
                         "pooling reads; give a causal LM whose tokenizer has one")
    tokenizer.padding_side = "left"
    tokenizer.init_kwargs["padding_side"] = "left"  # what save_pretrained writes to tokenizer_config.json
    if tokenizer.pad_token is None:
        tokenizer.pad_token = eos
    if ends_with_end_token(tokenizer):
        return
    probe = tokenizer("probe")["input_ids"]
    text = tokenizer("probe", add_special_tokens=False)["input_ids"]
    before = probe[:len(probe) - len(text)]
    if probe[len(before):] != text:
        raise ValueError(f"{tokenizer.name_or_path}: its tokenizer adds tokens after the text ({probe} for "
                         f"{text}); last-token pooling needs the end-of-sequence token last")
    names = tokenizer.convert_ids_to_tokens(before)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=[*names, "$A", eos], pair=[*names, "$A", eos, "$B:1", f"{eos}:1"],
        special_tokens=sorted({*zip(names, before), (eos, eos_id)}, key=lambda token: token[1]))
