"""A2 is an owner ordering her own work, not jumping the queue: alone she may set her job at most to the higher of
its priority now and its unadjusted priority (what the scheduler alone gives it). Any owner could set 1,000,000,
ahead of every waiting job, urgent ones too, and never a preemption victim.

Demo cast: alice researcher (vision); carol queue admin (vision); dave on-call; audrey auditor.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from gateway_testkit import Api, assert_problem, job_spec, ledger_entries

from gateway.decisions.policy import whatif
from gateway.decisions.policy_sync import load_bindings
from gateway.native.scheduler_loop import run_once
from gateway.settings import REPO_POLICIES
from gateway.store.models import Job


def submit(api: Api, who: str = "alice", **labels: str) -> str:
    r = api.post("/v1/jobs", who, json=job_spec(labels=labels))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def priority_of(api: Api, job_id: str) -> dict[str, Any]:
    r = api.get(f"/v1/jobs/{job_id}/queue", "audrey")
    assert r.status_code == 200, r.text
    return dict(r.json()["priority"])


def set_priority(api: Api, who: str, job_id: str, value: float, reason: str | None = None) -> Any:
    return api.post(f"/v1/jobs/{job_id}/priority", who, json={"priority": value, "reason": reason})


def changes(api: Api) -> list[dict[str, Any]]:
    """The outcome entries of applied priority changes."""
    outcomes = [e["body"] for e in ledger_entries(api) if e["kind"] == "outcome"]
    return [b for b in outcomes if b.get("action") == "job.priority" and b.get("result") == "changed"]


def last_priority_decision(api: Api) -> dict[str, Any]:
    found = [
        e["body"]
        for e in ledger_entries(api)
        if e["kind"] == "decision" and e["body"]["input"]["action"] == "job.priority"
    ]
    assert found
    return found[-1]


def no_flips_on_replay(api: Api) -> int:
    """What-if under the set that decided: every recorded job.priority decision comes out the same."""
    entries = ledger_entries(api)
    records = [r for r in whatif.records_from_entries(entries) if r.input["action"] == "job.priority"]
    with api.gateway.transaction() as session:
        bindings = load_bindings(session)
    report = whatif.replay(Path(REPO_POLICIES), records, bindings, bindings_source="test", workers=1)
    assert report.flips == [], report.to_json()
    return len(records)


def test_an_owner_cannot_jump_the_queue_and_is_told_the_most_she_may_set(api: Api) -> None:
    job = submit(api)
    now = priority_of(api, job)["effective"]
    r = set_priority(api, "alice", job, 1_000_000, "mine first")
    body = assert_problem(r, 403, "policy-denied", f"alice may set their own job {job} at most to")
    assert "needs a queue admin or on-call" in body["detail"]
    assert body["rules"] == ["A2.raise_needs_admin"]
    # Ledgered with the facts the policy judged on; nothing changed.
    decided = last_priority_decision(api)
    assert decided["decision"]["effect"] == "deny" and decided["input"]["params"] == {"priority": 1_000_000}
    (target,) = decided["input"]["targets"]
    assert target["priority"] == now and target["unadjusted_priority"] == now
    assert priority_of(api, job)["effective"] == now
    assert changes(api) == []
    history = api.get(f"/v1/jobs/{job}/queue", "alice").json()["priority_history"]
    assert all(h["basis"] != "manual" for h in history)
    # One point above is as much a jump; the value stated is the one she may set.
    assert_problem(set_priority(api, "alice", job, now + 1), 403, "policy-denied", "at most to")
    assert set_priority(api, "alice", job, now).status_code == 200
    assert no_flips_on_replay(api) == 3


def test_an_owner_gets_no_more_than_the_rule_says_from_the_engines_rounding(api: Api) -> None:
    """The embedded engine received floats with 6 decimals, so a value 4e-7 past the rule's bound (the unadjusted
    priority plus its slack of a millionth) compared as the bound itself and was hers alone."""
    job = submit(api)
    now = priority_of(api, job)["effective"]
    r = set_priority(api, "alice", job, now + 0.000001 + 4e-7)
    assert_problem(r, 403, "policy-denied", "at most to")
    assert priority_of(api, job)["effective"] == now
    assert set_priority(api, "alice", job, now + 0.000001 - 4e-7).status_code == 200  # within the slack


def test_an_owner_lowers_at_once_and_takes_the_lowering_back(api: Api) -> None:
    job = submit(api)
    # Some wait first, so the scheduler's value is not a round number (aging since submission).
    base = api.gateway.clock()
    api.gateway.clock = lambda: base + timedelta(seconds=1234.567)
    run_once(api.gateway)
    unadjusted = priority_of(api, job)["effective"]
    assert unadjusted != round(unadjusted)

    r = set_priority(api, "alice", job, 100)
    assert r.status_code == 200, r.text
    assert r.json()["decision"]["rules"] == ["A2.own"] and r.json()["priority_after"] == 100
    assert priority_of(api, job)["effective"] == 100
    # Back up to what the scheduler alone gives it: hers alone too.
    r = set_priority(api, "alice", job, unadjusted)
    assert r.status_code == 200, r.text
    assert r.json()["priority_after"] == unadjusted
    assert abs(priority_of(api, job)["parts"]["manual"]) < 1e-9
    (target,) = last_priority_decision(api)["input"]["targets"]
    assert target["priority"] == 100 and abs(target["unadjusted_priority"] - unadjusted) < 1e-9
    # Not one point past it.
    set_priority(api, "alice", job, 100)
    assert_problem(set_priority(api, "alice", job, unadjusted + 1), 403, "policy-denied", "at most to")
    assert [c["priority_after"] for c in changes(api)] == [100, unadjusted, 100]
    assert no_flips_on_replay(api) == 4


def test_a_queue_admin_raising_her_own_job_goes_the_a3_way(api: Api) -> None:
    job = submit(api, "carol")
    now = priority_of(api, job)["effective"]
    assert_problem(set_priority(api, "carol", job, now + 500), 403, "policy-denied", "needs a written reason")
    r = set_priority(api, "carol", job, now + 500, "release blocker")
    assert r.status_code == 202, r.text
    assert r.json()["decision"]["rules"] == ["A3.own_raise"] and r.json()["approval_id"]
    assert priority_of(api, job)["effective"] == now and changes(api) == []  # nothing until approved
    assert api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "carol").status_code == 403  # not herself
    done = api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "dave", json={"comment": "ok"})
    assert done.status_code == 200 and done.json()["state"] == "executed", done.text
    assert priority_of(api, job)["effective"] == now + 500
    # Lowering her own job needs no one.
    r = set_priority(api, "carol", job, now)
    assert r.status_code == 200 and r.json()["decision"]["rules"] == ["A2.own"], r.text
    assert no_flips_on_replay(api) == 4


def test_a_batch_of_own_jobs_is_judged_job_by_job(api: Api) -> None:
    raised, lowered, plain = (submit(api, sweep="s1") for _ in range(3))
    now = priority_of(api, plain)["effective"]
    # A queue admin's approved raise of one (A3), the owner's own lowering of another.
    asked = api.post(f"/v1/jobs/{raised}/priority", "carol", json={"priority": now + 300, "reason": "deadline"})
    assert api.post(f"/v1/approvals/{asked.json()['approval_id']}/approve", "dave").json()["state"] == "executed"
    assert set_priority(api, "alice", lowered, 100).status_code == 200
    before = len(changes(api))

    ask = {"selector": {"labels": {"sweep": "s1"}}, "priority": now + 200, "reason": "reorder"}
    dry = api.post("/v1/jobs:reprioritize", "alice", json={**ask, "dry_run": True})
    assert dry.status_code == 202 and dry.json()["decision"]["effect"] == "deny", dry.text
    r = api.post("/v1/jobs:reprioritize", "alice", json=ask)
    body = assert_problem(r, 403, "policy-denied", f"alice may set their own job {lowered} at most to")
    assert f"job {plain} at most to" in body["detail"] and raised not in body["detail"]
    assert dry.json()["decision"]["reasons"] == body["reasons"]
    assert len(changes(api)) == before  # nothing changed, not even the job within its ceiling
    assert priority_of(api, lowered)["effective"] == 100

    # At the scheduler's value every job is within its own ceiling: the raised one comes down, the lowered one
    # is taken back, the third stays.
    r = api.post("/v1/jobs:reprioritize", "alice", json={**ask, "priority": now})
    assert r.status_code == 202 and r.json()["decision"]["effect"] == "allow", r.text
    assert {priority_of(api, j)["effective"] for j in (raised, lowered, plain)} == {now}
    targets = last_priority_decision(api)["input"]["targets"]
    facts = {t["id"]: (t["priority"], t["unadjusted_priority"]) for t in targets}
    assert facts == {raised: (now + 300, now), lowered: (100, now), plain: (now, now)}
    assert no_flips_on_replay(api) >= 5


def test_a_renewal_asks_no_value_and_stays_the_owners(api: Api) -> None:
    """P3 decides job.priority with params.renew and no value: still A2.own, no priority facts loaded."""
    job = submit(api)
    with api.gateway.db.transaction() as s:
        s.get(Job, job).state = "running"
    renewal = {"progress": "epoch 40 of 90", "expected_remaining_seconds": 600}
    r = api.post(f"/v1/jobs/{job}/renew", "alice", json=renewal)
    assert r.status_code == 200, r.text
    decided = last_priority_decision(api)
    assert decided["decision"]["rules"] == ["A2.own"]
    assert "priority" not in decided["input"]["targets"][0]


def test_a_deleted_job_takes_no_priority_change(api: Api) -> None:
    """Only ended states were refused: a deleted job took a new priority, with a ledgered outcome, a queue
    snapshot, a history step and a scheduler run, for a job that can never run again."""
    job_id = submit(api)
    assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "cancel it"}).status_code in (200, 202)
    with api.gateway.db.transaction() as s:
        s.get(Job, job_id).state = "deleted"  # as an executed A6 deletion leaves it
    before = len(changes(api))
    assert_problem(set_priority(api, "alice", job_id, -5), 409, "conflict", "already ended (deleted)")
    assert len(changes(api)) == before
