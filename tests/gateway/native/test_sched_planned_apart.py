"""SQLite: a scheduler cycle plans in a read transaction, so the requests that write (stops, approvals, submissions)
go on while it plans; and what they change meanwhile is not written over by the plan, made before they came."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_testkit import Api, InBackground, job_spec, start_api
from sched_testkit import bring_up_nodes, full_cluster_an_hour_on, job, report
from sqlalchemy import select

from gateway.native import scheduler_loop
from gateway.native.scheduler_loop import run_once
from gateway.settings import Settings
from gateway.store.models import Allocation, NodeCommand
from gateway.store.scheduler_tables import PriorityChange, SchedJob

# How long a request made while the cycle plans may take: far more than it needs, far less than "never".
PATIENCE_S = 20.0


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from start_api(Settings(data_dir=tmp_path))


def while_planning(monkeypatch: pytest.MonkeyPatch, during: Callable[[], None]) -> None:
    """Run `during` once, in the middle of the next cycle: after its snapshot was read, before its plan is made."""
    real = scheduler_loop.run_cycle
    calls = []

    def planning(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            calls.append(1)
            during()
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler_loop, "run_cycle", planning)


def stop_in_background(api: Api, user: str, job_id: str) -> None:
    """Stop the job from another thread, as a request does, and wait for its answer: had the cycle kept the write
    lock while planning, the stop would wait for the cycle, which waits here for the stop."""
    call = InBackground(lambda: api.post(f"/v1/jobs/{job_id}/stop", user, json={"reason": "no longer needed"}))
    took = call.wait(PATIENCE_S)
    assert took < PATIENCE_S, "the stop waited for the cycle's plan to be written"
    assert call.answer.status_code == 202, call.answer.text


def test_a_job_stopped_while_the_cycle_plans_is_not_started(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    bring_up_nodes(api)
    job_id = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=2)).json()["id"]
    while_planning(monkeypatch, lambda: stop_in_background(api, "alice", job_id))
    run_once(api.gateway)  # its plan admitted the job
    assert job(api, job_id)["state"] == "stopped"
    with api.gateway.transaction(immediate=False) as s:
        assert s.scalars(select(Allocation).where(Allocation.job_id == job_id)).all() == []
        assert s.scalars(select(NodeCommand).where(NodeCommand.job_id == job_id, NodeCommand.kind == "start")).all() \
            == []


def test_a_waiting_job_stopped_while_the_cycle_plans_keeps_what_its_stop_wrote(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    full_cluster_an_hour_on(api)
    waiting = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="w")).json()["id"]
    run_once(api.gateway)
    with api.gateway.transaction(immediate=False) as s:
        explained_at = s.get(SchedJob, waiting).estimated_at
    assert job(api, waiting)["state_reason"]  # the cycle said why it waits
    while_planning(monkeypatch, lambda: stop_in_background(api, "alice", waiting))
    run_once(api.gateway)  # its plan explains the job as still waiting
    stopped = job(api, waiting)
    assert stopped["state"] == "stopped"
    assert "waiting" not in (stopped["state_reason"] or "") and "GPUs" not in (stopped["state_reason"] or ""), stopped
    with api.gateway.transaction(immediate=False) as s:
        assert s.get(SchedJob, waiting).estimated_at == explained_at  # not explained again


def test_a_preemption_for_a_job_stopped_while_the_cycle_plans_stops_no_one(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    running = full_cluster_an_hour_on(api)
    urgent = api.post("/v1/jobs", "carol", json=job_spec(gpus_per_node=8, queue="urgent", name="u")).json()["id"]
    while_planning(monkeypatch, lambda: stop_in_background(api, "carol", urgent))
    run_once(api.gateway)  # its plan preempts the cheaper running job for the urgent one
    assert [job(api, j)["state"] for j in running] == ["running", "running"]
    assert job(api, urgent)["state"] == "stopped"


def test_a_priority_set_while_the_cycle_plans_is_not_written_over(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A2: the owner lowers her waiting job while the cycle plans; the plan, read before, must not put the old
    value back (or record aging from it) until a cycle that reads the new one."""
    full_cluster_an_hour_on(api)
    waiting = api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name="w")).json()["id"]
    run_once(api.gateway)

    def lower() -> None:
        call = InBackground(lambda: api.post(f"/v1/jobs/{waiting}/priority", "alice", json={"priority": 1}))
        assert call.wait(PATIENCE_S) < PATIENCE_S and call.answer.status_code == 200, call.answer.text

    while_planning(monkeypatch, lower)
    run_once(api.gateway)
    with api.gateway.transaction(immediate=False) as s:
        row = s.get(SchedJob, waiting)
        assert (row.priority, row.parts["total"], row.recorded_priority) == (1, 1, 1)
        last = s.scalars(select(PriorityChange).where(PriorityChange.job_id == waiting)
                         .order_by(PriorityChange.id.desc())).first()
    assert last is not None and last.basis == "manual" and last.after == 1


def test_without_changes_meanwhile_the_plan_is_written_whole(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """The explanation goes in several transactions; every waiting job gets its own."""
    monkeypatch.setattr(scheduler_loop, "EXPLAINED_PER_TRANSACTION", 3)
    running = full_cluster_an_hour_on(api)
    report(api, job(api, running[0])["placement"][0]["node"], running[0], "exited",
           evidence={"process_group_gone": True, "exit_code": 0})
    ids = [api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=8, name=f"w{i}")).json()["id"] for i in range(8)]
    assert run_once(api.gateway) == 1  # the freed node takes one of them
    waiting = [j for j in ids if job(api, j)["state"] == "pending"]
    assert len(waiting) == 7
    with api.gateway.transaction(immediate=False) as s:
        rows = s.scalars(select(SchedJob).where(SchedJob.job_id.in_(waiting))).all()
    assert len({r.position for r in rows if r.position is not None}) == 7
    assert len({r.estimated_at for r in rows}) == 1 and rows[0].estimated_at is not None
