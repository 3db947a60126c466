"""A reload through an OPA server is all or nothing for the decisions it makes: while a set is being pushed, and
after a push that failed part-way, the server holds pieces of two sets, and a decision taken then would be
recorded under a hash whose files never made it. The engine now refuses (fail closed) any answer the server
does not give under the engine's own policy hash, and a failed reload puts the previous set back."""

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
from gateway.demo import prepare_demo
from gateway.settings import REPO_POLICIES, Settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("opa_golib")]

_spec = importlib.util.spec_from_file_location(
    "opa_server_for_atomic_reload", Path(__file__).resolve().parent / "opa_server.py")
assert _spec and _spec.loader
opa_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(opa_server)

# Live submissions (the gateway gives them a job id; the table cases do not, so the set passes its own tests)
# are frozen while data.freeze.submissions is true.
FREEZE = """
# data["external_rights_extra_approvals/note"] says why R3 is one notch stricter.
denials contains {"rule": "T.freeze", "reason": "submissions are frozen"} if {
	input.action == "job.submit"
	input.params.job_id
	data.freeze.submissions == true
}
"""


@pytest.fixture
def opa_papi(tmp_path: Path) -> Iterator[tuple[Api, Path]]:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    server = opa_server.OpaServerProcess()
    settings = Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_engine="opa", opa_url=server.url,
                        opa_timeout_s=2.0, policy_watch_interval_s=0)
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    try:
        with TestClient(create_app(settings, run_scheduler=False)) as client:
            yield Api(client, tokens, settings), policies
    finally:
        server.stop()


def freeze_with_a_data_key_the_server_refuses(policies: Path) -> None:
    """The freeze rule, its switch, and last a data key the server cannot store (a path through a number), so
    the push fails after the modules and the switch are on the server."""
    (policies / "guards.rego").write_text((policies / "guards.rego").read_text() + FREEZE)
    data: dict[str, Any] = json.loads((policies / "data.json").read_text())
    data["freeze"] = {"submissions": True}
    data["external_rights_extra_approvals/note"] = "one notch stricter"
    (policies / "data.json").write_text(json.dumps(data, indent=1))


def test_a_push_that_fails_part_way_leaves_the_previous_set_deciding(opa_papi: tuple[Api, Path]) -> None:
    api, policies = opa_papi
    old = api.get("/v1/policy", "sam").json()["policy_hash"]
    freeze_with_a_data_key_the_server_refuses(policies)
    r = api.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    assert r.json()["active_hash"] == old and any(e.startswith("opa:0:") for e in r.json()["errors"]), r.text
    # The set said to be active decides, and the ledger names it: no freeze rule exists in it.
    submitted = api.post("/v1/jobs", "alice", json=job_spec())
    assert submitted.status_code == 201, submitted.text
    assert api.get("/v1/policy", "sam").json()["policy_hash"] == old


def test_an_engine_whose_set_is_no_longer_on_the_server_fails_closed(tmp_path: Path) -> None:
    """What a decision taken mid-push sees: the server holds another set's pieces. Before, the engine
    answered with them under its own hash."""
    from gateway.decisions.policy.engine import FAIL_CLOSED_RULE, RoleBinding
    from gateway.decisions.policy.loader import load_policy_set
    from gateway.decisions.policy.opa import OpaEngine
    from gateway.decisions.policy.testing import expand_input

    candidate = tmp_path / "candidate"
    shutil.copytree(REPO_POLICIES, candidate)
    (candidate / "guards.rego").write_text((candidate / "guards.rego").read_text() + FREEZE)
    server = opa_server.OpaServerProcess()
    try:
        bindings = [RoleBinding("alice", "researcher", "vision")]
        active = OpaEngine(load_policy_set(REPO_POLICIES), bindings, url=server.url, timeout_s=2.0)
        request = expand_input({"action": "job.submit", "actor": "alice", "project": "vision",
                                "params": {"job_id": "j-1", "queue": "normal", "gpus": 2}})
        assert active.decide(request).effect == "allow"
        other = OpaEngine(load_policy_set(candidate), bindings, url=server.url, timeout_s=2.0)
        decision = active.decide(request)
        assert decision.effect == "deny" and decision.rules == (FAIL_CLOSED_RULE,)
        assert f"holds policy set {other.policy_hash[:12]}, not {active.policy_hash[:12]}" in decision.reasons[0]
        active.push()  # what a failed reload does: the active set goes back
        assert active.decide(request).effect == "allow"
        active.close()
        other.close()
    finally:
        server.stop()
