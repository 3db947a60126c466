"""Red team: job state and GPU accounting across the glue (scheduling, preemption, stops, agent reports)."""

from __future__ import annotations

from gateway_testkit import Api, job_spec
from sqlalchemy import select
from test_sched_api import advance, bring_up_nodes, job, report

from gateway.models import Allocation
from gateway.scheduler_tables import PreemptionRow, SchedJob
from gateway.scheduling import run_once
from scheduler.model import SchedulerConfig

DONE = {"exit_code": 0, "process_group_gone": True}


def test_a_gang_member_that_exited_first_does_not_stop_scheduling_and_frees_only_its_gpus(api: Api) -> None:
    """One node of a running gang reports its part exited (GPUs released there) while the other part still
    runs. The snapshot listed the gang on its whole placement, so the released GPUs were both held and free:
    every cycle raised InconsistentSnapshot, for everybody, and stop escalation (same transaction) stalled."""
    bring_up_nodes(api)
    gang = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, nodes=2)).json()["id"]
    assert run_once(api.gateway) == 1
    for node in ("demo-node-1", "demo-node-2"):
        report(api, node, gang, "started", pid=10)
    report(api, "demo-node-1", gang, "exited", evidence=DONE)
    assert job(api, gang)["state"] == "running"  # its other member still runs

    other = api.post("/v1/jobs", "bob", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    assert [p["node"] for p in job(api, other)["placement"]] == ["demo-node-1"]
    with api.gateway.db.transaction() as s:
        held = s.execute(select(Allocation.job_id, Allocation.node).where(Allocation.released.is_(False))).all()
    assert sorted(held) == sorted([(gang, "demo-node-2"), (other, "demo-node-1")])



def _requeued_by_occupancy(api: Api) -> tuple[str, str]:
    """A running job stopped for an unrenewed occupancy period (P3) and requeued; returns (job, node)."""
    api.gateway.scheduler_config = SchedulerConfig(max_occupancy_s=3600, renewal_window_s=600)
    bring_up_nodes(api)
    j = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8)).json()["id"]
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=7)
    advance(api, 3600 + 700)
    run_once(api.gateway)
    assert job(api, j)["state"] == "stop_requested"
    report(api, node, j, "stopping")
    report(api, node, j, "stopped", evidence={"outcome": "graceful", **DONE})
    assert job(api, j)["state"] == "pending"
    return j, node


def test_a_requeued_job_that_later_finishes_succeeds_instead_of_being_requeued_again(api: Api) -> None:
    """The requeue kept the preemption's stop request on the job, so when the next run ended on its own (exit 0)
    the agent's report was taken for the preemption's stop: the finished job went back to the queue with more
    compensation, and would run again and again."""
    j, _ = _requeued_by_occupancy(api)
    advance(api, 3600 + 800)
    assert run_once(api.gateway) == 1
    node = job(api, j)["placement"][0]["node"]
    report(api, node, j, "started", pid=8)
    report(api, node, j, "exited", evidence=DONE)
    done = job(api, j)
    assert done["state"] == "succeeded", done["history"][-1]
    assert done["stop_request"] == {}
    with api.gateway.db.transaction() as s:
        assert s.get(SchedJob, j).preemptions == 1
        assert [r.state for r in s.scalars(select(PreemptionRow).where(PreemptionRow.victim == j))] == ["requeued"]
