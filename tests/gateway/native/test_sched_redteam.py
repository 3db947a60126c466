"""Red-team tests of the scheduler through the gateway: what a waiting user is shown (Q10), which running
jobs a preemption may take (R5, Q8), and how a job's wait ages across runs (Q3, P2)."""

from __future__ import annotations

from datetime import datetime, timedelta

from gateway_testkit import Api, job_spec
from sched_testkit import advance, bring_up_nodes, job, node_headers, report, set_quota

from gateway.decisions.policy.engine import RoleBinding as PolicyBinding
from gateway.native.scheduler_loop import run_once
from gateway.store.models import RoleBinding
from gateway.store.scheduler_tables import SchedJob


def test_the_estimated_start_counts_the_gpus_this_cycle_just_gave_away(api: Api) -> None:
    """Q10: two 2 h jobs take both nodes; the third cannot start before one of them ends. The estimate was
    simulated on the cluster as it was before the cycle's admits, so it said 'now' while the reason said 2 h."""
    bring_up_nodes(api)
    specs = [job_spec(gpus_per_node=8, name=f"j{i}", runtime_limit_seconds=7200) for i in range(3)]
    ids = [api.post("/v1/jobs", "alice", json=spec).json()["id"] for spec in specs]
    now = api.gateway.clock()
    assert run_once(api.gateway) == 2
    waiting = next(j for j in ids if job(api, j)["state"] == "pending")
    q = api.get(f"/v1/jobs/{waiting}/queue", "alice").json()
    assert q["estimated_start"] is not None
    assert (datetime.fromisoformat(q["estimated_start"]) - now).total_seconds() >= 7200, q


def test_a_job_declared_not_stoppable_is_never_chosen_as_a_preemption_victim(api: Api) -> None:
    """R5, Q8: a job that says it cannot be stopped from here is no victim, however low its priority; the
    urgent job takes the lowest-priority job that can be stopped instead."""
    bring_up_nodes(api)
    blind = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="blind", stoppable=False)).json()["id"]
    other = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="other")).json()["id"]
    assert run_once(api.gateway) == 2
    for j in (blind, other):
        report(api, job(api, j)["placement"][0]["node"], j, "started", pid=1)
    with api.gateway.db.transaction() as s:
        s.get(SchedJob, blind).priority -= 100  # the cheapest victim by priority alone
    advance(api, 3600)
    api.post("/v1/jobs", "carol", json=job_spec(gpus_per_node=8, queue="urgent", name="u"))
    run_once(api.gateway)
    assert job(api, blind)["state"] == "running"
    assert job(api, other)["state"] == "stop_requested"


def test_a_job_declared_not_stoppable_waits_for_its_own_quota_rather_than_borrow(api: Api) -> None:
    """Q5, R5: borrowed GPUs go back when their lender reclaims them, by preempting the borrower; a job that
    cannot be stopped is never a victim. Any submitter may declare that, so it was a way to keep borrowed GPUs
    for ever: admitted on vision's idle quota, it left vision's own job waiting with nothing to reclaim."""
    bring_up_nodes(api)
    set_quota(api, "vision", 8)
    set_quota(api, "speech", 8, borrow_limit=8)
    own = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name="own")).json()["id"]
    blind = api.post("/v1/jobs", "mallory", json=job_spec(project="speech", gpus_per_node=8, name="blind",
                                                          stoppable=False)).json()["id"]
    assert run_once(api.gateway) == 1
    assert job(api, own)["state"] == "starting"
    assert job(api, blind)["state"] == "pending"
    reason = api.get(f"/v1/jobs/{blind}/queue", "mallory").json()["blocking_reason"]
    assert "cannot be stopped" in reason and "own quota" in reason, reason
    lender = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="lender")).json()["id"]
    assert run_once(api.gateway) == 1
    assert {p["quota"] for p in job(api, lender)["placement"]} == {"owned"}
    node = job(api, own)["placement"][0]["node"]
    report(api, node, own, "started", pid=1)
    report(api, node, own, "exited", evidence={"process_group_gone": True, "exit_code": 0})
    assert run_once(api.gateway) == 1  # speech's own quota is free again: the job starts on it
    assert {p["quota"] for p in job(api, blind)["placement"]} == {"owned"}


def test_a_resumed_job_ages_by_its_time_in_the_queue_not_by_its_time_running(api: Api) -> None:
    """Q3, P2: aging rewards waiting. A job that ran ten hours, was paused and resumed had those hours of
    running counted as wait (its queue entry time was kept), so it came back aged as if it had queued all
    along, ahead of jobs that really waited."""
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=1)
    advance(api, 10 * 3600)
    assert api.post(f"/v1/jobs/{j}/pause", "alice", json={"reason": "free the GPUs for a while"}).status_code == 202
    report(api, node, j, "stopped", evidence={"outcome": "graceful", "exit_code": 0})
    assert job(api, j)["state"] == "paused"
    assert api.post(f"/v1/jobs/{j}/resume", "alice", json={"reason": "back to work"}).status_code == 200
    assert run_once(api.gateway) == 1
    parts = api.get(f"/v1/jobs/{j}/queue", "alice").json()["priority"]["parts"]  # as admitted again
    assert parts["aging"] < 1.0, parts


def test_a_user_limit_in_one_tenants_quota_binds_that_tenant_only(api: Api) -> None:
    """Q4: a quota's `users` are 'per-user GPU limits within this tenant'. Alice, limited to 2 GPUs in vision,
    also works in speech: her speech job was refused by vision's limit, and her speech GPUs used it up."""
    bring_up_nodes(api)
    with api.gateway.db.transaction() as s:
        s.add(RoleBinding(principal_id="alice", role="researcher", project="speech", created_at=api.gateway.clock()))
    api.gateway.policy.grant(PolicyBinding(principal="alice", role="researcher", project="speech"))
    set_quota(api, "vision", 8, users={"alice": 2})
    set_quota(api, "speech", 8)
    r = api.post("/v1/jobs", "alice", json=job_spec(project="speech", gpus_per_node=4, name="speech"))
    assert r.status_code == 201, r.text
    mine = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=2, name="vision")).json()["id"]
    assert run_once(api.gateway) == 2
    assert job(api, mine)["state"] == "starting"
    r = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=4, name="too-big"))
    assert r.status_code == 422 and "user quota of alice" in r.json()["detail"]  # her vision limit still holds


def test_the_cluster_view_counts_free_gpus_on_alive_nodes_when_a_node_is_lost(api: Api) -> None:
    """Q10: one node is lost with its 8-GPU job (GPUs withheld there); the other node is idle. The view counted
    the lost node's GPUs in use against the alive nodes' capacity and said the cluster had nothing free."""
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    lost = job(api, j)["placement"][0]["node"]
    report(api, lost, j, "started", pid=1)
    base = api.gateway.clock()
    api.gateway.clock = lambda: base + timedelta(seconds=api.settings.node_heartbeat_timeout_s + 1)
    alive = next(n for n in ("demo-node-1", "demo-node-2") if n != lost)
    r = api.client.post(
        f"/v1/agents/{alive}/heartbeat", headers=node_headers(api, alive), json={"gpus": 8, "running": []}
    )
    assert r.status_code == 200, r.text
    run_once(api.gateway)
    assert job(api, j)["state"] == "lost"
    cluster = api.get("/v1/queues", "alice").json()["cluster"]
    assert (cluster["gpus"], cluster["in_use"], cluster["free"]) == (8, 0, 8), cluster
    assert cluster["by_tenant"]["vision"]["owned"] == 8  # still counted against vision's quota
