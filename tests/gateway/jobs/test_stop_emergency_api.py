"""Emergency stop decisions (C2, C6): who may ask, how many people decide per granularity, what is recorded."""

from __future__ import annotations

from gateway_testkit import Api
from stop_helpers import FakeAgent, ledger, running_job, stopped_evidence

from gateway.native.scheduler_loop import run_once


def body(kind: str, value: object, **extra: object) -> dict[str, object]:
    return {"scope": {"kind": kind, "value": value}, "trigger": "security", "reason": "leaked credentials",
            "grace_seconds": 0, **extra}


def test_job_level_by_on_call_runs_at_once_with_its_grace(api: Api, agent: FakeAgent) -> None:
    job_id, _ = running_job(api, agent)
    r = api.post("/v1/emergency-stops", "dave", json=body("job", job_id))
    assert r.status_code == 201, r.text
    es = r.json()
    assert es["state"] == "executing" and es["approval_id"] is None and es["deciders"] == ["dave"]
    (stop,) = [c for c in agent.take() if c["kind"] == "stop"]
    assert stop["params"]["grace_seconds"] == 0 and stop["job_id"] == job_id
    job = api.get(f"/v1/jobs/{job_id}", "alice").json()
    assert job["state"] == "stop_requested" and job["stop_request"]["emergency_id"] == es["id"]
    shown = api.get(f"/v1/emergency-stops/{es['id']}", "sam").json()
    assert shown["summary"]["in_progress"] == 1 and shown["jobs"][0]["category"] == "in_progress"


def test_scope_needs_the_other_role_and_freezes_its_targets(api: Api, agent: FakeAgent) -> None:
    a, _ = running_job(api, agent, environment="staging")
    b, _ = running_job(api, agent, environment="staging", labels={"team": "x"})
    other, _ = running_job(api, agent)  # research: out of scope
    r = api.post("/v1/emergency-stops", "sam", json=body("environment", "staging"))
    assert r.status_code == 202, r.text
    es = r.json()
    assert es["decision"]["effect"] == "needs_approval"
    assert es["decision"]["approvals_required"]["roles"] == ["oncall"]
    assert sorted(j["job_id"] for j in es["jobs"]) == sorted([a, b])
    # A job that appears in scope afterwards is not added: the approval is bound to the frozen ids.
    late, _ = running_job(api, agent, environment="staging")
    for outsider in ("carol", "alice", "sam"):
        assert api.post(f"/v1/approvals/{es['approval_id']}/approve", outsider).status_code == 403, outsider
    # The eligible approver finds it in their inbox (eligible by role, not by name).
    assert es["approval_id"] in [a["id"] for a in api.get("/v1/approvals", "dave").json()["approvals"]]
    done = api.post(f"/v1/approvals/{es['approval_id']}/approve", "dave", json={"comment": "agreed"})
    assert done.status_code == 200, done.text
    for job_id in (a, b):
        assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "stop_requested"
    for job_id in (other, late):
        assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "running"
    shown = api.get(f"/v1/emergency-stops/{es['id']}", "audrey").json()
    assert shown["deciders"] == ["sam", "dave"] and shown["state"] == "executing"
    recorded = [e["body"] for e in ledger(api) if e["kind"] == "emergency"]
    assert recorded[0]["trigger"] == "security" and recorded[0]["granularity"] == "scope"


def test_label_selector_and_workload_scopes(api: Api, agent: FakeAgent) -> None:
    x, _ = running_job(api, agent, labels={"team": "x", "tier": "1"})
    running_job(api, agent, labels={"team": "y"})
    r = api.post("/v1/emergency-stops", "dave", json=body("selector", {"team": "x"}))
    assert r.status_code == 202 and [j["job_id"] for j in r.json()["jobs"]] == [x]
    w1, _ = running_job(api, agent, workload="sweep-7")
    w2, _ = running_job(api, agent, workload="sweep-7")
    r = api.post("/v1/emergency-stops", "dave", json=body("workload", "sweep-7"))
    assert r.status_code == 202 and r.json()["granularity"] == "workload"
    assert sorted(j["job_id"] for j in r.json()["jobs"]) == sorted([w1, w2])


def test_queued_targets_are_cancelled(api: Api, agent: FakeAgent) -> None:
    running_job(api, agent, gpus_per_node=4)
    r = api.post("/v1/jobs", "alice", json={"name": "big", "project": "vision", "gpus_per_node": 8,
                                            "command": ["sleep", "1"], "environment": "production"})
    queued = r.json()["id"]
    run_once(api.gateway)
    assert api.get(f"/v1/jobs/{queued}", "alice").json()["state"] == "pending"
    r = api.post("/v1/emergency-stops", "dave", json=body("job", queued))
    es = r.json()
    assert es["summary"]["cancelled"] == 1 and es["state"] in ("executing", "done")
    assert api.get(f"/v1/emergency-stops/{es['id']}", "dave").json()["state"] == "done"


