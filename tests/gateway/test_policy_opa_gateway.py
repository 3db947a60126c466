"""The gateway deciding through an OPA server (the stand-in of tests/policy/opa_standin.py, a real HTTP
server): decisions flow as with the embedded engine; with the server stopped every mutation is denied
"policy unavailable" and that denial is in the ledger (fail closed)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec

from gateway.app import create_app
from gateway.decisions.policy.opa import OpaEngine
from gateway.demo import prepare_demo
from gateway.settings import Settings

pytestmark = pytest.mark.integration

_spec = importlib.util.spec_from_file_location(
    "opa_standin_for_gateway", Path(__file__).resolve().parents[1] / "policy" / "opa_standin.py")
assert _spec and _spec.loader
standin_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin_module)


@pytest.fixture
def opa_api(tmp_path: Path) -> Iterator[tuple[Api, Any]]:
    server = standin_module.StandInProcess()
    settings = Settings(data_dir=tmp_path, policy_engine="opa", opa_url=server.url, opa_timeout_s=0.5,
                        policy_watch_interval_s=0)
    prepare_demo(settings)
    tokens = json.loads((tmp_path / "demo-tokens.json").read_text())
    try:
        with TestClient(create_app(settings, run_scheduler=False)) as client:
            yield Api(client, tokens, settings), server
    finally:
        server.stop()


def test_gateway_decides_through_opa_and_fails_closed_when_it_is_gone(opa_api: tuple[Api, Any]) -> None:
    api, server = opa_api
    assert isinstance(api.gateway.policy, OpaEngine)
    assert api.get("/v1/policy", "sam").json()["engine"] == "opa"
    job = api.post("/v1/jobs", "alice", json=job_spec())
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    r = api.post(f"/v1/jobs/{job_id}/stop", "mallory", json={"reason": "mine"})
    assert r.status_code == 403 and "job.stop.any" in r.json()["detail"]

    server.stop()
    r = api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
    assert r.status_code == 403, r.text
    assert r.json()["rules"] == ["fail_closed"]
    assert r.json()["detail"].startswith("policy unavailable: the OPA server at ")
    entry = api.gateway.ledger.entry(r.json()["ledger_seq"])
    decision = entry.value["body"]["decision"]
    assert decision["effect"] == "deny" and decision["rules"] == ["fail_closed"]
    assert api.get(f"/v1/jobs/{job_id}", "alice").status_code == 403  # reads fail closed too
