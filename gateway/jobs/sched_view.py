"""A job as the pure scheduler core sees it (scheduler.model): the waiting and running entries of a Snapshot, read
from a job's row and its scheduler row. One reading for every planner: jobgate's own loop (gateway/native/
scheduler_loop.py) and its preemption on an executor that places jobs itself (gateway/jobs/executor_preemption.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from gateway.jobs.records import run_began
from gateway.schemas import MAX_RUNTIME_LIMIT_S
from gateway.store.models import Job
from scheduler.model import JobId, PendingJob, Placement, ProjectId, RunningJob


class WaitingFacts(Protocol):
    """What the planners read of a waiting job: its jobs row, or a plain row of these columns (a scheduler cycle
    reads a long queue without building ORM objects)."""

    @property
    def id(self) -> str: ...
    @property
    def project(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def submitted_at(self) -> datetime: ...
    @property
    def base_priority(self) -> float: ...
    @property
    def runtime_limit_s(self) -> float | None: ...
    @property
    def stoppable(self) -> bool: ...
    @property
    def external_rights(self) -> bool: ...
    @property
    def auto_offline(self) -> bool: ...
    @property
    def valid_until(self) -> datetime | None: ...


class QueueFacts(Protocol):
    """What the planners read of a waiting job's scheduler row (gateway/store/scheduler_tables.py: SchedJob)."""

    @property
    def queued_at(self) -> datetime: ...
    @property
    def contribution(self) -> float: ...
    @property
    def wait_credit_s(self) -> float: ...
    @property
    def compensation(self) -> float: ...
    @property
    def manual(self) -> float: ...


def runtime_limit(job: WaitingFacts) -> float | None:
    """The job's runtime limit as the scheduler may use it. Submissions are bounded (MAX_RUNTIME_LIMIT_S), but a
    row stored before that bound existed may hold one that overflows a datetime and would fail every cycle, for
    everybody's jobs."""
    limit = job.runtime_limit_s
    return None if limit is None else min(limit, MAX_RUNTIME_LIMIT_S)


def stop_by(job: Job) -> datetime | None:
    """When a job being stopped ends at the latest: its grace window after the stop was asked."""
    if job.state not in ("stop_requested", "stopping"):
        return None
    at = job.stop_request.get("at")
    asked = datetime.fromisoformat(at) if at else job.submitted_at
    return asked + timedelta(seconds=job.grace_seconds)


def pending_job(j: WaitingFacts, s: QueueFacts | None, *, needs_isolation: bool = False) -> PendingJob:
    return PendingJob(
        id=JobId(j.id), project=ProjectId(j.project), user=j.owner, queue=j.queue,
        gpus_per_node=j.gpus_per_node, nodes=j.nodes, submitted_at=s.queued_at if s else j.submitted_at,
        base_priority=(s.contribution if s else 0.0) + j.base_priority, runtime_limit_s=runtime_limit(j),
        wait_credit_s=s.wait_credit_s if s else 0.0, compensation=s.compensation if s else 0.0,
        manual=s.manual if s else 0.0, stoppable=j.stoppable, needs_isolation=needs_isolation)


def running_job(j: Job, *, priority: float, placement: Sequence[Placement], borrowed: bool,
                occupancy_since: datetime | None) -> RunningJob:
    return RunningJob(
        id=JobId(j.id), project=ProjectId(j.project), user=j.owner, queue=j.queue, priority=priority,
        started_at=run_began(j), placement=tuple(placement), runtime_limit_s=runtime_limit(j), borrowed=borrowed,
        stop_by=stop_by(j), stoppable=j.stoppable, grace_s=min(max(j.grace_seconds, 0.0), MAX_RUNTIME_LIMIT_S),
        occupancy_since=occupancy_since)
