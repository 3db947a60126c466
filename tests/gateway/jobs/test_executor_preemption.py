"""jobgate's own preemption for an executor that places jobs itself (gateway/jobs/executor_preemption.py, the Slurm
backend's step 6): the pure core's plan on the executor's view, where GPUs that jobs jobgate does not govern use
count as taken, and those jobs are never victims. Driven here through the native gateway's store and stops (real
parts: the ledger, the stop state machine, the node commands), the executor's view given as the Slurm loop gives it."""

from __future__ import annotations

from gateway_testkit import Api, job_spec, ledger_entries
from sched_testkit import advance, bring_up_nodes, job, report

from gateway.jobs.executor_preemption import may_preempt, preempt_for
from gateway.native.scheduler_loop import run_once


def a_full_pool_but_for_one_node(api: Api) -> tuple[str, str, str]:
    """demo-node-1 and -2 (8 GPUs each): a governed normal job runs on one, past its minimum runtime; an urgent
    8-GPU job waits. Returns (the running job, its node, the urgent job)."""
    bring_up_nodes(api)
    fill = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    node = str(job(api, fill)["placement"][0]["node"])
    report(api, node, fill, "started", pid=1)
    advance(api, 3600)
    urgent = api.post("/v1/jobs", "carol", json=job_spec(queue="urgent", gpus_per_node=8)).json()["id"]
    return fill, node, urgent


def test_gpus_jobs_it_does_not_govern_use_count_as_taken_and_the_governed_job_is_the_victim(api: Api) -> None:
    fill, node, urgent = a_full_pool_but_for_one_node(api)
    other = next(n for n in ("demo-node-1", "demo-node-2") if n != node)
    gw = api.gateway
    normal = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=8)).json()["id"]
    with gw.transaction() as session:
        # Only a job of a preempting queue (urgent) preempts, as natively.
        assert not may_preempt(gw, session, [normal]) and preempt_for(gw, session, [normal], {other: 8}) == []
        assert may_preempt(gw, session, [urgent])
        # Seen free (nothing of jobgate's there), the other node takes the urgent job: no plan, nothing stopped.
        assert preempt_for(gw, session, [urgent], {}) == []
    assert job(api, fill)["state"] == "running"
    with gw.transaction() as session:
        # The executor says a job submitted straight to it holds the other node: the governed job is the victim.
        (seq,) = preempt_for(gw, session, [urgent], {other: 8})
    assert job(api, fill)["state"] == "stop_requested"
    assert job(api, fill)["stop_request"]["preemption"]["preemptor"] == urgent
    (decision,) = [e["body"] for e in ledger_entries(api) if e["seq"] == seq]
    assert decision["input"]["targets"] == [fill] and decision["decision"]["rules"] == ["Q8.priority_preemption"]
    with gw.transaction() as session:
        # Its window running, its GPUs count as coming free: no second plan.
        assert preempt_for(gw, session, [urgent], {other: 8}) == []

