import numpy as np
import pytest
from sentence_transformers import SentenceTransformer, models

from agentic_retriever.base.defaults import minilm_model_dir
from agentic_retriever.base.encoder import (
    BGE_QUERY_INSTRUCTION, EncoderSettings, Encoder, EncoderConfig, compose_query, family_prefixes, save_model_settings,
)

TEXTS = ['"Paris"\nParis is the capital and largest city of France.', "short", "A much longer passage " * 30]


@pytest.fixture(scope="module")
def minilm():
    return Encoder(EncoderConfig(device="cpu"))


def test_default_encoder_equals_sentence_transformers_encode(minilm):
    reference = SentenceTransformer(str(minilm_model_dir()), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert np.allclose(minilm.encode_passages(TEXTS), reference, atol=1e-5)
    assert np.allclose(minilm.encode_queries(TEXTS), reference, atol=1e-5)
    assert minilm.settings.query_prefix == "" and minilm.settings.pooling == "mean" and minilm.dim == 384


def test_one_pass_and_batched_encoding_agree_normalised_or_not(tiny_model_dir):
    texts = [f"text number {i} " * (i + 1) for i in range(5)]
    for normalize in (True, False):
        # fp32 on any device (fp16 on a GPU is the default): padding to a batch changes fp16 results past 1e-5
        encoder = Encoder(EncoderConfig(model=tiny_model_dir, batch_size=2, normalize=normalize, precision="fp32"))
        batched = encoder.encode_passages(texts)  # more texts than a batch: SentenceTransformer.encode
        one_by_one = np.concatenate([encoder.encode_passages([t]) for t in texts])  # one forward pass each
        reference = encoder.model.encode(texts, normalize_embeddings=normalize)
        assert np.allclose(one_by_one, batched, atol=1e-5) and np.allclose(one_by_one, reference, atol=1e-5)
        assert one_by_one.dtype == np.float32 and one_by_one.flags["C_CONTIGUOUS"]
        assert np.allclose(np.linalg.norm(one_by_one, axis=1), 1.0, atol=1e-5) == normalize


@pytest.mark.parametrize("setting", ["default_prompt", "truncate_dim"])
def test_a_model_whose_encode_adds_a_prompt_or_truncates_is_encoded_by_sentence_transformers(tiny_model_dir, setting):
    encoder = Encoder(EncoderConfig(model=tiny_model_dir, precision="fp32"))
    if setting == "default_prompt":
        encoder.model.prompts, encoder.model.default_prompt_name = {"query": "query: "}, "query"
    else:
        encoder.model.truncate_dim = 8
    expected = encoder.model.encode(["who"], normalize_embeddings=True)
    assert np.allclose(encoder.encode_queries(["who"]), expected, atol=1e-6)
    if setting == "default_prompt":  # the prompt changes the embedding: a plain forward pass would miss it
        assert not np.allclose(expected, encoder._encode_one_batch(["who"]), atol=1e-6)
    else:
        assert expected.shape == (1, 8)


def test_prefixes_and_cls_pooling_match_a_hand_built_sentence_transformer(tiny_model_dir):
    encoder = Encoder(EncoderConfig(model=tiny_model_dir, pooling="cls", query_prefix="query: ", passage_prefix="passage: ",
                                    device="cpu"))  # the reference runs on the CPU: compare on one device
    transformer = models.Transformer(tiny_model_dir)
    reference = SentenceTransformer(modules=[transformer, models.Pooling(32, "cls")], device="cpu")
    expected_q = reference.encode(["query: who"], normalize_embeddings=True)
    expected_p = reference.encode(["passage: text"], normalize_embeddings=True)
    assert np.allclose(encoder.encode_queries(["who"]), expected_q, atol=1e-6)
    assert np.allclose(encoder.encode_passages(["text"]), expected_p, atol=1e-6)
    assert np.allclose(np.linalg.norm(encoder.encode_passages(["a", "b c"]), axis=1), 1.0, atol=1e-6)


def test_composition_modes_follow_agentic_r_eq4_and_eq6():
    assert compose_query("q2", "query", "Q", ["q1"]) == "q2"
    assert compose_query("q2", "question_sep_query", "Q", ["q1"]) == "Q [SEP] q2"
    assert compose_query("q3", "history", "Q", ["q1", "q2"]) == "Q [SEP] q1 [SEP] q2 [SEP] q3"
    assert compose_query("q", "question_sep_query", None) == "q"  # agents that send no question still work
    with pytest.raises(ValueError, match="unknown composition mode 'bogus'"):
        compose_query("q", "bogus")


@pytest.mark.parametrize("name, expected", [
    ("intfloat/e5-base-v2", ("query: ", "passage: ")),
    ("/models/e5-large", ("query: ", "passage: ")),
    ("BAAI/bge-base-en-v1.5", (BGE_QUERY_INSTRUCTION, "")),
    ("BAAI/bge-m3", ("", "")),
    ("sentence-transformers/all-MiniLM-L6-v2", ("", "")),
    ("some/multilingual-e5ish", ("", "")),
])
def test_family_prefix_rules(name, expected):
    assert family_prefixes(name) == expected


def test_prefix_and_composition_are_applied_in_order(tiny_model_dir):
    encoder = Encoder(EncoderConfig(model=tiny_model_dir, query_prefix="query: ", composition="question_sep_query"))
    assert encoder.compose(["q"], ["Q"]) == ["query: Q [SEP] q"]
    with pytest.raises(ValueError, match="questions must be parallel"):
        encoder.compose(["a", "b"], ["Q"])


def test_settings_stored_in_the_model_folder_are_applied_without_being_told(tiny_model_dir, tmp_path):
    import shutil

    model_dir = tmp_path / "trained"
    shutil.copytree(tiny_model_dir, model_dir)
    stored = EncoderSettings(model="x", query_prefix="q> ", passage_prefix="p> ", composition="question_sep_query",
                             pooling="mean", normalize=True, max_length=64, fingerprint="")
    save_model_settings(model_dir, stored)
    encoder = Encoder(EncoderConfig(model=str(model_dir)))
    assert encoder.settings.composition == "question_sep_query"
    assert encoder.compose(["q"], ["Q"]) == ["q> Q [SEP] q"]
    overridden = Encoder(EncoderConfig(model=str(model_dir), composition="query", query_prefix=""))
    assert overridden.compose(["q"], ["Q"]) == ["q"]


def test_fingerprint_changes_with_weights_and_conventions_but_not_with_reload(tiny_model_dir, minilm):
    a = Encoder(EncoderConfig(model=tiny_model_dir)).settings.fingerprint
    assert Encoder(EncoderConfig(model=tiny_model_dir)).settings.fingerprint == a
    assert Encoder(EncoderConfig(model=tiny_model_dir, composition="question_sep_query")).settings.fingerprint != a
    assert minilm.settings.fingerprint != a


def test_empty_input_gives_an_empty_matrix(minilm):
    assert minilm.encode_queries([]).shape == (0, 384)
