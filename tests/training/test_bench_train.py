"""`benchmarks/bench_train.py --lora-rank`: full fine-tuning against LoRA on one decoder backbone, each run its own
process, as its command line runs it (tiny sizes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fakes import synthetic_rows, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_full_against_lora_reports_speed_memory_and_trainable_parameters(tmp_path, tiny_decoder_embedder_dir):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", synthetic_rows(40))
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_train.py", "--lora-only", "--lora-rank", "4", "--lora-model",
         tiny_decoder_embedder_dir, "--corpus", str(corpus), "--batch", "2", "--steps", "2", "--negatives", "1",
         "--max-length", "16", "--repeats", "1", "--json", str(tmp_path / "train.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lora = json.loads((tmp_path / "train.json").read_text())["results"]["lora"]
    full, adapter = (runs[0] for runs in lora["runs"].values())
    assert list(lora["runs"]) == ["full", "lora r=4"] and lora["model"] == tiny_decoder_embedder_dir
    assert full["trainable_parameters"] == full["parameters"] < adapter["parameters"]  # the adapter adds its own
    assert 0 < adapter["trainable_parameters"] < full["trainable_parameters"] / 5
    assert lora["speedup"] > 0 and all(run["peak_rss_mib"] > 0 for run in (full, adapter))
    assert "full vs LoRA on" in done.stdout
