"""The indexes the service and client tests share: a small corpus of distinct topics, built once per test
session into a dense index, a dense index composing ``Q [SEP] q``, and a BM25 index (dense ones in fp32 on any
device)."""

from __future__ import annotations

import json

import pytest

from agentic_retriever.base.encoder import EncoderConfig
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from tests.retrieval.topics import CONTENTS

@pytest.fixture(scope="package")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": pid, "contents": c}) + "\n" for pid, c in CONTENTS.items()))
    cache = str(root / "cache")
    # fp32 on every device (the encoder picks fp16 on a GPU): the tests compare scores across batchings at 1e-4
    encoders = {"dense": EncoderConfig(precision="fp32"),
                "dense_qsq": EncoderConfig(composition="question_sep_query", precision="fp32")}
    for name, encoder in encoders.items():
        build_index(IndexBuildConfig(corpus=str(corpus), out=str(root / name), corpus_cache=cache, encoder=encoder))
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(root / "bm25"), backend="bm25", corpus_cache=cache))
    return {name: open_index(root / name, encoder=encoders.get(name), corpus_cache=cache)
            for name in ("dense", "dense_qsq", "bm25")}


@pytest.fixture(scope="package")
def dense(built):
    return built["dense"]


@pytest.fixture(scope="package")
def dense_qsq(built):
    return built["dense_qsq"]


@pytest.fixture(scope="package")
def bm25(built):
    return built["bm25"]
