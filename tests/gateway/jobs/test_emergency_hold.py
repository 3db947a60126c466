"""C2: a workload or scope emergency stop holds its scope, so that what was stopped (a runaway pipeline, a leaked
account) cannot simply be submitted again, until on-call lifts the hold with a written reason."""

from __future__ import annotations

from typing import Any

import pytest
from cli_testkit import jobgate
from gateway_testkit import Api, job_spec
from stop_helpers import FakeAgent, ledger, running_job, stopped_evidence


def stop_scope(api: Api, kind: str, value: object, **extra: object) -> dict[str, Any]:
    """On-call (dave) asks; a security reviewer (sam, the other role) approves: the stop is carried out."""
    r = api.post("/v1/emergency-stops", "dave", json={"scope": {"kind": kind, "value": value}, "trigger": "security",
                                                      "reason": "leaked credentials", "grace_seconds": 0, **extra})
    assert r.status_code == 202, r.text
    es = r.json()
    done = api.post(f"/v1/approvals/{es['approval_id']}/approve", "sam")
    assert done.status_code == 200, done.text
    return dict(api.get(f"/v1/emergency-stops/{es['id']}", "dave").json())


def submit(api: Api, **spec: Any) -> Any:
    return api.post("/v1/jobs", "alice", json=job_spec(**spec))


def job_count(api: Api) -> int:
    return len(api.get("/v1/jobs", "alice").json()["jobs"])


def test_a_workload_stop_refuses_new_jobs_of_the_workload_until_on_call_lifts_it(api: Api, agent: FakeAgent) -> None:
    running_job(api, agent, workload="sweep-7")
    r = api.post("/v1/emergency-stops", "dave", json={"scope": {"kind": "workload", "value": "sweep-7"},
                                                      "trigger": "security", "reason": "leaked credentials"})
    es = r.json()
    assert es["hold"] == {"state": "pending"}
    # Until the stop is carried out, nothing is held.
    assert submit(api, workload="sweep-7").status_code == 201
    assert api.post(f"/v1/approvals/{es['approval_id']}/approve", "sam").status_code == 200
    assert api.get(f"/v1/emergency-stops/{es['id']}", "dave").json()["hold"]["state"] == "in_force"

    before = job_count(api)
    refused = submit(api, workload="sweep-7")
    assert refused.status_code == 403, refused.text
    problem = refused.json()
    assert problem["rules"] == ["C2.emergency_hold"]
    assert problem["detail"] == (f"emergency stop {es['id']} (security concern) holds workload sweep-7: no new jobs"
                                 f" there until it is lifted (jobgate emergency-stop lift {es['id']})")
    assert job_count(api) == before  # nothing half-made
    decision = next(e for e in ledger(api) if e["seq"] == problem["ledger_seq"])
    assert decision["body"]["decision"]["rules"] == ["C2.emergency_hold"]
    assert decision["body"]["input"]["params"]["emergency_holds"][0]["emergency_id"] == es["id"]
    assert submit(api, workload="sweep-8").status_code == 201  # another workload is not held

    assert api.post(f"/v1/emergency-stops/{es['id']}/lift", "carol", json={"reason": "we need it"}).status_code == 403
    no_reason = api.post(f"/v1/emergency-stops/{es['id']}/lift", "dave", json={})
    assert no_reason.status_code == 422
    lifted = api.post(f"/v1/emergency-stops/{es['id']}/lift", "dave", json={"reason": "keys rotated"})
    assert lifted.status_code == 200, lifted.text
    hold = lifted.json()["hold"]
    assert hold["state"] == "lifted" and hold["lifted_by"] == "dave" and hold["reason"] == "keys rotated"
    assert lifted.json()["decision"]["rules"] == ["C2.lift_hold"]
    outcome = [e["body"] for e in ledger(api) if e["kind"] == "emergency" and e["body"].get("result") == "hold_lifted"]
    assert outcome == [{**outcome[0], "emergency_id": es["id"], "lifted_by": "dave", "reason": "keys rotated",
                        "decision_seq": hold["decision_seq"]}]
    assert submit(api, workload="sweep-7").status_code == 201
    again = api.post(f"/v1/emergency-stops/{es['id']}/lift", "sam", json={"reason": "twice"})
    assert again.status_code == 409 and "was lifted" in again.json()["detail"]


def test_environment_and_selector_holds_match_the_new_job(api: Api, agent: FakeAgent) -> None:
    running_job(api, agent, environment="staging")
    running_job(api, agent, labels={"team": "x"})
    staging = stop_scope(api, "environment", "staging")
    team_x = stop_scope(api, "selector", {"team": "x"})
    assert submit(api, environment="staging").json()["rules"] == ["C2.emergency_hold"]
    assert submit(api, labels={"team": "x", "tier": "2"}).json()["detail"].startswith(f"emergency stop {team_x['id']}")
    both = submit(api, environment="staging", labels={"team": "x"}).json()
    assert staging["id"] in both["detail"] and team_x["id"] in both["detail"]
    assert submit(api, labels={"team": "y"}).status_code == 201
    assert submit(api, environment="production").status_code == 201


