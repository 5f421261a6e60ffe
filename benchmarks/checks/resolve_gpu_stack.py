"""Does the GPU dependency set resolve? pip's own resolver over this project's GPU extras with the constraints file.

    python benchmarks/checks/resolve_gpu_stack.py                        # python3.12, extras verl,vllm,faiss-gpu
    python benchmarks/checks/resolve_gpu_stack.py --python python3.11 --extras verl,vllm --out runs/resolve

Builds this project's wheel (``pip wheel --no-deps``), makes a throwaway virtual environment of the given Python
(the GPU host's is 3.12), and runs ``pip install --dry-run --ignore-installed --report`` of
``agentic-retriever[EXTRAS]`` with ``-c constraints/verl-0.9.1-gpu.txt`` (torch 2.11.0, vllm 0.24.0,
transformers 5.9.0, verl 0.9.1: what verl 0.9.1 pins in its own ``vllm`` extra). Nothing is installed. It resolves
for this machine's platform (Linux x86_64): pip's ``--platform`` needs ``--only-binary=:all:``, which would refuse
sdist-only packages the stack needs (antlr4-python3-runtime 4.9.3 under hydra-core) and resolve a different set.

Writes ``OUT/report.json`` (pip's installation report) and ``OUT/resolved.json`` (the versions of the packages that
matter, the command, the Python); exits 1 when pip cannot resolve, or when it resolved a version the constraints
forbid. The figures and the command go in benchmarks/RESULTS.md ("The GPU dependency set").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO_ROOT / "constraints" / "verl-0.9.1-gpu.txt"
#: The packages whose resolved versions are reported (the pinned ones and what our code imports of the stack).
WATCHED = ("torch", "vllm", "transformers", "verl", "sentence-transformers", "transferqueue", "tensordict", "ray",
           "hydra-core", "omegaconf", "faiss-gpu-cu12", "numpy", "peft", "accelerate", "datasets", "flashinfer-python")


def pinned_versions(path: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by lower-case name (comments and blank lines skipped)."""
    pins = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, sep, version = text.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"{path}:{number}: expected name==version, got {text!r}")
        pins[name.strip().lower()] = version.strip()
    return pins


def resolved_versions(report: dict) -> dict[str, str]:
    """Package name (lower case) -> version, from a ``pip install --report`` document."""
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, text=True, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3.12", help="the interpreter to resolve for (the GPU host's)")
    parser.add_argument("--extras", default="verl,vllm,faiss-gpu", help="this project's extras to resolve")
    parser.add_argument("--constraints", default=str(CONSTRAINTS), help="the constraints file")
    parser.add_argument("--out", default=str(REPO_ROOT / "runs" / "resolve_gpu_stack"), help="output folder")
    args = parser.parse_args(argv)
    if shutil.which(args.python) is None or subprocess.run([args.python, "-c", ""], capture_output=True).returncode:
        parser.error(f"--python {args.python}: no such interpreter here; give one (the GPU host runs Python 3.12)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pins = pinned_versions(Path(args.constraints))
    with tempfile.TemporaryDirectory(prefix="resolve-gpu-") as scratch:
        wheels, venv = Path(scratch) / "wheels", Path(scratch) / "venv"
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels),
              str(REPO_ROOT)], check=True)
        (wheel,) = wheels.glob("agentic_retriever-*.whl")
        _run([args.python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        _run([*pip, "install", "--quiet", "--upgrade", "pip"], check=True)
        version = _run([*pip, "--version"], check=True, capture_output=True).stdout.strip()
        command = [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(out / "report.json"),
                   "-c", str(Path(args.constraints).resolve()), f"{wheel}[{args.extras}]"]
        start = time.perf_counter()
        result = _run(command, capture_output=True)
        seconds = time.perf_counter() - start
    summary = {"python": args.python, "pip": version, "extras": args.extras, "constraints": pins,
               "command": "pip install --dry-run --ignore-installed --report report.json -c "
                          f"{Path(args.constraints).name} 'agentic-retriever[{args.extras}]'",
               "seconds": round(seconds, 1), "resolved": result.returncode == 0}
    if result.returncode != 0:
        summary["error"] = result.stderr.strip().splitlines()[-5:]
    else:
        versions = resolved_versions(json.loads((out / "report.json").read_text(encoding="utf-8")))
        summary["packages"] = len(versions)
        summary["versions"] = {name: versions.get(name) for name in WATCHED}
        summary["off_constraints"] = {name: versions.get(name) for name, pin in pins.items()
                                      if versions.get(name) not in (pin, None)}
        summary["resolved"] = not summary["off_constraints"]
    (out / "resolved.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))
    return 0 if summary["resolved"] else 1


if __name__ == "__main__":
    sys.exit(main())
