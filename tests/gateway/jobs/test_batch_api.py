"""Batch stops (H2): selectors resolve to exact ids, dry runs change nothing, limits refuse with numbers."""

from __future__ import annotations

from gateway_testkit import Api, assert_problem, job_spec, ledger_entries
from sqlalchemy import select

from gateway.store.models import Job


def submit_many(api: Api, n: int, who: str = "alice", **spec: object) -> list[str]:
    return [api.post("/v1/jobs", who, json=job_spec(**spec)).json()["id"] for _ in range(n)]


def states(api: Api, ids: list[str]) -> set[str]:
    with api.gateway.db.transaction() as s:
        return set(s.scalars(select(Job.state).where(Job.id.in_(ids))).all())


def test_dry_run_returns_exact_targets_and_blast_radius_and_changes_nothing(api: Api) -> None:
    sweep = submit_many(api, 3, labels={"sweep": "lr"}, gpus_per_node=4)
    submit_many(api, 2, labels={"sweep": "other"})
    seq_before = len(ledger_entries(api))
    r = api.post("/v1/jobs:stop", "alice", json={"selector": {"labels": {"sweep": "lr"}}, "reason": "bad lr grid",
                                                 "dry_run": True})
    assert r.status_code == 202, r.text
    out = r.json()
    assert out["targets"] == sorted(sweep)
    assert out["blast_radius"] == {"jobs": 3, "projects": ["vision"], "gpus": 12, "gpu_hours_at_stake": 0.0,
                                   "running": 0}
    assert out["decision"]["effect"] == "allow"
    assert states(api, sweep) == {"pending"}
    assert len(ledger_entries(api)) == seq_before  # a dry run is not a mutation


def test_batch_stop_by_selector_stops_only_the_selection(api: Api) -> None:
    sweep = submit_many(api, 3, labels={"sweep": "lr"})
    others = submit_many(api, 2, labels={"sweep": "other"})
    r = api.post("/v1/jobs:stop", "alice", json={"selector": {"labels": {"sweep": "lr"}}, "reason": "bad lr grid"})
    assert r.status_code == 202, r.text
    assert set(r.json()["states"].values()) == {"stopped"}
    assert states(api, sweep) == {"stopped"} and states(api, others) == {"pending"}
    decision = next(e for e in ledger_entries(api) if e["kind"] == "decision"
                    and e["body"]["input"]["action"] == "job.stop")
    assert sorted(t["id"] for t in decision["body"]["input"]["targets"]) == sorted(sweep)


def test_a_selector_matching_too_many_jobs_is_refused_with_the_numbers(api: Api) -> None:
    """A blast-radius limit is no rate limit: the same call is refused again later, so 403 and no Retry-After."""
    limit = api.gateway.policy_set.data["limits"]["jobs_per_batch"]
    ids = submit_many(api, limit + 5, labels={"team": "all"}, gpus_per_node=1)
    r = api.post("/v1/jobs:stop", "carol", json={"selector": {"project": "vision"}, "reason": "clear the queue"})
    assert r.status_code == 403 and "retry-after" not in r.headers, r.text
    detail = r.json()["detail"]
    assert f"names {limit + 5} jobs" in detail and f"at most {limit}" in detail
    assert states(api, ids) == {"pending"}


def test_explicit_ids_must_all_exist(api: Api) -> None:
    ids = submit_many(api, 1)
    r = api.post("/v1/jobs:stop", "alice", json={"ids": [*ids, "j-nope"], "reason": "cleanup"})
    assert r.status_code == 422 and "j-nope" in r.json()["detail"]
    assert states(api, ids) == {"pending"}


def test_ids_and_selector_together_are_refused(api: Api) -> None:
    r = api.post("/v1/jobs:stop", "alice", json={"ids": ["j-1"], "selector": {"project": "vision"},
                                                 "reason": "cleanup"})
    assert r.status_code == 422 and "exactly one" in r.json()["detail"]


def test_selector_never_reaches_into_projects_the_caller_cannot_see(api: Api) -> None:
    submit_many(api, 2)
    r = api.post("/v1/jobs:stop", "mallory", json={"selector": {"queue": "normal"}, "reason": "free the GPUs",
                                                   "dry_run": True})
    assert r.status_code == 422 and "matches no job" in r.json()["detail"]


