"""Break-glass (F2, F3): one-time, expiring, scoped, ledgered as a bypass, alerting, revoked by itself."""

from __future__ import annotations

from datetime import timedelta

from gateway_testkit import Api, job_spec, ledger_entries

from gateway.metrics import REGISTRY
from gateway.store.models import Job
from gateway.store.schema import create_schema
from gateway.store.service_tables import BreakGlassGrant

GRANT = {"projects": ["vision"], "actions": ["job.stop"], "duration_minutes": 30, "max_uses": 2,
         "reason": "node 7 wedged, stopping jobs by hand", "ticket": "INC-4242"}


def running_job(api: Api, project: str = "vision", who: str = "alice") -> str:
    job_id = api.post("/v1/jobs", who, json=job_spec(project=project)).json()["id"]
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state = "running"
        job.placement = [{"node": "demo-node-1", "gpus": [0, 1]}]
    return job_id


def grant(api: Api, **overrides: object) -> dict:
    r = api.post("/v1/break-glass", "dave", json={**GRANT, **overrides})
    assert r.status_code == 201, r.text
    return r.json()


def use(api: Api, credential: str, job_id: str):
    return api.client.post(f"/v1/jobs/{job_id}/stop", json={"reason": "break-glass stop of a wedged job"},
                           headers={"Authorization": f"Bearer {credential}"})


def revocations(api: Api, grant_id: str) -> list[dict]:
    return [e["body"] for e in ledger_entries(api) if e["kind"] == "break_glass"
            and e["body"].get("grant_id") == grant_id and e["body"]["result"] == "revoked"]


def test_a_grant_stands_in_for_the_second_person_and_every_use_is_a_ledgered_alerting_bypass(api: Api) -> None:
    g = grant(api)
    assert g["state"] == "active" and g["credential"].startswith("jgb_")
    job_id = running_job(api)
    counted = REGISTRY.get_sample_value("jobgate_break_glass_uses_total", {"holder": "dave"}) or 0.0
    r = use(api, g["credential"], job_id)
    assert r.status_code == 202, r.text
    assert r.json()["decision"]["effect"] == "allow" and "F2.break_glass" in r.json()["decision"]["rules"]
    assert r.json()["job"]["state"] == "stop_requested"
    decision = next(e for e in ledger_entries(api) if e["seq"] == r.json()["decision"]["ledger_seq"])["body"]
    assert decision["bypass"] is True and decision["actor"]["id"] == "dave"
    assert decision["policy_decision"]["effect"] == "needs_approval"
    metrics = api.client.get("/metrics").text
    assert f'jobgate_break_glass_uses_total{{holder="dave"}} {counted + 1}' in metrics


def test_a_grant_stands_in_for_one_person_only_so_a_request_needing_more_waits_for_them(api: Api) -> None:
    """Stopping another's external-rights job needs two more people (A4 and R3's notch). The grant used to turn
    any number of missing approvals into an allow, so one on-call engineer and the grant's approver could do
    what the policy asks three people for."""
    job_id = running_job(api)
    with api.gateway.db.transaction() as s:
        s.get(Job, job_id).external_rights = True
    r = use(api, grant(api)["credential"], job_id)
    assert r.status_code == 202, r.text
    decision = r.json()["decision"]
    assert decision["effect"] == "needs_approval" and decision["approvals_required"]["count"] == 2
    assert "F2.break_glass" not in decision["rules"] and r.json()["approval_id"]
    assert decision["reasons"][0].endswith("stands in for one second person, not the 2 this request needs;"
                                           " it waits for them")
    with api.gateway.db.transaction() as s:
        assert s.get(Job, job_id).state == "running"
    recorded = next(e for e in ledger_entries(api) if e["seq"] == decision["ledger_seq"])["body"]
    assert recorded["bypass"] is True and recorded["policy_decision"]["approvals_required"]["count"] == 2


def test_a_spent_credential_is_refused_and_its_revocation_ledgered(api: Api) -> None:
    g = grant(api, max_uses=1)
    assert use(api, g["credential"], running_job(api)).status_code == 202
    r = use(api, g["credential"], running_job(api))
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert [b["because"] for b in revocations(api, g["id"])] == ["uses_exhausted"]


