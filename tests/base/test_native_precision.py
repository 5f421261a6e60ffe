"""``precision: native``: bf16 on a CPU that multiplies bf16 in hardware (AMX tiles or AVX512-BF16), fp32 on other
CPUs, ``auto`` on a GPU; resolved once the settings are final (file, then flags), for the agent, the scorer, the
encoder and retriever training alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from agent.rollouts import RolloutConfig
from agent.sft import WarmStartConfig
from agent.sft.warm_start import _cache_key
from agentic_retriever.app.config_loader import build_config
from agentic_retriever.base import precision as precision_module
from agentic_retriever.base.encoder import Encoder, EncoderConfig
from agentic_retriever.base.llm import LLMConfig
from agentic_retriever.base.machine import cpu_class
from agentic_retriever.base.precision import ROLES, resolve, resolve_native
from agentic_retriever.index import IndexBuildConfig
from agentic_retriever.mining.job import MineJobConfig
from agentic_retriever.training.config import RetrieverTrainConfig
from agentic_retriever.training.trainer import _precision


@pytest.mark.parametrize(("amx", "avx512_bf16", "native"), [
    (True, True, True), (True, False, True), (False, True, True), (False, False, False)],
    ids=["sapphire-rapids", "amx-only", "zen4-or-cooper-lake", "avx2-or-skylake"])
def test_the_cpu_computes_bf16_natively_with_amx_tiles_or_avx512_bf16(amx, avx512_bf16, native, monkeypatch):
    """torch's own probes decide, patched both ways (the cached answer is cleared around each case)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    precision_module.cpu_computes_bf16_natively.cache_clear()
    try:
        assert precision_module.cpu_computes_bf16_natively() is native
        assert resolve_native("native", "cpu") == ("bf16" if native else "fp32")
        assert cpu_class() == ("amx" if amx else "avx512_bf16" if avx512_bf16 else "fp32")
    finally:
        precision_module.cpu_computes_bf16_natively.cache_clear()


def test_a_torch_without_the_probes_is_taken_for_a_cpu_without_bf16(monkeypatch):
    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.delattr(torch.cpu, name, raising=False)
    precision_module.cpu_computes_bf16_natively.cache_clear()
    try:
        assert precision_module.cpu_computes_bf16_natively() is False
    finally:
        precision_module.cpu_computes_bf16_natively.cache_clear()


@pytest.fixture(params=[True, False], ids=["bf16-cpu", "fp32-cpu"])
def amx(request, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_computes_bf16_natively", lambda: request.param)
    return request.param


def test_native_is_bf16_on_a_cpu_with_amx_fp32_on_others_and_auto_on_a_gpu(amx, monkeypatch):
    assert resolve_native("native", "cpu") == ("bf16" if amx else "fp32")
    assert resolve_native("native", "cuda:1") == "auto"
    for device in (None, "auto"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert resolve_native("native", device) == ("bf16" if amx else "fp32")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert resolve_native("native", device) == "auto"
    for other in ("auto", "fp32", "fp16", "bf16"):
        assert resolve_native(other, "cpu") == other


def test_native_in_a_config_file_reaches_the_agent_the_scorer_and_the_encoder(amx, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "agent": {"model": "default", "precision": "native"}, "agent_rollout": {"qa": "dev.jsonl"},
        "agent_sft": {"qa": "train.jsonl"},
        "mine_run": {"scorer": {"precision": "native"}},
        "index_build": {"out": "index", "encoder": {"precision": "native"}},
        "retriever_train": {"precision": "native", "data": "rows.jsonl", "out": "model"}}))
    wanted = "bf16" if amx else "fp32"
    assert build_config(RolloutConfig, "agent_rollout", None, str(path)).agent.precision == wanted
    assert build_config(WarmStartConfig, "agent_sft", None, str(path)).agent.precision == wanted
    mine = build_config(MineJobConfig, "mine_run", None, str(path), set_by_caller=("trajectories",))
    assert (mine.agent.precision, mine.scorer.precision) == (wanted, wanted)
    assert build_config(IndexBuildConfig, "index_build", None, str(path)).encoder.precision == wanted
    # a device given after the precision still decides: the settings are resolved once they are final
    assert LLMConfig(precision="native", device="cuda").precision == "auto"
    # retriever training: bf16 autocast on an AMX CPU (its result cache keyed by that), fp32 on others, and a config
    # made for a GPU trains as auto does
    train = build_config(RetrieverTrainConfig, "retriever_train", None, str(path))
    assert train.precision == wanted
    assert _precision(train, on_gpu=False) == {"fp16": False, "bf16": amx}
    assert _precision(RetrieverTrainConfig(precision="auto"), on_gpu=True) == {"fp16": True, "bf16": False}
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        _precision(RetrieverTrainConfig(precision="fp16"), on_gpu=False)


