"""Decoder embedders (`agentic_retriever.base.decoder_embedder`): a causal LM read at its appended end token, with
left padding and an instruction prompt, as a plain sentence-transformers folder and as our `Encoder`."""

from __future__ import annotations

import logging
import typing

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from agentic_retriever.base.decoder_embedder import (DEFAULT_QUERY_INSTRUCTION, DecoderEmbedderConfig,
                                                     appends_end_token, build_decoder_embedder, query_prompt)
from agentic_retriever.base.encoder import Encoder, EncoderConfig, PoolingMode
from tests.fakes import smollm2_tokenizer_dir

TEXTS = ["Paris", "The Eiffel Tower was finished in 1889 for the World's Fair in Paris.", "Who built it?"]


def test_the_pooling_modes_are_sentence_transformers_own():
    from sentence_transformers.sentence_transformer.modules import Pooling

    assert typing.get_args(PoolingMode) == Pooling.POOLING_MODES


def test_the_folder_loads_plainly_and_its_tokenizer_ends_every_text_with_the_end_token(tiny_decoder_embedder_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(tiny_decoder_embedder_dir, device="cpu")
    tokenizer = model.tokenizer
    assert tokenizer.padding_side == "left" and model.max_seq_length == 64
    assert [module.__class__.__name__ for module in model] == ["Transformer", "Pooling", "Normalize"]
    assert model[1].pooling_mode == "lasttoken"
    assert model.prompts["query"] == f"Instruct: {DEFAULT_QUERY_INSTRUCTION}\nQuery:" and not model.prompts.get("document")
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id and ids[:-1] == tokenizer(text, add_special_tokens=False)["input_ids"]
    cut = model.tokenize([" ".join(["word"] * 200)])["input_ids"][0]  # truncated: the end token is still last
    assert len(cut) == 64 and cut[-1] == tokenizer.eos_token_id


def test_left_and_right_padding_give_each_text_the_hidden_state_of_its_own_end_token(tiny_decoder_embedder_dir):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    model = SentenceTransformer(tiny_decoder_embedder_dir, device="cpu")
    alone = np.stack([model.encode([text])[0] for text in TEXTS])  # no padding at all
    left = model.encode(TEXTS, batch_size=len(TEXTS))
    model.tokenizer.padding_side = "right"
    right = model.encode(TEXTS, batch_size=len(TEXTS))
    np.testing.assert_allclose(left, alone, atol=1e-5)
    np.testing.assert_allclose(right, alone, atol=1e-5)

    # the pooled vector is the transformer's last hidden state at the end token, normalised
    transformer, tokenizer = AutoModel.from_pretrained(tiny_decoder_embedder_dir), model.tokenizer
    ids = tokenizer(TEXTS[1], return_tensors="pt")
    with torch.no_grad():
        hidden = transformer(**ids).last_hidden_state[0, -1]
    assert ids["input_ids"][0, -1] == tokenizer.eos_token_id
    np.testing.assert_allclose(alone[1], torch.nn.functional.normalize(hidden, dim=0).numpy(), atol=1e-5)
    assert not np.allclose(alone[0], alone[1], atol=1e-3)  # texts differ: the pooled token is not a constant


def test_our_encoder_composes_q_sep_q_inside_the_query_instruction(tiny_decoder_embedder_dir):
    encoder = Encoder(EncoderConfig(model=tiny_decoder_embedder_dir, composition="question_sep_query", device="cpu"))
    assert encoder.settings.pooling == "lasttoken" and encoder.settings.passage_prefix == ""
    assert encoder.compose(["Eiffel tower year"], ["When was the tower built?"]) == [
        f"{query_prompt(DEFAULT_QUERY_INSTRUCTION)}When was the tower built? [SEP] Eiffel tower year"]
    queries = encoder.encode_queries(["Eiffel tower year"], ["When was the tower built?"])
    passages = encoder.encode_passages(TEXTS)
    assert queries.shape == (1, 32) and passages.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)


def test_a_tokenizer_that_puts_a_bos_first_keeps_it_and_one_without_an_end_token_is_refused():
    from tokenizers.processors import TemplateProcessing

    # a copy of its own (load_smollm2_tokenizer's is one cached instance): the test changes its post-processor
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))
    bos = tokenizer.bos_token
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=[bos, "$A"], pair=[bos, "$A", "$B:1"], special_tokens=[(bos, tokenizer.bos_token_id)])
    appends_end_token(tokenizer)
    ids = tokenizer("Paris")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert ids[1:-1] == tokenizer("Paris", add_special_tokens=False)["input_ids"]

    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="no end-of-sequence token"):
        appends_end_token(tokenizer)


def test_an_appended_special_token_other_than_eos_counts_as_the_end_token_as_in_qwen3_embedding():
    """Qwen3-Embedding's tokenizer appends <|endoftext|>, while its eos_token is <|im_end|>: the token the model was
    trained to pool, so neither the Encoder's warning nor `retriever init` may take it for a missing end token."""
    from tokenizers.processors import TemplateProcessing

    from agentic_retriever.base.encoder import ends_with_end_token

    # a copy of its own (load_smollm2_tokenizer's is one cached instance): the test changes its post-processor
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))
    assert not ends_with_end_token(tokenizer)  # SmolLM2's own tokenizer appends nothing
    end = "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids(end) != tokenizer.eos_token_id
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=["$A", end], pair=["$A", end, "$B:1", f"{end}:1"],
        special_tokens=[(end, tokenizer.convert_tokens_to_ids(end))])
    assert ends_with_end_token(tokenizer)
    appends_end_token(tokenizer)  # left as it is: no second end token
    assert tokenizer("Paris")["input_ids"][-2:] == [*tokenizer("Paris", add_special_tokens=False)["input_ids"][-1:],
                                                    tokenizer.convert_tokens_to_ids(end)]


def test_last_token_pooling_over_a_tokenizer_without_the_end_token_is_warned_about(tiny_causal_lm_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="agentic_retriever.base.encoder"):
        encoder = Encoder(EncoderConfig(model=tiny_causal_lm_dir, pooling="lasttoken", device="cpu"))
    assert encoder.settings.pooling == "lasttoken"
    assert "does not end a text with an end-of-sequence token" in caplog.text and "retriever init" in caplog.text


def test_retriever_init_writes_the_folder_from_the_command_line(tiny_causal_lm_dir, tmp_path):
    from agentic_retriever.app.cli import main

    main(["retriever", "init", "--backbone", tiny_causal_lm_dir, "--out", str(tmp_path / "emb"),
          "--query-instruction", "Find the passage", "--max-length", "32"])
    encoder = Encoder(EncoderConfig(model=str(tmp_path / "emb"), device="cpu"))
    assert encoder.settings.query_prefix == "Instruct: Find the passage\nQuery:" and encoder.settings.max_length == 32
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # built beside, renamed in
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="left untouched"):
        build_decoder_embedder(DecoderEmbedderConfig(backbone=tiny_causal_lm_dir, out=str(tmp_path / "mine")))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="dtype"):
        build_decoder_embedder(DecoderEmbedderConfig(backbone=tiny_causal_lm_dir, out=str(tmp_path / "x"),
                                                     dtype="int8"))
