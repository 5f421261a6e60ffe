"""Run every ``bench_*.py`` beside this file in turn (``make bench``), each in its own process.

Prints each benchmark's output as it comes, then a summary of exit codes, times and RATIO lines; exits
non-zero if any benchmark failed. ``--json OUT`` writes that summary. Not a benchmark itself: no target.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from _common import base_parser, describe_device, device_line, write_json

HERE = Path(__file__).resolve().parent


def run(script: Path, extra: list[str]) -> tuple[int, float, list[str]]:
    """Run one benchmark, echoing its stdout line by line; returns (exit code, seconds, lines starting "ratio")."""
    started = time.perf_counter()
    ratios = []
    with subprocess.Popen([sys.executable, str(script), *extra], cwd=HERE.parent, stdout=subprocess.PIPE,
                          text=True, bufsize=1) as process:
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.lower().startswith("ratio"):
                ratios.append(line.rstrip())
    return process.returncode, time.perf_counter() - started, ratios


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("only", nargs="*", help="run only the benchmarks whose name contains one of these")
    parser.add_argument("--json-dir", help="have each benchmark write its figures to DIR/<name>.json")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args()
    scripts = sorted(p for p in HERE.glob("bench_*.py") if not args.only or any(s in p.stem for s in args.only))
    if args.list or not scripts:
        print("\n".join(p.name for p in scripts) or "no benchmark matched")
        sys.exit(0 if scripts else 1)
    json_dir = Path(args.json_dir) if args.json_dir else None
    device = describe_device()
    print(device_line(device))
    summary = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        extra = ["--json", str(json_dir / f"{script.stem}.json")] if json_dir else []
        summary.append((script.name, *run(script, extra)))
    print("\n=== summary ===")
    for name, code, seconds, ratios in summary:
        print(f"  {name:28s} {'ok' if code == 0 else f'FAILED (exit {code})':18s} {seconds:7.1f}s")
        for ratio in ratios:
            print(f"      {ratio}")
    failed = [name for name, code, *_ in summary if code != 0]
    write_json(args.json, "run_all", args, device, {
        name: {"exit_code": code, "seconds": seconds, "ratio_lines": ratios} for name, code, seconds, ratios in summary})
    if failed:
        print(f"{len(failed)} of {len(summary)} benchmarks failed: {', '.join(failed)}")
        sys.exit(1)
    print(f"all {len(summary)} benchmarks passed")


if __name__ == "__main__":
    main()
