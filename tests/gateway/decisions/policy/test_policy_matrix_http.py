"""Every row A1-A8 of the permission matrix through the HTTP API (not just the engine): allowed, denied
and — where the row needs a second person — needs-approval cases, each checked against the ledger.

Demo cast: alice, bob researchers (vision); carol queue admin (vision); dave on-call; erin, frank platform
admins; sam security reviewer; audrey auditor; mallory researcher (speech); ci-bot service (vision).
"""

from __future__ import annotations

from typing import Any

import httpx
from gateway_testkit import Api, job_spec

CI = {"X-Jobgate-Trigger": "ci/nightly#7"}


def entries(api: Api) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    while True:
        r = api.get("/v1/ledger/entries", "audrey", params={"start": len(out), "limit": 1000})
        assert r.status_code == 200, r.text
        batch = r.json()["entries"]
        if not batch:
            return out
        out.update({e["seq"]: e["entry"] for e in batch})


def last_decision(api: Api, action: str) -> dict[str, Any]:
    found = [e["body"] for e in entries(api).values()
             if e["kind"] == "decision" and e["body"]["input"]["action"] == action]
    assert found, action
    return found[-1]


def submit(api: Api, who: str = "alice", **headers: str) -> str:
    r = api.post("/v1/jobs", who, json=job_spec(), headers=headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def denied(r: httpx.Response, needle: str) -> dict[str, Any]:
    assert r.status_code == 403, r.text
    body = r.json()
    assert body["type"].endswith("/policy-denied"), body
    assert needle in body["detail"], body
    return dict(body)


def waiting(api: Api, r: httpx.Response, rule: str) -> str:
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["approval_id"], body
    assert body["decision"]["effect"] == "needs_approval" and rule in body["decision"]["rules"], body
    assert entries(api)[body["decision"]["ledger_seq"]]["body"]["decision"]["effect"] == "needs_approval"
    return str(body["approval_id"])


def approve(api: Api, approval_id: str, who: str) -> dict[str, Any]:
    r = api.post(f"/v1/approvals/{approval_id}/approve", who, json={"comment": "ok"})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "executed", r.json()
    return dict(r.json())


def test_a1_view(api: Api) -> None:
    job = submit(api)
    assert api.get(f"/v1/jobs/{job}", "alice").status_code == 200
    assert api.get(f"/v1/jobs/{job}", "bob").status_code == 200  # a member of the project
    assert api.get(f"/v1/jobs/{job}", "audrey").status_code == 200  # auditor, global
    denied(api.get(f"/v1/jobs/{job}", "mallory"), "mallory holds no role in project vision that grants job.view")
    assert job not in {j["id"] for j in api.get("/v1/jobs", "mallory").json()["jobs"]}


def test_a2_own_priority_records_before_after_and_queue_snapshot(api: Api) -> None:
    job = submit(api)
    r = api.post(f"/v1/jobs/{job}/priority", "alice", json={"priority": 42, "reason": "deadline"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["decision"]["effect"] == "allow" and "A2.own" in body["decision"]["rules"]
    assert body["priority_after"] == 42 and body["priority_before"] != 42
    outcome = entries(api)[body["outcome_seq"]]
    assert outcome["body"]["priority_before"] == body["priority_before"]
    assert outcome["body"]["priority_after"] == 42
    snapshot = outcome["blobs"]["queue_snapshot"]
    assert job in api.gateway.ledger.blob(snapshot).decode()
    history = api.get(f"/v1/jobs/{job}/queue", "alice").json()["priority_history"]
    assert history[-1]["basis"] == "manual" and history[-1]["after"] == 42
    # A researcher cannot reprioritise a colleague's job.
    denied(api.post(f"/v1/jobs/{job}/priority", "bob", json={"priority": 1}),
           "bob holds no role in project vision that grants job.priority.any")


def test_a3_others_priority_needs_a_second_person(api: Api) -> None:
    job = submit(api)
    r = api.post(f"/v1/jobs/{job}/priority", "carol", json={"priority": 99, "reason": "paper deadline"})
    approval = waiting(api, r, "A3.second_person")
    history = api.get(f"/v1/jobs/{job}/queue", "alice").json()["priority_history"]
    assert all(h["basis"] != "manual" for h in history)  # nothing changed yet
    done = approve(api, approval, "dave")  # on-call is an eligible second person
    changed = done["resolution"]["result"]["changed"][0]
    assert changed["priority_after"] == 99
    outcome = entries(api)[changed["outcome_seq"]]["body"]
    assert outcome["operator"] == "carol" and outcome["affected_owner"] == "alice"
    assert outcome["approved_by"] == ["dave"] and outcome["reason"] == "paper deadline"
    # The owner is told, as the policy's notify_owner obligation asks, and the outcome says so.
    (told,) = outcome["owner_notified"]
    notices = api.get("/v1/notifications", "alice").json()["notifications"]
    notice = next(n for n in notices if n["id"] == told["notification_id"])
    assert notice["body"]["action"] == "job.priority" and notice["body"]["by"] == "carol"
    denied(api.post(f"/v1/jobs/{job}/priority", "mallory", json={"priority": 1}), "job.priority.any")


def test_a4_stop(api: Api) -> None:
    own, other, third = submit(api), submit(api), submit(api)
    r = api.post(f"/v1/jobs/{own}/stop", "alice", json={"reason": "done"})
    assert r.status_code == 202 and r.json()["approval_id"] is None, r.text
    assert r.json()["decision"]["effect"] == "allow" and r.json()["job"]["state"] == "stopped"
    denied(api.post(f"/v1/jobs/{other}/stop", "bob", json={"reason": "mine now"}), "job.stop.any")
    denied(api.post(f"/v1/jobs/{other}/stop", "mallory", json={"reason": "mine now"}), "job.stop.any")
    approval = waiting(api, api.post(f"/v1/jobs/{other}/stop", "carol", json={"reason": "hung"}), "A4.second_person")
    assert api.get(f"/v1/jobs/{other}", "alice").json()["state"] == "pending"
    approve(api, approval, "alice")  # the owner's consent completes it
    assert api.get(f"/v1/jobs/{other}", "alice").json()["state"] == "stopped"
    # On-call also needs a second person for another's job.
    waiting(api, api.post(f"/v1/jobs/{third}/stop", "dave", json={"reason": "incident"}), "A4.second_person")


def test_a5_pause(api: Api) -> None:
    own, other = submit(api), submit(api)
    r = api.post(f"/v1/jobs/{own}/pause", "alice", json={"reason": "lunch"})
    assert r.status_code in (202, 409), r.text  # allowed by policy; a queued job may not be pausable
    assert last_decision(api, "job.pause")["decision"]["effect"] == "allow"
    denied(api.post(f"/v1/jobs/{other}/pause", "carol", json={"reason": "make room"}), "job.pause.any")
    api.post(f"/v1/jobs/{other}/pause", "dave", json={"reason": "node maintenance"})
    decision = last_decision(api, "job.pause")
    assert decision["decision"]["effect"] == "allow" and "A5.notify_owner" in decision["decision"]["rules"]


def delete(api: Api, job: str, who: str, body: dict[str, Any]) -> httpx.Response:
    return api.client.request("DELETE", f"/v1/jobs/{job}", headers=api.headers(who), json=body)


def test_a6_delete(api: Api) -> None:
    job = submit(api)
    assert api.post(f"/v1/jobs/{job}/stop", "alice", json={"reason": "done"}).status_code == 202
    denied(delete(api, job, "carol", {"reason": "cleanup"}), "only the owner alice")
    denied(delete(api, job, "dave", {"reason": "cleanup"}), "only the owner alice")
    r = delete(api, job, "alice", {"reason": "obsolete"})
    approval = waiting(api, r, "A6.rights_holder_consent")
    # The rights holder is project vision; its queue admin consents for it.
    approve(api, approval, "carol")
    assert api.get(f"/v1/jobs/{job}", "alice").json()["state"] != "stopped"


def test_a7_quota_needs_a_second_platform_admin(api: Api) -> None:
    change = {"gpus": 24, "reason": "new grant", "borrow_limit": 0}
    denied(api.client.put("/v1/quotas/vision", headers=api.headers("carol"), json=change), "quota.change")
    r = api.client.put("/v1/quotas/vision", headers=api.headers("erin"), json=change)
    assert r.status_code == 202, r.text
    approval = r.json()["approval_id"]
    assert last_decision(api, "quota.change")["decision"]["effect"] == "needs_approval"
    # A second platform admin, bound through the roles API (M1), confirms.
    grant = api.post("/v1/roles", "erin", json={"principal": "sam", "role": "platform_admin", "project": "*"})
    assert grant.status_code == 201, grant.text
    approve(api, approval, "sam")
    assert last_decision(api, "quota.change")["decision"]["effect"] == "allow"


def test_a8_stop_of_a_service_account_job(api: Api) -> None:
    job = submit(api, "ci-bot", **CI)
    denied(api.post(f"/v1/jobs/{job}/stop", "carol", json={"reason": "runaway"}), "job.stop.service")
    denied(api.post(f"/v1/jobs/{job}/stop", "mallory", json={"reason": "runaway"}), "job.stop.service")
    # Its responsible person owns the job but is not on-call: she stopped it alone (A4.own_job) before.
    refused = denied(api.post(f"/v1/jobs/{job}/stop", "alice", json={"reason": "runaway"}), "only on-call may stop it")
    assert refused["rules"] == ["A8.oncall_only"], refused
    approval = waiting(api, api.post(f"/v1/jobs/{job}/stop", "dave", json={"reason": "runaway"}), "A8.service_job")
    approve(api, approval, "carol")  # a queue admin of the project is an eligible second person
    assert api.get(f"/v1/jobs/{job}", "alice").json()["state"] == "stopped"
    # The service account stops the jobs it started itself (A4 own job).
    own = submit(api, "ci-bot", **CI)
    r = api.post(f"/v1/jobs/{own}/stop", "ci-bot", json={"reason": "pipeline cancelled"}, headers=CI)
    assert r.status_code == 202 and r.json()["decision"]["effect"] == "allow", r.text
