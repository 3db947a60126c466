"""Red team: job state and GPU accounting across the glue (scheduling, preemption, stops, agent reports)."""

from __future__ import annotations

from gateway_testkit import Api, job_spec
from sqlalchemy import select
from test_sched_api import bring_up_nodes, job, report

from gateway.models import Allocation
from gateway.scheduling import run_once

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
