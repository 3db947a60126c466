"""Red-team tests of the scheduler through the gateway: what a waiting user is shown (Q10), which running
jobs a preemption may take (R5, Q8), and how a job's wait ages across runs (Q3, P2)."""

from __future__ import annotations

from datetime import datetime

from gateway_testkit import Api, job_spec
from test_sched_api import advance, bring_up_nodes, job, report

from gateway.scheduler_tables import SchedJob
from gateway.scheduling import run_once


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
