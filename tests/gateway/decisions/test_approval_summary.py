"""M2, approve what you see: GET /v1/approvals[/{id}] answers a `summary` that says in words what the request would
do: the action, every parameter before → after (before: its value when the request was made), the targets the
viewer may see, blast radius, and who must still approve as a sentence; the notice to the approver says the
same. One case per kind of request (a priority, a stop, a quota, a deletion, an emergency stop)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from gateway_testkit import Api, job_spec
from sched_testkit import set_quota
from stop_helpers import FakeAgent, finish_stop, running_job

from gateway.decisions.policy.engine import RoleBinding


@dataclass(frozen=True)
class Asked:
    approval_id: str
    viewer: str  # who reads the summary
    job_id: str = ""


def priority_raise(api: Api, agent: FakeAgent) -> Asked:
    """The issue's case: carol asks to set alice's job to 900."""
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    r = api.post(f"/v1/jobs/{job_id}/priority", "carol", json={"priority": 900, "reason": "release blocker"})
    assert r.status_code == 202, r.text
    return Asked(r.json()["approval_id"], "alice", job_id)


def priority_moved_since(api: Api, agent: FakeAgent) -> Asked:
    """The owner lowers her job after the request: "before" stays what it was when asked, and says it moved."""
    asked = priority_raise(api, agent)
    assert api.post(f"/v1/jobs/{asked.job_id}/priority", "alice", json={"priority": 400.5}).status_code == 200
    return asked


def stop_of_anothers_job(api: Api, agent: FakeAgent) -> Asked:
    job_id, _ = running_job(api, agent, grace_seconds=45, stop_signal="SIGUSR1")
    r = api.post(f"/v1/jobs/{job_id}/stop", "carol", json={"reason": "urgent eval needs the GPUs",
                                                            "ticket": "INC-9"})
    assert r.status_code == 202, r.text
    return Asked(r.json()["approval_id"], "dave", job_id)


def quota_change(api: Api, agent: FakeAgent) -> Asked:
    set_quota(api, "vision", 8)
    r = api.client.put("/v1/quotas/vision", headers=api.headers("erin"), json={
        "gpus": 16, "borrow_limit": 0, "reason": "Q1 budget", "effective_from": "2027-01-01T00:00:00Z",
        "effective_until": "2027-04-01T00:00:00Z"})
    assert r.status_code == 202, r.text
    return Asked(r.json()["approval_id"], "erin")


def deletion(api: Api, agent: FakeAgent) -> Asked:
    api.gateway.policy.grant(RoleBinding(principal="carol", role="queue_admin", project="acme"))
    job_id, _ = running_job(api, agent)
    api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
    finish_stop(agent, job_id)
    r = api.client.request("DELETE", f"/v1/jobs/{job_id}", headers=api.headers("alice"),
                           json={"reason": "trained on the wrong data"})
    assert r.status_code == 202, r.text
    return Asked(r.json()["approval_id"], "carol", job_id)


def emergency_stop(api: Api, agent: FakeAgent) -> Asked:
    job_id, _ = running_job(api, agent, workload="sweep")
    r = api.post("/v1/emergency-stops", "dave", json={"scope": {"kind": "workload", "value": "sweep"},
                                                      "trigger": "safety", "grace_seconds": 0,
                                                      "reason": "sweep writes unsafe outputs"})
    assert r.status_code == 202, r.text
    return Asked(r.json()["approval_id"], "sam", job_id)


# (case, the lines the summary must hold ({job} is the target's id), its still-needed sentence)
CASES: list[tuple[Callable[[Api, FakeAgent], Asked], list[str], str]] = [
    (priority_raise, ["what: set the priority of job {job} from 520 to 900",
                      "  job {job} (train-a, owner alice): priority 520 → 900",
                      "blast radius: 1 job, 2 GPUs in project vision; owner alice", "reason: release blocker"],
     "one more: alice, or a queue admin or on-call in vision (not carol, who asked)"),
    (priority_moved_since, ["  job {job} (train-a, owner alice): priority 520 → 900 (it was 520 when asked and is"
                            " 400.5 now)"],
     "one more: alice, or a queue admin or on-call in vision (not carol, who asked)"),
    (stop_of_anothers_job, ["what: stop job {job}",
                            "  job {job} (train-a, owner alice): running → stopped; SIGUSR1, then 45 s to checkpoint"
                            " before SIGKILL", "reason: urgent eval needs the GPUs (ticket INC-9)"],
     "one more: alice, or a queue admin or on-call in vision (not carol, who asked)"),
    (quota_change, ["  quota of vision: 8 → 16 GPUs",
                    "  quota of vision: period from when it is applied, no end → from 2027-01-01 00:00:00 UTC until"
                    " 2027-04-01 00:00:00 UTC", "blast radius: no jobs"],
     "one more: a platform admin (not erin, who asked)"),
    (deletion, ["what: delete job {job} and, after a 7 days recovery window, its files",
                "  job {job} (train-a, owner alice): stopped → deleted",
                "  job {job}'s objects: checkpoints checkpoints/step-9.ckpt (demo-node-1) and every other file of the"
                " job on demo-node-1: kept → removed after the recovery window",
                "  recovery window: 7 days from the approval, in which `jobgate job undelete` restores the job"],
     "one more: a queue admin in vision (not alice, who asked)"),
    (emergency_stop, ["what: emergency stop of workload=sweep (safety concern): job {job}, no grace, then a hold on"
                      " the scope", "  grace: none, every job is killed at once",
                      "  job {job} (train-a, owner alice): running → stopped"],
     "one more: a security reviewer (not dave, who asked)"),
]


@pytest.mark.parametrize(("make", "expected", "needed"), CASES, ids=[c[0].__name__ for c in CASES])
def test_the_summary_says_what_would_change_and_who_must_still_approve(
        api: Api, agent: FakeAgent, make: Callable[[Api, FakeAgent], Asked], expected: list[str], needed: str) -> None:
    asked = make(api, agent)
    one = api.get(f"/v1/approvals/{asked.approval_id}", asked.viewer)
    assert one.status_code == 200, one.text
    summary = one.json()["summary"]
    assert one.json()["required"]["count"] == 1  # the fields it had are all still there
    for line in expected:
        assert line.format(job=asked.job_id) in summary["lines"], summary["lines"]
    assert summary["still_needed"] == needed and f"still needed: {needed}" in summary["lines"]
    listed = api.get("/v1/approvals", asked.viewer).json()["approvals"]
    assert [a["summary"] for a in listed if a["id"] == asked.approval_id] == [summary]


def test_the_notice_to_the_approver_says_what_they_are_asked_to_confirm(api: Api) -> None:
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    approval_id = api.post(f"/v1/jobs/{job_id}/priority", "carol",
                           json={"priority": 900, "reason": "release blocker"}).json()["approval_id"]
    (note,) = [n for n in api.get("/v1/notifications", "alice").json()["notifications"]
               if n["kind"] == "approval_requested"]
    assert note["body"]["approval_id"] == approval_id
    assert note["body"]["what"] == f"set the priority of job {job_id} from 520 to 900"
    assert "priority 520 → 900" in note["body"]["summary"]
    needed = "one more: alice, or a queue admin or on-call in vision (not carol, who asked)"
    assert note["body"]["still_needed"] == needed and f"Still needed: {needed}." in note["body"]["summary"]


def test_a_target_the_viewer_may_not_see_is_named_by_id_only(api: Api, agent: FakeAgent) -> None:
    """A1: carol asks to stop mallory's job of another project; she may not view it, so her summary names its id
    and project, never its name, owner or state. Mallory, asked for consent, sees all of it."""
    job_id, _ = running_job(api, agent, who="mallory", project="speech", name="secret-run")
    approval_id = api.post(f"/v1/jobs/{job_id}/stop", "carol", json={"reason": "needs the GPUs"}).json()["approval_id"]
    carols = api.get(f"/v1/approvals/{approval_id}", "carol").json()["summary"]
    assert carols["targets"] == [{"id": job_id, "project": "speech", "hidden": True}]
    assert "secret-run" not in str(carols)
    assert "owner mallory" not in str(carols) and "running" not in str(carols)
    assert f"  1 more job of projects you may not view: {job_id}" in carols["lines"]
    mallorys = api.get(f"/v1/approvals/{approval_id}", "mallory").json()["summary"]
    assert f"  job {job_id} (secret-run, owner mallory): running → stopped; SIGTERM, then 30 s to checkpoint before" \
           " SIGKILL" in mallorys["lines"]
    assert mallorys["still_needed"] == "one more: mallory (not carol, who asked)"
