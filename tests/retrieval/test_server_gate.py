"""Hostile requests against a real server (uvicorn on a loopback port, the package's BM25 index): each is refused
before any search with the status and message its rule gives (`agentic_retriever.server.gate`, the cost cap of
`schema.limit_violation`, the swap roots of `slot`), while ordinary Search-R1 clients keep working."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import httpx
import pytest

from agentic_retriever.base.client import HttpRetrievalClient
from agentic_retriever.server import create_app, running_server
from agentic_retriever.server.app import ServerThread
from agentic_retriever.server.gate import check_exposure, is_loopback
from tests.faults.harness import ROOT

SEARCH = {"queries": ["river castle"], "topk": 2}


def _searched(app) -> int:
    return app.state.batcher.stats.queries


def test_a_search_r1_client_without_a_key_keeps_working_on_loopback(bm25):
    with running_server(bm25) as url:
        plain = httpx.post(f"{url}/retrieve", json=SEARCH)  # what Search-R1's requests.post(json=...) sends
        assert plain.status_code == 200 and len(plain.json()["result"][0]) == 2
        assert HttpRetrievalClient(url, api_key="").retrieve(["river castle"], 2)[0]


def test_a_request_for_too_many_passages_is_refused_before_any_search(bm25):
    app = create_app(bm25, max_passages_per_request=1000)
    with ServerThread(app) as url:
        huge = httpx.post(f"{url}/retrieve", json={"queries": ["q"] * 10_000, "topk": 1000})
        assert huge.status_code == 413
        assert "10000 queries x topk 1000 = 10000000, the limit is 1000" in huge.json()["detail"]
        assert httpx.post(f"{url}/retrieve", json={"queries": ["q"], "topk": 1001}).status_code == 422
        assert _searched(app) == 0  # nothing was searched for either
        assert httpx.post(f"{url}/retrieve", json={"queries": ["q"] * 10, "topk": 100}).status_code == 200


def test_a_rebound_host_name_and_a_cross_site_text_post_are_refused(bm25):
    app = create_app(bm25, loopback_only_hosts=True)  # as serve() makes it for a loopback bind
    with ServerThread(app) as url:
        rebound = httpx.post(f"{url}/retrieve", json=SEARCH, headers={"Host": "attacker.example:8000"})
        assert rebound.status_code == 421 and "localhost only" in rebound.json()["detail"]
        assert httpx.get(f"{url}/health", headers={"Host": "attacker.example"}).status_code == 421
        for host in ("localhost:1234", "127.0.0.1", "[::1]:80"):
            assert httpx.get(f"{url}/livez", headers={"Host": host}).status_code == 200, host
        simple = httpx.post(f"{url}/retrieve", content=json.dumps(SEARCH), headers={"Content-Type": "text/plain"})
        assert simple.status_code == 415 and "application/json" in simple.json()["detail"]
        assert _searched(app) == 0


def test_with_an_api_key_every_path_but_liveness_needs_it(bm25, monkeypatch):
    monkeypatch.delenv("AGENTIC_RETRIEVER_API_KEY", raising=False)
    app = create_app(bm25, api_key="s3cret", admin_token="admin")
    with ServerThread(app) as url:
        for method, path in (("POST", "/retrieve"), ("GET", "/health"), ("GET", "/docs"), ("GET", "/openapi.json"),
                             ("POST", "/admin/swap-index")):
            for headers in ({}, {"X-API-Key": "wrong"}):
                answer = httpx.request(method, f"{url}{path}", json=SEARCH, headers=headers)
                assert answer.status_code == 401, (path, headers)
                assert answer.json() == {"detail": "missing or wrong API key: send the header 'X-API-Key: KEY'"}
        assert httpx.get(f"{url}/livez").json() == {"status": "ok"}
        assert _searched(app) == 0
        assert HttpRetrievalClient(url, api_key="s3cret").retrieve(["river castle"], 2)[0]
        monkeypatch.setenv("AGENTIC_RETRIEVER_API_KEY", "s3cret")  # the loop's children read it from there
        assert HttpRetrievalClient(url).retrieve(["river castle"], 2)[0]


def test_health_names_the_index_folder_in_full_to_admin_callers_only(bm25):
    with running_server(bm25, admin_token="admin") as url:
        anyone = httpx.get(f"{url}/health").json()
        assert anyone["index_dir"] == "bm25" and "/" not in json.dumps(anyone["index_dir"])
        admin = httpx.get(f"{url}/health", headers={"Authorization": "Bearer admin"}).json()
        assert admin["index_dir"] == str(bm25.index_dir)


def test_a_swap_outside_the_index_roots_is_refused_without_saying_what_is_there(bm25, tmp_path):
    planted = tmp_path / "planted"
    shutil.copytree(bm25.index_dir, planted)  # a whole index, but outside the roots
    with running_server(bm25, admin_token="admin") as url:
        def swap(folder):
            return httpx.post(f"{url}/admin/swap-index", json={"index": str(folder)},
                              headers={"Authorization": "Bearer admin"})

        answers = [swap(folder) for folder in (planted, tmp_path / "missing", "/etc")]
        assert [a.status_code for a in answers] == [403, 403, 403]
        details = [a.json()["detail"].replace(str(folder), "FOLDER")
                   for a, folder in zip(answers, (planted, tmp_path / "missing", "/etc"))]
        assert len(set(details)) == 1 and "not below the folders this service may open" in details[0]
        assert httpx.get(f"{url}/health").json()["generation"] == 0


def test_a_service_off_loopback_needs_a_key_or_an_explicit_opt_out():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(ValueError, match="anyone who reaches this port"):
        check_exposure("0.0.0.0", None, False)
    check_exposure("0.0.0.0", "key", False)
    check_exposure("0.0.0.0", None, True)
    cli = subprocess.run([sys.executable, "-m", "agentic_retriever.app.cli", "index", "serve", "--index", "missing",
                          "--host", "0.0.0.0"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert cli.returncode == 2 and "without an API key" in cli.stderr  # refused before the index is opened