def test_the_warm_start_cache_tells_a_bf16_agent_from_an_fp32_one(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_computes_bf16_natively", lambda: True)
    train = WarmStartConfig().train
    native, fp32 = LLMConfig(precision="native", device="cpu"), LLMConfig(precision="fp32", device="cpu")
    assert _cache_key("examples", "weights", train, native) != _cache_key("examples", "weights", train, fp32)
    assert _cache_key("examples", "weights", train, native) == _cache_key(
        "examples", "weights", train, LLMConfig(precision="bf16", device="cpu"))


def test_a_native_encoder_on_an_amx_cpu_holds_bf16_weights_and_embeds_close_to_fp32(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_computes_bf16_natively", lambda: True)
    texts = ["the capital of france", "a chess opening", "who wrote hamlet", "rainfall in the amazon basin"]
    native = Encoder(EncoderConfig(model=tiny_model_dir, precision="native", device="cpu"))
    fp32 = Encoder(EncoderConfig(model=tiny_model_dir, precision="fp32", device="cpu"))
    assert {p.dtype for p in native.model.parameters()} == {torch.bfloat16}
    assert native.settings.fingerprint == fp32.settings.fingerprint, "the same weights: one embedding cache"
    a, b = native.encode_passages(texts), fp32.encode_passages(texts)
    assert a.dtype == np.float32 and a.shape == b.shape
    assert np.all(np.sum(a * b, axis=1) > 0.98), "unit vectors within bf16's rounding of fp32's"


def test_a_trained_model_is_indexed_with_the_base_encoders_machine_settings_and_its_own_conventions(amx):
    """The demo and the loop index R_i with `for_model`: bf16 (or fp32) as the base index was built, the trained
    model's own prefixes and composition (from its folder), not the base config's."""
    base = EncoderConfig(model="default", precision="native", device="cpu", batch_size=32, devices=["cpu", "cpu"],
                         query_prefix="query: ", composition="query")
    trained = base.for_model("runs/x/retriever/model")
    assert (trained.model, trained.precision, trained.device, trained.batch_size, trained.devices) == (
        "runs/x/retriever/model", "bf16" if amx else "fp32", "cpu", 32, ["cpu", "cpu"])
    assert trained.query_prefix is None and trained.composition is None


def _documented_roles() -> dict[str, tuple[str, str]]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    table = text[text.index("| role | where |"):].split("\n\n")[0].splitlines()[2:]
    cells = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in table]
    return {row[0]: (row[2], row[3]) for row in cells}


@pytest.mark.parametrize("bf16_gpu", [True, False], ids=["gpu-with-bf16", "gpu-without-bf16"])
def test_auto_is_fp32_on_a_cpu_and_by_role_on_a_gpu_as_docs_configuration_says(bf16_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16_gpu)
    documented = _documented_roles()
    assert documented.keys() == ROLES.keys()
    for role, (with_bf16, without) in documented.items():
        assert resolve("auto", "cpu", role) == "fp32"
        assert resolve("auto", "cuda:0", role) == (with_bf16 if bf16_gpu else without)
        assert resolve("bfloat16", "cuda", role) == "bf16"  # the previous release's spelling
        assert resolve("fp32", "cuda", role) == "fp32"


def test_explicit_precisions_pass_and_what_cannot_run_is_refused_by_name(amx):
    assert resolve("native", "cpu", "encoder") == ("bf16" if amx else "fp32")
    assert resolve("fp16", "cpu", "llm") == "fp16" and resolve("fp16", "cuda", "sft") == "fp16"
    for role in ("retriever_training", "sft"):
        with pytest.raises(ValueError, match=f"fp16 needs a GPU for {role.replace('_', ' ')}"):
            resolve("fp16", "cpu", role)
    with pytest.raises(ValueError, match="RL trainer scales no loss"):
        resolve("fp16", "cuda", "rl")
    with pytest.raises(ValueError, match="unknown precision role 'reranker'"):
        resolve("auto", "cpu", "reranker")
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        resolve("int8", "cpu", "llm")
