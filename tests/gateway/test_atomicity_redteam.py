"""Red team: atomicity, fail-closed behaviour and concurrency of job mutations (M2, H3; record first)."""

from __future__ import annotations

from datetime import timedelta

from gateway_testkit import Api, job_spec, ledger_entries
from sqlalchemy import select
from test_approvals_api import ask_stop, job_state
from test_sched_api import advance, bring_up_nodes, job, report

from gateway.approvals import Approval
from gateway.housekeeping import run_all
from gateway.models import NodeCommand
from gateway.scheduler_tables import PreemptionRow
from gateway.scheduling import run_once
from scheduler.model import SchedulerConfig

DONE = {"exit_code": 0, "process_group_gone": True}


def _stop_nonces(api: Api, job_id: str) -> list[str]:
    with api.gateway.db.transaction() as s:
        return list(
            s.scalars(
                select(NodeCommand.nonce)
                .where(NodeCommand.job_id == job_id, NodeCommand.kind == "stop")
                .order_by(NodeCommand.created_at)
            )
        )


def _running(api: Api, who: str = "alice") -> tuple[str, str]:
    """A job the scheduler placed and its agent started (pid 7); returns (job, node)."""
    bring_up_nodes(api)
    j = api.post("/v1/jobs", who, json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=7)
    assert job(api, j)["state"] == "running"
    return j, node


def test_a_second_stop_of_a_stopping_job_does_not_restart_the_stop(api: Api) -> None:
    """A stop of a job already stopping replaced its stop request and sent a second stop command. The node's
    answer to the first command then looked like one to an earlier stop and was dropped as stale, so the job
    never left `stopping`; and each repeat pushed the escalation deadline further out."""
    j, node = _running(api)
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "wrong config"}).status_code == 202
    (first,) = _stop_nonces(api, j)
    asked = job(api, j)["stop_request"]["at"]
    advance(api, 5)
    again = api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "really, stop it"})
    assert again.status_code == 202, again.text
    assert _stop_nonces(api, j) == [first]
    assert job(api, j)["stop_request"]["at"] == asked
    outcome = ledger_entries(api)[-1]["body"]
    assert outcome["took_over_stop"] and outcome["decision_seq"] == again.json()["decision"]["ledger_seq"]
    report(api, node, j, "stopping", nonce=first, pid=7)
    report(api, node, j, "stopped", nonce=first, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped"


def test_an_approved_stop_of_a_job_its_owner_stopped_meanwhile_sends_nothing_more(api: Api) -> None:
    j, node = _running(api)
    approval_id = ask_stop(api, "carol", j)["approval_id"]
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "I stop it myself"}).status_code == 202
    (first,) = _stop_nonces(api, j)
    advance(api, 5)
    r = api.post(f"/v1/approvals/{approval_id}/approve", "dave")
    assert r.status_code == 200, r.text
    assert _stop_nonces(api, j) == [first]
    report(api, node, j, "stopped", nonce=first, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped"


def test_a_stop_does_not_take_a_deleted_or_paused_job_out_of_its_state(api: Api) -> None:
    j, node = _running(api)
    assert api.post(f"/v1/jobs/{j}/pause", "alice", json={"reason": "free the node"}).status_code == 202
    (pause_stop,) = _stop_nonces(api, j)
    report(api, node, j, "stopped", nonce=pause_stop, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "paused"
    r = api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "stop the paused one"})
    assert r.status_code == 409, r.text
    assert job(api, j)["state"] == "paused" and _stop_nonces(api, j) == [pause_stop]
    r = api.client.request("DELETE", f"/v1/jobs/{j}", headers=api.headers("alice"), json={"reason": "not needed"})
    assert r.status_code == 202, r.text
    assert api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "carol").status_code == 200
    r = api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "stop the deleted one"})
    assert r.status_code == 409, r.text
    assert job_state(api, j) == "deleted" and _stop_nonces(api, j) == [pause_stop]


def test_a_persons_stop_of_a_job_being_preempted_ends_it_instead_of_requeueing_it(api: Api) -> None:
    """The stop joins the preemption's stop in progress (no second command) and makes it final."""
    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    j, node = _running(api)
    advance(api, 3600 + 700)
    run_once(api.gateway)
    assert job(api, j)["stop_request"].get("preemption")
    (first,) = _stop_nonces(api, j)
    assert api.post(f"/v1/jobs/{j}/stop", "alice", json={"reason": "I do not want it back"}).status_code == 202
    report(api, node, j, "stopped", nonce=first, pid=7, evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "stopped" and _stop_nonces(api, j) == [first]
    with api.gateway.db.transaction() as s:
        assert [r.state for r in s.scalars(select(PreemptionRow).where(PreemptionRow.victim == j))] == ["superseded"]


def test_an_approved_stop_of_a_job_paused_meanwhile_leaves_it_paused(api: Api) -> None:
    j, node = _running(api)
    approval_id = ask_stop(api, "carol", j)["approval_id"]
    assert api.post(f"/v1/jobs/{j}/pause", "alice", json={"reason": "free the node"}).status_code == 202
    (pause_stop,) = _stop_nonces(api, j)
    report(api, node, j, "stopped", nonce=pause_stop, pid=7, evidence={"outcome": "graceful", **DONE})
    r = api.post(f"/v1/approvals/{approval_id}/approve", "dave")
    assert r.status_code == 200, r.text
    assert r.json()["resolution"]["result"]["not_stoppable"] == [{"id": j, "state": "paused"}]
    assert job(api, j)["state"] == "paused" and _stop_nonces(api, j) == [pause_stop]


def _expire(api: Api, approval_id: str) -> None:
    with api.gateway.db.transaction() as s:
        a = s.get(Approval, approval_id)
        a.expires_at = a.created_at - timedelta(seconds=1)


def test_an_expired_approval_stays_expired_and_its_expiry_is_ledgered_once(api: Api) -> None:
    """The expiry was written in the transaction the 409 then rolled back: the request stayed pending in every
    listing while the ledger said it expired, once more on every later attempt."""
    j, _ = _running(api)
    approval_id = ask_stop(api, "carol", j)["approval_id"]
    _expire(api, approval_id)
    for who in ("alice", "dave"):
        r = api.post(f"/v1/approvals/{approval_id}/approve", who)
        assert r.status_code == 409 and "expired" in r.json()["detail"], r.text
    r = api.post(f"/v1/approvals/{approval_id}/reject", "carol", json={"reason": "withdrawn"})
    assert r.status_code == 409, r.text
    shown = api.get(f"/v1/approvals/{approval_id}", "alice").json()
    assert shown["state"] == "expired" and shown["resolved_at"]
    assert [a["id"] for a in api.get("/v1/approvals", "alice", params={"state": "pending"}).json()["approvals"]] == []
    expired = [
        e
        for e in ledger_entries(api)
        if e["body"].get("approval_id") == approval_id and e["body"].get("result") == "expired"
    ]
    assert len(expired) == 1
    assert job_state(api, j) == "running"


def test_an_approval_nobody_answers_expires_on_its_own(api: Api) -> None:
    j, _ = _running(api)
    approval_id = ask_stop(api, "carol", j)["approval_id"]
    _expire(api, approval_id)
    run_all(api.gateway)
    assert api.get(f"/v1/approvals/{approval_id}", "alice").json()["state"] == "expired"
    assert [e["body"]["result"] for e in ledger_entries(api) if e["body"].get("approval_id") == approval_id][
        -1
    ] == "expired"
