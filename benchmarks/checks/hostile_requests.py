"""Hostile requests against a real `agentic-retriever index serve` (a child process on a loopback port): what each
gets back, and the server's resident memory before and after, as a table for benchmarks/RESULTS.md.

    python benchmarks/checks/hostile_requests.py --index runs/quickstart/index/base

Every request is bounded (one each, a 30 s timeout) and goes to 127.0.0.1 only. The service's rules are
`agentic_retriever.server.gate` and the cost cap of `server.schema.limit_violation`; tests/retrieval/test_server_gate.py
pins each of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.fakes import free_port  # noqa: E402


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _start(index: str, port: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "agentic_retriever.app.cli", "index", "serve", "--index", index,
                                "--port", str(port), "--admin-token", "admin", *extra],
                               env=env or os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"index serve exited {process.returncode}: {process.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/livez", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise TimeoutError("index serve did not start")


def _row(name: str, response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text[:80]}
    answer = (f"{len(body['result'])} result list(s)" if "result" in body
              else body.get("detail") if isinstance(body.get("detail"), str) else json.dumps(body))
    return {"request": name, "status": response.status_code, "answer": answer[:110]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True, help="an index folder (any backend)")
    args = parser.parse_args()
    index = str(Path(args.index).resolve())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start(index, port)
    rows = []
    try:
        before = _rss_mb(server.pid)
        search = {"queries": ["who wrote hamlet"], "topk": 3}
        rows.append(_row("ordinary Search-R1 request, no key, on loopback", httpx.post(f"{url}/retrieve", json=search)))
        rows.append(_row("10,000 queries x topk 1,000 (10^7 passages)",
                         httpx.post(f"{url}/retrieve", json={"queries": ["q"] * 10_000, "topk": 1000}, timeout=30)))
        rows.append(_row("Host: attacker.example (DNS rebinding)",
                         httpx.post(f"{url}/retrieve", json=search, headers={"Host": "attacker.example"})))
        rows.append(_row("text/plain POST (a cross-site simple request)",
                         httpx.post(f"{url}/retrieve", content=json.dumps(search),
                                    headers={"Content-Type": "text/plain"})))
        rows.append(_row("GET /health without the admin token", httpx.get(f"{url}/health")))
        rows[-1]["answer"] = f"index_dir: {httpx.get(f'{url}/health').json()['index_dir']!r} (its name only)"
        with tempfile.TemporaryDirectory() as planted:
            shutil.copytree(index, Path(planted) / "idx")
            for name, folder in (("swap to a whole index outside the roots", Path(planted) / "idx"),
                                 ("swap to a folder that does not exist", Path(planted) / "missing"),
                                 ("swap to /etc", Path("/etc"))):
                rows.append(_row(name, httpx.post(f"{url}/admin/swap-index", json={"index": str(folder)},
                                                  headers={"Authorization": "Bearer admin"}, timeout=60)))
        rows.append(_row("ordinary request after all of the above", httpx.post(f"{url}/retrieve", json=search)))
        after = _rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    exposed = subprocess.run([sys.executable, "-m", "agentic_retriever.app.cli", "index", "serve", "--index", index,
                              "--host", "0.0.0.0", "--port", str(port)], capture_output=True, text=True, timeout=120,
                             env={k: v for k, v in os.environ.items() if k != "AGENTIC_RETRIEVER_API_KEY"})
    rows.append({"request": "index serve --host 0.0.0.0 without a key", "status": f"exit {exposed.returncode}",
                 "answer": exposed.stderr.strip().splitlines()[-1][:110]})
    keyed = _start(index, port, env=os.environ | {"AGENTIC_RETRIEVER_API_KEY": "k3y"})
    try:
        for name, headers in (("with a key set: no X-API-Key", {}), ("with a key set: a wrong X-API-Key",
                                                                        {"X-API-Key": "guess"}),
                              ("with a key set: the right X-API-Key", {"X-API-Key": "k3y"})):
            rows.append(_row(name, httpx.post(f"{url}/retrieve", json=search, headers=headers)))
        rows.append(_row("with a key set: GET /docs without it", httpx.get(f"{url}/docs")))
        rows.append(_row("with a key set: GET /livez without it", httpx.get(f"{url}/livez")))
    finally:
        keyed.terminate()
        keyed.wait(timeout=60)
    print("| request | status | answer |\n|---|---|---|")
    for row in rows:
        print(f"| {row['request']} | {row['status']} | {row['answer'].replace('|', '/')} |")
    print(f"\nserver RSS: {before:.0f} MB after start, {after:.0f} MB after the requests ({index})")


if __name__ == "__main__":
    main()