def test_an_expired_credential_gets_401_and_a_revocation_entry(api: Api) -> None:
    g = grant(api)
    with api.gateway.db.transaction() as s:
        row = s.get(BreakGlassGrant, g["id"])
        row.expires_at = row.activated_at - timedelta(seconds=1)
    r = use(api, g["credential"], running_job(api))
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    assert [b["because"] for b in revocations(api, g["id"])] == ["expired"]
    assert use(api, g["credential"], running_job(api)).status_code == 401
    assert len(revocations(api, g["id"])) == 1  # recorded once


def test_expiry_is_revoked_by_the_sweep_even_if_never_used_again(api: Api) -> None:
    from gateway.access.breakglass import sweep_expired

    g = grant(api)
    with api.gateway.db.transaction() as s:
        row = s.get(BreakGlassGrant, g["id"])
        row.expires_at = row.activated_at - timedelta(seconds=1)
    with api.gateway.transaction() as s:
        assert sweep_expired(api.gateway, s) == 1
    assert [b["because"] for b in revocations(api, g["id"])] == ["expired"]


def test_a_grant_is_scoped_to_its_projects_and_actions(api: Api) -> None:
    g = grant(api)
    r = use(api, g["credential"], running_job(api, project="speech", who="mallory"))
    assert r.status_code == 403 and "scoped to projects" in r.json()["detail"]


def test_bad_requests_are_refused(api: Api) -> None:
    assert api.post("/v1/break-glass", "dave", json={**GRANT, "duration_minutes": 241}).status_code == 422
    assert api.post("/v1/break-glass", "dave", json={k: v for k, v in GRANT.items() if k != "ticket"}
                    ).status_code == 422
    r = api.post("/v1/break-glass", "alice", json=GRANT)
    assert r.status_code == 403, r.text  # only on-call may ask for a grant
    assert api.client.post("/v1/jobs/j-x/stop", json={"reason": "xyz"},
                           headers={"Authorization": "Bearer jgb_" + "x" * 43}).status_code == 401


def test_a_grant_naming_an_action_that_does_not_exist_is_refused_before_anyone_approves_it(api: Api) -> None:
    # A typo would be granted, and then the credential would stop nothing in the middle of an incident.
    r = api.post("/v1/break-glass", "dave", json={**GRANT, "actions": ["job.stpo"]})
    assert r.status_code == 422, r.text
    assert "unknown action(s): job.stpo" in r.json()["detail"]
    assert api.get("/v1/break-glass", "dave").json()["grants"] == []


def test_holder_revokes_early_and_the_credential_stops_working(api: Api) -> None:
    g = grant(api)
    r = api.post(f"/v1/break-glass/{g['id']}/revoke", "dave")
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    assert use(api, g["credential"], running_job(api)).status_code == 401
    assert [b["because"] for b in revocations(api, g["id"])] == ["revoked"]


def test_policy_can_require_a_second_on_call_before_the_credential_works(tmp_path) -> None:
    import json
    import shutil
    from datetime import UTC, datetime
    from pathlib import Path

    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.demo import seed_demo
    from gateway.settings import Settings
    from gateway.store.db import Database
    from gateway.store.models import RoleBinding

    policies = tmp_path / "policies"
    shutil.copytree(Path(__file__).resolve().parents[3] / "policies", policies)
    data = json.loads((policies / "data.json").read_text())
    data["breakglass"]["second_oncall_approvals"] = 1
    (policies / "data.json").write_text(json.dumps(data))
    settings = Settings(data_dir=tmp_path / "var", policies_dir=policies)
    settings.data_dir.mkdir()
    db = Database(settings.resolved_database_url())
    create_schema(db.engine)
    with db.transaction() as s:
        seed_demo(s, settings.data_dir)
        s.add(RoleBinding(principal_id="erin", role="oncall", project="*", created_at=datetime.now(UTC)))
    db.close()
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        api = Api(client, tokens, settings)
        g = grant(api)
        assert g["state"] == "pending" and g["approval_id"]
        job_id = running_job(api)
        r = use(api, g["credential"], job_id)
        assert r.status_code == 401 and "waiting" in r.json()["detail"]
        assert api.post(f"/v1/approvals/{g['approval_id']}/approve", "dave").status_code == 403  # not himself
        assert api.post(f"/v1/approvals/{g['approval_id']}/approve", "erin").json()["state"] == "executed"
        assert use(api, g["credential"], job_id).status_code == 202
