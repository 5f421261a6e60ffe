"""The indexes the service and client tests share: a small corpus of distinct topics, built once per test
session into a dense index, a dense index composing ``Q [SEP] q``, and a BM25 index."""

from __future__ import annotations

import json

import pytest

from agentic_retriever.encoder import EncoderConfig
from agentic_retriever.index import IndexBuildConfig, build_index, open_index
from tests.retrieval.topics import CONTENTS

@pytest.fixture(scope="package")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": pid, "contents": c}) + "\n" for pid, c in CONTENTS.items()))
    cache = str(root / "cache")
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(root / "dense"), corpus_cache=cache))
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(root / "dense_qsq"), corpus_cache=cache,
                                 encoder=EncoderConfig(composition="question_sep_query")))
    build_index(IndexBuildConfig(corpus=str(corpus), out=str(root / "bm25"), backend="bm25", corpus_cache=cache))
    return {name: open_index(root / name, corpus_cache=cache) for name in ("dense", "dense_qsq", "bm25")}


@pytest.fixture(scope="package")
def dense(built):
    return built["dense"]


@pytest.fixture(scope="package")
def dense_qsq(built):
    return built["dense_qsq"]


@pytest.fixture(scope="package")
def bm25(built):
    return built["bm25"]
