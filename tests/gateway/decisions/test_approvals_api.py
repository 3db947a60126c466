"""Two-person rule (M2) through the HTTP API: requests, approvals, refusals, exactly-once execution."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from approval_testkit import ask_stop, job_state, running_job
from gateway_testkit import Api, job_spec, ledger_entries
from sqlalchemy import Engine, event, select

from gateway.store.models import Job
from gateway.store.service_tables import Approval


@pytest.fixture
def api(inproc_api: Api) -> Api:
    """Jobs here run on the in-process executor: what is tested is the decision, not the node agents."""
    return inproc_api

def test_queue_admin_stop_of_anothers_job_needs_a_second_person(api: Api) -> None:
    job_id = running_job(api)
    out = ask_stop(api, "carol", job_id)
    assert out["decision"]["effect"] == "needs_approval"
    assert out["approval_id"]
    assert out["job"]["state"] == "running"  # nothing changed yet
    inbox = api.get("/v1/approvals", "alice").json()["approvals"]  # the owner is told and may consent
    assert [a["id"] for a in inbox] == [out["approval_id"]]
    assert inbox[0]["targets"] == [job_id] and inbox[0]["requester"] == "carol"


def test_self_approval_is_refused(api: Api) -> None:
    job_id = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    r = api.post(f"/v1/approvals/{approval_id}/approve", "carol")
    assert r.status_code == 403 and "second person" in r.json()["detail"]
    assert job_state(api, job_id) == "running"
    # The attempt is in the ledger like any refused change (H3).
    refused = [e["body"] for e in ledger_entries(api) if e["body"].get("action") == "approval.grant"]
    assert [(b["approval_id"], b["result"], b["operator"]) for b in refused] == [(approval_id, "refused", "carol")]
    assert "second person" in refused[0]["reason"]


def test_owner_approval_executes_exactly_once(api: Api) -> None:
    job_id = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    r = api.post(f"/v1/approvals/{approval_id}/approve", "alice", json={"comment": "ok, I have a checkpoint"})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "executed"
    assert job_state(api, job_id) == "stop_requested"
    again = api.post(f"/v1/approvals/{approval_id}/approve", "dave")
    assert again.status_code == 409 and "already executed" in again.json()["detail"]
    entries = ledger_entries(api)
    executed = [e for e in entries if e["body"].get("result") == "executed"]
    assert len(executed) == 1 and executed[0]["body"]["approvers"] == ["alice"]
    # Answering a closed request is a refused attempt like any other (README: every refused attempt is ledgered).
    late = api.post(f"/v1/approvals/{approval_id}/reject", "dave", json={"reason": "too late"})
    assert late.status_code == 409, late.text
    refused = [(e["body"]["action"], e["body"]["operator"]) for e in ledger_entries(api)
               if e["body"].get("approval_id") == approval_id and e["body"].get("result") == "refused"]
    assert refused == [("approval.grant", "dave"), ("approval.reject", "dave")]


def test_ineligible_approver_is_refused(api: Api) -> None:
    job_id = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    for outsider in ("mallory", "bob"):  # another tenant; a researcher who neither owns nor admins
        r = api.post(f"/v1/approvals/{approval_id}/approve", outsider)
        assert r.status_code == 403, r.text
    assert job_state(api, job_id) == "running"


def test_on_call_may_be_the_second_person(api: Api) -> None:
    job_id = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    assert api.post(f"/v1/approvals/{approval_id}/approve", "dave").json()["state"] == "executed"


def test_targets_that_ended_meanwhile_are_skipped_and_reported(api: Api) -> None:
    job_id = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    with api.gateway.db.transaction() as s:
        s.get(Job, job_id).state = "succeeded"
    r = api.post(f"/v1/approvals/{approval_id}/approve", "alice")
    assert r.status_code == 200, r.text
    assert r.json()["resolution"]["skipped"] == [{"id": job_id, "state": "succeeded"}]
    assert job_state(api, job_id) == "succeeded"


def test_an_approved_stop_of_a_queued_job_writes_each_row_once(api: Api) -> None:
    """The approval's transaction flushes once, at its end, where the flush overlaps the ledger's fsync. A lookup of
    the job's kept checkpoint autoflushed midway and wrote the approval row twice; a job never paused has no kept
    checkpoint in use, so that lookup is not made."""
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        r = api.post(f"/v1/approvals/{approval_id}/approve", "alice")
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    assert r.status_code == 200, r.text
    assert job_state(api, job_id) == "stopped"
    assert sorted(s.split()[1] for s in statements if s.startswith("UPDATE")) == ["approvals", "jobs"]
    assert not [s for s in statements if "checkpoint_retention" in s]
    # The targets are read once, locked: the approver's credential is checked against those rows' projects.
    assert len([s for s in statements if s.startswith("SELECT") and re.search(r"\bFROM jobs\b", s)]) == 1


def test_a_queue_admin_stops_a_job_of_another_project_with_its_owners_consent(api: Api) -> None:
    """A4's owner-consent branch asks whether the actor may stop others' jobs in some project of theirs; the
    decision input held capabilities only for the projects the request named, so through the API the branch
    was never reached and carol's stop of mallory's speech job was refused outright."""
    job_id = running_job(api, "mallory", project="speech")
    out = ask_stop(api, "carol", job_id)
    assert out["decision"]["effect"] == "needs_approval", out
    assert out["decision"]["rules"] == ["A4.cross_project_owner_consent"]
    assert out["decision"]["approvals_required"]["principals"] == ["mallory"]
    r = api.post(f"/v1/approvals/{out['approval_id']}/approve", "dave")  # on-call is not the owner
    assert r.status_code == 403, r.text
    r = api.post(f"/v1/approvals/{out['approval_id']}/approve", "mallory")
    assert r.status_code == 200 and r.json()["state"] == "executed", r.text
    assert job_state(api, job_id) == "stop_requested"
    # Without a role that may stop others' jobs anywhere, it is still refused.
    r = api.post(f"/v1/jobs/{running_job(api, 'mallory', project='speech')}/stop", "bob", json={"reason": "mine now"})
    assert r.status_code == 403 and "A4.no_capability" in r.text, r.text


def test_expired_request_cannot_be_approved(api: Api) -> None:
    job_id = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    with api.gateway.db.transaction() as s:
        a = s.get(Approval, approval_id)
        a.expires_at = a.created_at - timedelta(seconds=1)
    r = api.post(f"/v1/approvals/{approval_id}/approve", "alice")
    assert r.status_code == 409 and "expired" in r.json()["detail"]
    assert job_state(api, job_id) == "running"
    bodies = [e["body"] for e in ledger_entries(api) if e["body"].get("approval_id") == approval_id]
    assert [b["reason"] for b in bodies if b.get("result") == "refused"] == [r.json()["detail"]]
    assert [b for b in bodies if b.get("result") == "expired"], bodies  # and the request is closed as expired


def test_altered_request_no_longer_matches_its_digest(api: Api) -> None:
    job_id = running_job(api)
    other = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    with api.gateway.db.transaction() as s:  # someone with DB access tries to widen the target set
        s.get(Approval, approval_id).target_ids = [job_id, other]
    r = api.post(f"/v1/approvals/{approval_id}/approve", "dave")
    assert r.status_code == 409 and "digest" in r.json()["detail"]
    assert job_state(api, other) == "running"


def test_service_account_job_needs_on_call_and_its_responsible_person_cannot_approve(api: Api) -> None:
    job_id = running_job(api, "ci-bot")
    r = api.post(f"/v1/jobs/{job_id}/stop", "carol", json={"reason": "stuck pipeline job"})
    assert r.status_code == 403, r.text  # A8: only on-call stops a service account's job
    approval_id = ask_stop(api, "dave", job_id)["approval_id"]
    assert api.post(f"/v1/approvals/{approval_id}/approve", "dave").status_code == 403
    assert api.post(f"/v1/approvals/{approval_id}/approve", "carol").json()["state"] == "executed"


def test_reject_and_withdraw(api: Api) -> None:
    job_id = running_job(api)
    first = ask_stop(api, "carol", job_id)["approval_id"]
    r = api.post(f"/v1/approvals/{first}/reject", "alice", json={"reason": "my run finishes in 10 minutes"})
    assert r.status_code == 200 and r.json()["state"] == "rejected"
    assert api.post(f"/v1/approvals/{first}/approve", "dave").status_code == 409
    second = ask_stop(api, "carol", job_id)["approval_id"]
    refused = api.post(f"/v1/approvals/{second}/reject", "mallory", json={"reason": "not yours to stop"})
    assert refused.status_code == 403
    r = api.post(f"/v1/approvals/{second}/reject", "carol", json={"reason": "asked the wrong job"})
    assert r.json()["resolution"]["withdrawn"] is True
    assert job_state(api, job_id) == "running"


def test_unknown_approval_is_404(api: Api) -> None:
    assert api.post("/v1/approvals/apr-nope/approve", "dave").status_code == 404
    with api.gateway.db.transaction() as s:
        assert s.scalars(select(Approval)).all() == []


def test_two_approvers_racing_execute_once(api: Api) -> None:
    """Row lock (PostgreSQL) / immediate transaction (SQLite): exactly one approval executes the stop."""
    from concurrent.futures import ThreadPoolExecutor

    for _ in range(3):
        job_id = running_job(api)
        approval_id = ask_stop(api, "carol", job_id)["approval_id"]
        url = f"/v1/approvals/{approval_id}/approve"
        with ThreadPoolExecutor(2) as pool:
            codes = sorted(pool.map(lambda who, url=url: api.post(url, who).status_code, ["alice", "dave"]))
        assert codes == [200, 409]
        entries = ledger_entries(api)
        executed = [e for e in entries if e["body"].get("approval_id") == approval_id
                    and e["body"].get("result") == "executed"]
        assert len(executed) == 1
        commands = [e for e in entries if e["kind"] == "outcome" and e["body"].get("job_id") == job_id
                    and e["body"].get("state_after") == "stop_requested"]
        assert len(commands) == 1


def test_owner_is_notified_before_the_stop_and_the_receipt_is_ledgered(api: Api) -> None:
    from datetime import timedelta

    from gateway.decisions.obligations import RECEIPT_TIMEOUT, sweep_timed_out_receipts
    from gateway.store.service_tables import Notification

    job_id = running_job(api)
    approval_id = ask_stop(api, "carol", job_id)["approval_id"]
    assert api.post(f"/v1/approvals/{approval_id}/approve", "dave").json()["state"] == "executed"
    outcome = next(e for e in ledger_entries(api) if e["kind"] == "outcome" and e["body"].get("job_id") == job_id
                   and e["body"].get("state_after") == "stop_requested")
    (notified,) = outcome["body"]["owner_notified"]
    assert notified["owner"] == "alice" and notified["receipt"] == "pending"
    notes = api.get("/v1/notifications", "alice").json()["notifications"]
    note = next(n for n in notes if n["id"] == notified["notification_id"])
    assert note["receipt"] == "pending" and note["body"]["job_id"] == job_id
    assert api.post(f"/v1/notifications/{note['id']}/ack", "bob").status_code == 404
    assert api.post(f"/v1/notifications/{note['id']}/ack", "alice").json()["receipt"] == "acknowledged"
    receipt = [e for e in ledger_entries(api) if e["kind"] == "receipt"][-1]["body"]
    assert receipt == {**receipt, "notification_id": note["id"], "receipt": "acknowledged", "job_id": job_id}

    # A second stop whose owner never answers: the sweep records the receipt as timed out.
    other = running_job(api)
    approval_id = ask_stop(api, "carol", other)["approval_id"]
    api.post(f"/v1/approvals/{approval_id}/approve", "dave")
    with api.gateway.transaction() as s:
        for n in s.query(Notification).filter(Notification.receipt_required.is_(True)).all():
            n.created_at -= RECEIPT_TIMEOUT + timedelta(seconds=1)
    with api.gateway.transaction() as s:
        assert sweep_timed_out_receipts(api.gateway, s) == 1
    timed_out = [e for e in ledger_entries(api) if e["kind"] == "receipt"][-1]["body"]
    assert timed_out["receipt"] == "timed_out" and timed_out["job_id"] == other


def decisions_made(api: Api, action: str) -> float:
    """Decisions the policy made on `action` so far, recorded or not (the gateway's /metrics)."""
    found = re.findall(rf'jobgate_decisions_total{{action="{re.escape(action)}",effect="[a-z_]+"}} ([0-9.e+]+)',
                       api.client.get("/metrics").text)
    return sum(float(n) for n in found)


def test_an_approval_that_completes_a_request_is_decided_once_and_one_that_does_not_twice(api: Api) -> None:
    """Whether the caller's approval changed anything (refused if not) is asked only of a request still waiting:
    the approval that completes one needs no second decision."""
    job_id = running_job(api)
    with api.gateway.db.transaction() as s:
        s.get(Job, job_id).external_rights = True  # another's external-rights job: two more people (A4, R3)
    out = ask_stop(api, "carol", job_id)
    assert out["decision"]["approvals_required"]["count"] == 2, out
    before = decisions_made(api, "job.stop")
    first = api.post(f"/v1/approvals/{out['approval_id']}/approve", "alice")
    assert first.status_code == 200 and first.json()["state"] == "pending", first.text
    assert decisions_made(api, "job.stop") == before + 1  # no approval before it: nothing to judge again
    again = api.post(f"/v1/approvals/{out['approval_id']}/approve", "bob")  # bob counts for nothing here
    assert again.status_code == 403, again.text
    assert decisions_made(api, "job.stop") == before + 3  # still waiting: judged without bob too, to refuse him
    second = api.post(f"/v1/approvals/{out['approval_id']}/approve", "dave")
    assert second.status_code == 200 and second.json()["state"] == "executed", second.text
    assert decisions_made(api, "job.stop") == before + 4
    assert job_state(api, job_id) == "stop_requested"
