"""The gateway deciding through OPA: through an OPA server (tests/gateway/decisions/policy/opa_server.py, OPA's
evaluator behind OPA's REST API, a real HTTP server), decisions flow as with the embedded engine, and with the server
stopped every mutation is denied "policy unavailable" and that denial is in the ledger (fail closed); with OPA
in-process (`--policy-engine opa-inprocess`), decisions and reloads are OPA's."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec

from gateway.app import create_app
from gateway.decisions.policy.opa import OpaEngine
from gateway.decisions.policy.opa_inprocess import OpaInProcessEngine
from gateway.demo import prepare_demo
from gateway.settings import REPO_POLICIES, Settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("opa_golib")]

_spec = importlib.util.spec_from_file_location(
    "opa_server_for_gateway", Path(__file__).resolve().parent / "opa_server.py")
assert _spec and _spec.loader
opa_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(opa_server)


@pytest.fixture
def opa_api(tmp_path: Path) -> Iterator[tuple[Api, Any]]:
    server = opa_server.OpaServerProcess()
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


# Submissions to the batch queue refused, live ones only (the table cases name no job id, so the set passes its
# own tests).
BATCH_CLOSED = """
denials contains {"rule": "T.batch_closed", "reason": "the batch queue is closed"} if {
	input.action == "job.submit"
	input.params.job_id
	input.params.queue == "batch"
}
"""


def test_gateway_decides_with_opa_in_process_and_reloads_onto_it(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    settings = Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_engine="opa-inprocess",
                        policy_watch_interval_s=0)
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        api = Api(client, tokens, settings)
        assert isinstance(api.gateway.policy, OpaInProcessEngine)
        assert api.get("/v1/policy", "sam").json()["engine"] == "opa-inprocess"
        job = api.post("/v1/jobs", "alice", json=job_spec(queue="batch"))
        assert job.status_code == 201, job.text
        r = api.post(f"/v1/jobs/{job.json()['id']}/stop", "mallory", json={"reason": "mine"})
        assert r.status_code == 403 and "job.stop.any" in r.json()["detail"]

        (policies / "guards.rego").write_text((policies / "guards.rego").read_text() + BATCH_CLOSED)
        reloaded = api.post("/v1/policy/reload", "sam")
        assert reloaded.status_code == 200, reloaded.text
        assert isinstance(api.gateway.policy, OpaInProcessEngine)
        refused = api.post("/v1/jobs", "alice", json=job_spec(queue="batch"))
        assert refused.status_code == 403 and refused.json()["rules"] == ["T.batch_closed"], refused.text
