"""A job as the pure scheduler core sees it (scheduler.model): the waiting and running entries of a Snapshot, read
from a job's row and its scheduler row. One reading for every planner: jobgate's own loop (gateway/native/
scheduler_loop.py) and its preemption on an executor that places jobs itself (gateway/jobs/executor_preemption.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from gateway.jobs.records import run_began
from gateway.schemas import MAX_RUNTIME_LIMIT_S
from gateway.store.models import Job
from gateway.store.scheduler_tables import SchedJob
from scheduler.model import JobId, PendingJob, Placement, ProjectId, RunningJob


def runtime_limit(job: Job) -> float | None:
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


def pending_job(j: Job, s: SchedJob | None, *, needs_isolation: bool = False) -> PendingJob:
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