def test_a_selector_that_narrows_nothing_is_refused_not_taken_for_every_job(api: Api) -> None:
    """An empty selector (a script whose variables came out empty) selected every job the caller could see."""
    ids = submit_many(api, 2)
    for selector in ({}, {"labels": {}}, {"state": "pending"}):
        r = api.post("/v1/jobs:stop", "alice", json={"selector": selector, "reason": "cleanup", "dry_run": True})
        assert r.status_code == 422 and "a selector must name at least one of" in r.json()["detail"], r.text
    assert states(api, ids) == {"pending"}


def test_others_jobs_in_a_batch_need_approval_bound_to_the_exact_list(api: Api) -> None:
    ids = submit_many(api, 3)
    r = api.post("/v1/jobs:stop", "carol", json={"ids": ids, "reason": "maintenance window"})
    assert r.status_code == 202, r.text
    approval = api.get(f"/v1/approvals/{r.json()['approval_id']}", "dave").json()
    assert approval["targets"] == sorted(ids)
    assert approval["blast_radius"]["jobs"] == 3
    assert states(api, ids) == {"pending"}


def test_rate_limit_per_principal_answers_429_with_retry_after_and_is_ledgered(api: Api) -> None:
    """A used-up calls-per-minute limit was a 403, which tells a client not to try again; it is a 429 (RFC 6585)
    whose Retry-After says when the oldest call of the minute leaves the window."""
    per_minute = api.gateway.limiter.per_principal
    ids = submit_many(api, 1)
    codes = [api.post("/v1/jobs:stop", "bob", json={"ids": ids, "reason": "poke"}).status_code
             for _ in range(per_minute)]
    assert 429 not in codes, codes  # (bob's stops are refused by policy, 403, and counted all the same)
    r = api.post("/v1/jobs:stop", "bob", json={"ids": ids, "reason": "poke"})
    problem = assert_problem(r, 429, "rate-limited", f"may make {per_minute} mutating calls per minute")
    assert problem["rules"] == ["H2.rate_limit"]
    assert 1 <= int(r.headers["retry-after"]) <= 60 and problem["retry_after_s"] == int(r.headers["retry-after"])
    refusal = next(e for e in ledger_entries(api) if e["seq"] == problem["ledger_seq"])
    assert refusal["kind"] == "decision" and refusal["body"]["decision"]["effect"] == "deny"
    assert refusal["body"]["decision"]["rules"] == ["H2.rate_limit"]


def test_batch_reprioritize_own_jobs_and_others_jobs_through_one_approval(api: Api) -> None:
    mine = submit_many(api, 2, labels={"sweep": "wd"})
    r = api.post("/v1/jobs:reprioritize", "alice", json={"selector": {"labels": {"sweep": "wd"}}, "priority": 42,
                                                         "reason": "deadline tomorrow"})
    assert r.status_code == 202, r.text
    assert r.json()["decision"]["effect"] == "allow" and r.json()["targets"] == sorted(mine)
    changed = [e["body"] for e in ledger_entries(api) if e["kind"] == "outcome"
               and e["body"].get("action") == "job.priority"]
    assert sorted(b["job_id"] for b in changed) == sorted(mine)
    assert {b["priority_after"] for b in changed} == {42}

    r = api.post("/v1/jobs:reprioritize", "carol", json={"ids": mine, "priority": -5, "reason": "fair share"})
    assert r.status_code == 202 and r.json()["approval_id"], r.text
    approval = api.get(f"/v1/approvals/{r.json()['approval_id']}", "dave").json()
    assert approval["targets"] == sorted(mine) and approval["params"] == {"priority": -5}
    # Two jobs make a workload-sized request: two confirmations (C2), here on-call and the owner.
    assert api.post(f"/v1/approvals/{approval['id']}/approve", "dave").json()["state"] == "pending"
    assert api.post(f"/v1/approvals/{approval['id']}/approve", "alice").json()["state"] == "executed"
    after = [e["body"] for e in ledger_entries(api) if e["kind"] == "outcome"
             and e["body"].get("action") == "job.priority" and e["body"].get("priority_after") == -5]
    assert sorted(b["job_id"] for b in after) == sorted(mine)
