"""How glibc's allocator settings change the memory and speed of CPU training: one child process per setting, the
same work in each (SmolLM2-135M, AdamW, causal-LM steps on random tokens of growing lengths, as SFT and RL steps
draw them).

    python benchmarks/bench_allocator.py [--steps 12] [--batch 4] [--thresholds default,1048576,131072]

``default`` is glibc's dynamic mmap threshold: it starts at 128 KiB and rises to the size of every mmapped block
freed (up to 32 MiB), so after the first steps a tensor of up to 32 MiB comes from the heap and, once freed, stays
in it, where a later allocation of another size seldom fits. A fixed threshold (``mallopt(M_MMAP_THRESHOLD)``, what
`agentic_retriever.base.memory_release.fix_mmap_threshold` sets) keeps every block above it mmapped, returned to the
system the moment it is freed. Each child prints its peak RSS (``VmHWM``), its RSS at the end and its seconds per
step; the table gives each setting's ratio against ``default``, run in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from _common import REPO_ROOT, cpu_model, usable_cores

CHILD = """
import ctypes, json, sys, time
threshold = sys.argv[1]
if threshold != "default":
    assert ctypes.CDLL("libc.so.6").mallopt(-3, int(threshold)) == 1  # M_MMAP_THRESHOLD
import torch
from transformers import AutoModelForCausalLM
from agentic_retriever.base.defaults import smollm2_hf_dir

steps, batch = int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(smollm2_hf_dir(), torch_dtype=torch.float32)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
lengths = [256 + (97 * step) % 512 for step in range(steps)]  # lengths vary from step to step
times = []
for length in lengths:
    ids = torch.randint(0, model.config.vocab_size, (batch, length))
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - start)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
kib = lambda key: int(status[key].split()[0])
print(json.dumps({"peak_rss_gib": kib("VmHWM") / 2**20, "end_rss_gib": kib("VmRSS") / 2**20,
                  "s_per_step": sum(times[2:]) / len(times[2:])}))
"""


def run(threshold: str, steps: int, batch: int) -> dict:
    finished = subprocess.run([sys.executable, "-c", CHILD, threshold, str(steps), str(batch)], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=True)
    return json.loads(finished.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--thresholds", default="default,1048576,131072")
    args = parser.parse_args()
    print(f"device: {cpu_model()}, {usable_cores()} cores; SmolLM2-135M, AdamW, {args.steps} steps of batch "
          f"{args.batch}, lengths 256-767", flush=True)
    results = {threshold: run(threshold, args.steps, args.batch) for threshold in args.thresholds.split(",")}
    base = results["default"] if "default" in results else next(iter(results.values()))
    print("| mmap threshold | peak RSS GiB | RSS at end GiB | s per step | peak vs default | time vs default |")
    print("|---|---:|---:|---:|---:|---:|")
    for threshold, r in results.items():
        print(f"| {threshold} | {r['peak_rss_gib']:.2f} | {r['end_rss_gib']:.2f} | {r['s_per_step']:.2f} | "
              f"{r['peak_rss_gib'] / base['peak_rss_gib']:.2f}x | {r['s_per_step'] / base['s_per_step']:.2f}x |")


if __name__ == "__main__":
    main()
