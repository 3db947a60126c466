"""/v1/jobs/{id}/queue, /v1/queues, /v1/stats/preemptions: why a job waits and what the queues look like
(Q9, Q10)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from gateway.api.deps import Ctx, JobId
from gateway.decisions import pipeline
from gateway.errors import Invalid
from gateway.execution.slurm.execution import slurm_view
from gateway.jobs import preemption, priority_history, records
from gateway.jobs.quotas import alive_capacity, usage_by_tenant
from gateway.schemas import MAX_RUNTIME_LIMIT_S
from gateway.store.models import Job, Project
from gateway.store.scheduler_tables import SchedJob
from scheduler.model import QUEUES

router = APIRouter(tags=["queues"])


class RenewBody(BaseModel):
    """The owner's word that a long job still makes progress (P3)."""

    model_config = ConfigDict(extra="forbid")

    progress: str = Field(min_length=3, max_length=2000, description="Progress so far; kept in the ledger.")
    expected_remaining_seconds: float = Field(gt=0, le=MAX_RUNTIME_LIMIT_S, allow_inf_nan=False,
                                              description="How much longer the job expects to run; at most a year.")


@router.post("/v1/jobs/{job_id}/renew", summary="Renew a long job's occupancy (P3, owner only)")
def renew_job(job_id: JobId, body: RenewBody, ctx: Ctx) -> dict[str, Any]:
    """Past its maximum continuous occupancy a job must be renewed by its owner, confirming progress and the
    expected remaining time; otherwise it is gracefully stopped and requeued when the window ends."""
    with ctx.gw.transaction() as session:
        return preemption.renew(ctx.gw, session, ctx.caller(session), job_id, body.progress,
                                body.expected_remaining_seconds)


def _queue_rows(session: Any, queue: str) -> list[tuple[Job, SchedJob | None]]:
    rows = session.execute(select(Job, SchedJob).join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
                           .where(Job.state == "pending", Job.queue == queue)).all()
    return sorted(((j, s) for j, s in rows),
                  key=lambda js: (-(js[1].priority if js[1] else 0.0), js[0].submitted_at, js[0].id))


@router.get("/v1/jobs/{job_id}/queue", summary="Why a job waits: position, priority parts, reason, estimate")
def job_queue(job_id: JobId, ctx: Ctx) -> dict[str, Any]:
    """Position in its queue, effective priority and its parts, the blocking reason, the estimated start
    (simulated forward with declared runtime limits, refreshed every scheduling cycle), the priorities of
    the other jobs in the same queue, and the history of its priority with the basis of every change."""
    with ctx.gw.transaction() as session:
        job = records.get_job(ctx.gw, session, ctx.caller(session), job_id)
        row = session.get(SchedJob, job.id)
        others = [{"position": i + 1, "priority": round(s.priority, 3) if s else None,
                   "this_job": j.id == job.id} for i, (j, s) in enumerate(_queue_rows(session, job.queue))]
        return {
            "job_id": job.id, "queue": job.queue, "state": job.state,
            "position": row.position if row and job.state == "pending" else None,
            "queue_length": len(others),
            "priority": {"effective": row.priority if row else None, "parts": dict(row.parts) if row else {}},
            "blocking_reason": (row.blocked_reason if row and job.state == "pending" else "") or job.state_reason,
            "estimated_start": row.estimated_start.isoformat() if row and row.estimated_start else None,
            "estimated_at": row.estimated_at.isoformat() if row and row.estimated_at else None,
            "quota": ("borrowed" if row and row.borrowed else "owned") if job.state != "pending" else None,
            "preemptions": row.preemptions if row else 0,
            "wait_credit_s": row.wait_credit_s if row else 0.0,
            "renewal_due_at": row.renewal_due_at.isoformat() if row and row.renewal_due_at else None,
            "renewals": list(row.renewals) if row else [],
            "others_in_queue": others,
            "priority_history": priority_history.history(session, job.id),
            # On the Slurm backend, Slurm's own reason and estimate beside jobgate's (Q10); null elsewhere.
            "slurm": slurm_view(session, job.id),
        }


@router.get("/v1/queues", summary="Every queue: its waiting jobs' priorities, and cluster usage")
def queues(ctx: Ctx) -> dict[str, Any]:
    """Per queue: waiting jobs in order with their effective priority (ids only for projects you may see);
    cluster usage: GPUs of alive nodes, in use and free there, and per tenant owned and borrowed (GPUs
    withheld on lost nodes included, as quotas count them)."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        visible = pipeline.visible_projects(ctx.gw, session, caller, list(session.scalars(select(Project.id)).all()))
        out: dict[str, Any] = {}
        for q in QUEUES:
            rows = _queue_rows(session, q)
            out[q] = {"waiting": len(rows), "jobs": [
                {"position": i + 1, "priority": round(s.priority, 3) if s else None,
                 "id": j.id if j.project in visible else None,
                 "project": j.project if j.project in visible else None,
                 "gpus": j.gpus_per_node * j.nodes} for i, (j, s) in enumerate(rows)]}
        return {"queues": out, "cluster": {**alive_capacity(session), "by_tenant": usage_by_tenant(session)}}


@router.get("/v1/stats/preemptions", summary="Preemptions per tenant by month or quarter (Q9)")
def preemption_stats(
    ctx: Ctx,
    by: Annotated[Literal["tenant"], Query(description="Grouping; tenant = project")] = "tenant",
    period: Annotated[Literal["month", "quarter"], Query(description="Calendar period of each row (UTC)")] = "month",
) -> dict[str, Any]:
    """Count of preempted jobs and GPU-hours lost (GPUs × hours run before the preemption), for the tenants
    whose jobs you may see."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        if by != "tenant":  # pragma: no cover - Literal already refuses it
            raise Invalid("by must be tenant")
        visible = pipeline.visible_projects(ctx.gw, session, caller, list(session.scalars(select(Project.id)).all()))
        return {"by": by, "period": period, "rows": preemption.stats(session, visible, period)}
