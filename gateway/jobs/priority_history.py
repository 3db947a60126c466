"""Q3: a job's scheduling row (contribution, carried-over wait, compensation) and its priority history.

Every change of a job's effective priority is kept with its basis: `submit` (baseline + contribution),
`aging` / `fairshare` (recorded when the value moved by at least AGING_STEP since the last entry),
`manual`, `compensation` (after a preemption), `requeue` (stopped at its maximum occupancy: no compensation).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.jobs.deps import Jobs
from gateway.jobs.quotas import contribution_of
from gateway.jobs.scheduler_config import scheduler_config
from gateway.store.db import transient
from gateway.store.models import Job
from gateway.store.scheduler_tables import PastRun, PriorityChange, SchedJob

# Aging and fair share move a little every cycle; a history entry per cycle would say nothing new.
AGING_STEP = 1.0


def on_submit(gw: Jobs, job: Job, *, submitter: str, mounts: list[str],
              datasets: list[str]) -> tuple[SchedJob, PriorityChange]:
    """The new job's scheduling row and its first priority entry (baseline + contribution), to insert. The
    contribution is the owner's, or the submitter's if lower: naming an owner lends the job no one's standing."""
    now = gw.clock()
    config = scheduler_config(gw)
    whose = min({job.owner, submitter}, key=lambda user: (contribution_of(gw, user), user != job.owner))
    contribution = contribution_of(gw, whose)
    baseline = config.queue_baseline[job.queue]
    parts = {"baseline": baseline, "contribution": contribution, "aging": 0.0, "manual": 0.0,
             "compensation": 0.0, "fairshare": 0.0, "total": baseline + contribution}
    row = transient(SchedJob, job_id=job.id, contribution=contribution, queued_at=now, mounts=list(mounts),
                    datasets=list(datasets), priority=baseline + contribution, parts=parts,
                    recorded_priority=baseline + contribution)
    return row, change(job.id, now, "submit", None, parts, note=f"queue {job.queue} baseline {baseline:g} + "
                       f"contribution of {whose} {contribution:g}")


def ensure(session: Session, job: Job) -> SchedJob:
    """The job's scheduling row (created for jobs submitted before the scheduler kept one)."""
    row = session.get(SchedJob, job.id)
    if row is None:
        row = SchedJob(job_id=job.id, queued_at=job.submitted_at, contribution=job.base_priority)
        session.add(row)
    return row


def keep_run(session: Session, job: Job, row: SchedJob, ended_at: datetime) -> None:
    """Q11: the job goes back to the queue and its row will forget its last run: keep that run (if it began in
    the current stint) for the statistics. Call before carry_wait, which starts the next stint."""
    if job.started_at is not None and job.started_at >= row.queued_at:
        session.add(PastRun(job_id=job.id, project=job.project, queue=job.queue, gpus=job.gpus_per_node * job.nodes,
                            waited_s=(job.started_at - row.queued_at).total_seconds(), started_at=job.started_at,
                            ended_at=max(ended_at, job.started_at)))


def carry_wait(row: SchedJob, wait_ended: datetime, now: datetime) -> None:
    """P2: the job's stint in the queue (row.queued_at → wait_ended) is kept as wait credit and a new stint
    starts now. Time between the two (running, stopping, paused) is not waiting and does not age the job."""
    row.wait_credit_s += max(0.0, (wait_ended - row.queued_at).total_seconds())
    row.queued_at = now


def record(session: Session, job_id: str, at: datetime, basis: str, before: float | None,
           parts: dict[str, Any], note: str = "") -> None:
    session.add(change(job_id, at, basis, before, parts, note))


def change(job_id: str, at: datetime, basis: str, before: float | None, parts: dict[str, Any],
           note: str = "") -> PriorityChange:
    return transient(PriorityChange, job_id=job_id, at=at, basis=basis, before=before, after=float(parts["total"]),
                     parts=dict(parts), note=note)


def history(session: Session, job_id: str) -> list[dict[str, Any]]:
    rows = session.scalars(select(PriorityChange).where(PriorityChange.job_id == job_id)
                           .order_by(PriorityChange.id)).all()
    return [{"at": r.at.isoformat(), "basis": r.basis, "before": r.before, "after": r.after, "parts": r.parts,
             "note": r.note} for r in rows]


def basis_of_change(old: dict[str, Any], new: dict[str, float]) -> str:
    """Which part moved the most since the last entry (aging, fairshare, manual, compensation)."""
    keys = ("aging", "fairshare", "manual", "compensation", "contribution", "baseline")
    return max(keys, key=lambda k: abs(float(new.get(k, 0.0)) - float(old.get(k, 0.0))))