def test_a_paused_job_in_a_held_scope_may_not_resume_until_the_hold_is_lifted(api: Api, agent: FakeAgent) -> None:
    """Paused jobs hold no GPUs, so an emergency stop does not take them; resuming one would bring back into the
    held scope what the stop took out."""
    paused, _ = running_job(api, agent, environment="staging")
    assert api.post(f"/v1/jobs/{paused}/pause", "alice", json={"reason": "lunch"}).status_code == 202
    (stop,) = [c for c in agent.take() if c["kind"] == "stop" and c["job_id"] == paused]
    agent.report(paused, "stopped", stop["nonce"], evidence=stopped_evidence())
    assert api.get(f"/v1/jobs/{paused}", "alice").json()["state"] == "paused"
    running_job(api, agent, environment="staging")
    es = stop_scope(api, "environment", "staging")
    refused = api.post(f"/v1/jobs/{paused}/resume", "alice", json={"reason": "back to work"})
    assert refused.status_code == 403 and refused.json()["rules"] == ["C2.emergency_hold"], refused.text
    assert refused.json()["detail"].startswith(
        f"job {paused} is in environment staging, which emergency stop {es['id']}")
    assert api.get(f"/v1/jobs/{paused}", "alice").json()["state"] == "paused"
    assert api.post(f"/v1/emergency-stops/{es['id']}/lift", "sam", json={"reason": "all clear"}).status_code == 200
    resumed = api.post(f"/v1/jobs/{paused}/resume", "alice", json={"reason": "back to work"})
    assert resumed.status_code == 200, resumed.text


def test_a_refused_stop_is_over_and_holds_nothing(api: Api, agent: FakeAgent) -> None:
    """It showed as waiting for its approval forever (and its hold as pending), though nothing would stop."""
    job_id, _ = running_job(api, agent, workload="sweep-7")
    es = api.post("/v1/emergency-stops", "dave", json={"scope": {"kind": "workload", "value": "sweep-7"},
                                                       "trigger": "safety", "reason": "odd loss curve"}).json()
    assert api.post(f"/v1/approvals/{es['approval_id']}/reject", "sam", json={"reason": "that is expected"}
                    ).status_code == 200
    shown = api.get(f"/v1/emergency-stops/{es['id']}", "dave").json()
    assert shown["state"] == "rejected" and shown["finished_at"] is not None and shown["hold"] == {"state": "none"}
    assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "running"
    assert submit(api, workload="sweep-7").status_code == 201


def test_a_stop_made_without_a_hold_and_a_job_stop_hold_nothing(api: Api, agent: FakeAgent) -> None:
    running_job(api, agent, workload="sweep-7")
    unheld = stop_scope(api, "workload", "sweep-7", hold=False)
    assert unheld["hold"] == {"state": "none"}
    assert submit(api, workload="sweep-7").status_code == 201
    r = api.post(f"/v1/emergency-stops/{unheld['id']}/lift", "dave", json={"reason": "nothing to lift"})
    assert r.status_code == 404 and r.json()["detail"].endswith("holds no scope: it was made without one")
    other, _ = running_job(api, agent)
    single = api.post("/v1/emergency-stops", "dave", json={"scope": {"kind": "job", "value": other},
                                                           "trigger": "safety", "reason": "runaway loss"}).json()
    assert single["hold"] == {"state": "none"}
    r = api.post(f"/v1/emergency-stops/{single['id']}/lift", "dave", json={"reason": "nothing to lift"})
    assert r.status_code == 404 and r.json()["detail"].endswith("a job stop holds nothing")
    assert api.post("/v1/emergency-stops/es-none/lift", "dave", json={"reason": "x" * 3}).status_code == 404


@pytest.mark.parametrize("settings", ["sqlite"], indirect=True)  # the CLI only speaks HTTP
def test_on_call_sees_and_lifts_the_hold_from_the_cli(api: Api, agent: FakeAgent, url: str) -> None:
    running_job(api, agent, workload="sweep-7")
    es = stop_scope(api, "workload", "sweep-7")
    code, out = jobgate(url, api, "dave", "emergency-stop", "show", es["id"])
    assert code == 0 and (f"hold: in force since {es['hold']['since']}: new jobs in this scope are refused; lift it"
                          f" with `jobgate emergency-stop lift {es['id']} --reason ...`") in out, out
    code, out = jobgate(url, api, "dave", "emergency-stop", "list")
    assert code == 0 and "in_force" in out, out
    code, out = jobgate(url, api, "dave", "emergency-stop", "lift", es["id"])
    assert code == 2 and "Missing option '--reason'" in out, out
    code, out = jobgate(url, api, "dave", "emergency-stop", "lift", es["id"], "--reason", "keys rotated")
    last = out.strip().splitlines()[-1]  # (the gateway's own log lines come first)
    assert code == 0 and last.startswith("hold: lifted at ") and last.endswith(" by dave (keys rotated)"), out
    code, out = jobgate(url, api, "dave", "emergency-stop", "lift", es["id"], "--reason", "again")
    assert code == 1 and "was lifted at" in out, out