def test_refusals_are_clear(api: Api, agent: FakeAgent) -> None:
    job_id, _ = running_job(api, agent)
    r = api.post("/v1/emergency-stops", "alice", json=body("job", job_id))
    assert r.status_code == 403 and r.headers["content-type"].startswith("application/problem+json")
    assert "emergency.stop" in r.json()["detail"]
    bad_trigger = {**body("job", job_id), "trigger": "boredom"}
    assert api.post("/v1/emergency-stops", "dave", json=bad_trigger).status_code == 422
    assert api.post("/v1/emergency-stops", "dave", json=body("environment", "moon")).status_code == 422
    assert api.post("/v1/emergency-stops", "dave", json=body("job", "j-nope")).status_code == 404
    assert api.post("/v1/emergency-stops", "dave", json=body("workload", "none-such")).status_code == 422
    assert api.get("/v1/emergency-stops/es-nope", "dave").status_code == 404
    es = api.post("/v1/emergency-stops", "dave", json=body("job", job_id)).json()
    assert api.get(f"/v1/emergency-stops/{es['id']}", "alice").status_code == 403
    assert api.get("/v1/emergency-stops", "audrey").json()["emergency_stops"][0]["id"] == es["id"]


def test_tracking_is_not_stopping_a_scope_names_its_blind_spots_and_leaves_them_running(api: Api,
                                                                                      agent: FakeAgent) -> None:
    """C4 (see R5): a tracked job that declares itself not stoppable is listed as a blind spot before any
    incident (inventory), and an emergency stop of its scope neither sends it a stop nor counts it among what
    it stopped: the answer, the ledger and the finished stop all name it apart."""
    target, _ = running_job(api, agent, environment="staging")
    blind, _ = running_job(api, agent, environment="staging", stoppable=False)
    inventory = api.get("/v1/inventory", "dave", params={"environment": "staging"}).json()
    assert [b["jobs"] for b in inventory["blind_spots"]] == [[blind]]
    r = api.post("/v1/emergency-stops", "dave", json=body("environment", "staging"))
    assert r.status_code == 202, r.text
    es = r.json()
    named = [{"job_id": blind, "reason": "tracked but declared not stoppable (R5)", "state": "running"}]
    assert [j["job_id"] for j in es["jobs"]] == [target] and es["blind_spots"] == named
    assert (es["summary"]["targets"], es["summary"]["blind_spots"]) == (1, 1)
    assert api.post(f"/v1/approvals/{es['approval_id']}/approve", "sam", json={}).status_code == 200
    stops = [c for c in agent.take() if c["kind"] == "stop"]
    assert [c["job_id"] for c in stops] == [target]
    agent.report(target, "stopped", stops[0]["nonce"], evidence=stopped_evidence())
    done = api.get(f"/v1/emergency-stops/{es['id']}", "dave").json()
    assert done["state"] == "done" and done["blind_spots"] == named
    assert (done["summary"]["targets"], done["summary"]["accounted_for"], done["summary"]["blind_spots"]) == (1, 1, 1)
    assert api.get(f"/v1/jobs/{blind}", "alice").json()["state"] == "running"
    assert api.get(f"/v1/jobs/{target}", "alice").json()["state"] == "stopped"
    (asked,) = [e["body"] for e in ledger(api) if e["kind"] == "emergency" and "blind_spots" in e["body"]]
    assert asked["targets"] == [target] and asked["blind_spots"] == named


def test_not_stoppable_jobs_are_blind_spots(api: Api, agent: FakeAgent) -> None:
    """C4, R5: a scope holding only a job declared not stoppable is refused, naming it as a blind spot."""
    running_job(api, agent, environment="staging", stoppable=False)
    r = api.post("/v1/emergency-stops", "dave", json=body("environment", "staging"))
    assert r.status_code == 422 and r.json()["blind_spots"][0]["reason"].startswith("tracked but declared not")


def test_the_approvers_token_must_cover_every_project_the_stop_reaches(api: Api, agent: FakeAgent) -> None:
    """A scope stop names no project of its own: the projects of its frozen targets are the ones the second
    person's credential must cover (F1, M2)."""
    vision, _ = running_job(api, agent, environment="staging")
    speech, _ = running_job(api, agent, who="mallory", project="speech", environment="staging")
    es = api.post("/v1/emergency-stops", "sam", json=body("environment", "staging")).json()
    assert sorted(j["job_id"] for j in es["jobs"]) == sorted([vision, speech])

    def token(projects: list[str]) -> dict[str, str]:
        r = api.post("/v1/tokens", "dave", json={"purpose": "approve from the pager", "projects": projects,
                                                 "actions": ["approval.grant"], "expires_in_days": 1})
        assert r.status_code == 201, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}

    r = api.client.post(f"/v1/approvals/{es['approval_id']}/approve", headers=token(["vision"]))
    assert r.status_code == 403 and "speech is outside it" in r.json()["detail"], r.text
    for job_id, owner in ((vision, "alice"), (speech, "mallory")):
        assert api.get(f"/v1/jobs/{job_id}", owner).json()["state"] == "running"
    r = api.client.post(f"/v1/approvals/{es['approval_id']}/approve", headers=token(["vision", "speech"]))
    assert r.status_code == 200, r.text
    for job_id, owner in ((vision, "alice"), (speech, "mallory")):
        assert api.get(f"/v1/jobs/{job_id}", owner).json()["state"] == "stop_requested"
