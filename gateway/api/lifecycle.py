"""/v1/jobs/{id}: pause, resume, delete, undelete (A5, A6) and on-call's confirm-stopped (C3)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.deps import Ctx, JobId
from gateway.api.openapi_doc import AWAITS_APPROVAL
from gateway.decisions import verdict
from gateway.jobs import lifecycle, records
from gateway.store.stop_tables import JobDeletion

router = APIRouter(prefix="/v1/jobs", tags=["job life cycle"])


class Reasoned(BaseModel):
    """Why, in writing; both go to the ledger with the decision."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=3, max_length=2000, description="Written reason, kept in the ledger.")
    ticket: str | None = Field(None, max_length=200, description="Linked ticket or incident id.")


class ResumeBody(BaseModel):
    """Optional words for the resume."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, max_length=2000, description="Why; kept in the ledger.")


def _out(job: Any, rec: Any, response: Response | None = None, approval: Any = None, **extra: Any) -> dict[str, Any]:
    """The job and the decision; with an approval to wait for, HTTP 202 and its `approval_id`."""
    if approval is not None and response is not None:
        response.status_code = status.HTTP_202_ACCEPTED
        extra["approval_id"] = approval.id
    return {"job": records.job_out(job).model_dump(mode="json"), "decision": verdict.decision_out(rec).model_dump(),
            **extra}


@router.post("/{job_id}/confirm-stopped", summary="On-call confirms a stop_failed or lost job no longer runs",
             responses=AWAITS_APPROVAL)
def confirm_stopped(job_id: JobId, body: Reasoned, ctx: Ctx, response: Response) -> dict[str, Any]:
    """For a job whose stop could not be confirmed by its node (stop_failed) or whose node is lost. The job
    becomes `stopped` with outcome `confirmed`, its withheld GPUs are released, and the person and reason
    are ledgered. If the node comes back, its agent is told to stop the job in the reconcile. Where the policy
    asks for a second person (an external-rights job, R3): HTTP 202 with `approval_id`, and the job stays
    withheld until it is approved."""
    with ctx.gw.transaction() as session:
        job, rec, approval = lifecycle.confirm_stopped(ctx.gw, session, ctx.caller(session), job_id, body.reason,
                                                       body.ticket)
        return _out(job, rec, response, approval)


@router.post("/{job_id}/pause", status_code=status.HTTP_202_ACCEPTED,
             summary="Pause: graceful stop keeping the checkpoint (A5)")
def pause(job_id: JobId, body: Reasoned, ctx: Ctx) -> dict[str, Any]:
    """Prepare signal, grace window, then SIGKILL, as for a stop; the job ends `paused` and its checkpoint is
    kept under its retention tier. Pausing someone else's job (on-call) notifies the owner."""
    with ctx.gw.transaction() as session:
        job, rec = lifecycle.pause(ctx.gw, session, ctx.caller(session), job_id, body.reason, body.ticket)
        return _out(job, rec)


@router.post("/{job_id}/resume", summary="Resume a paused job: back in its queue by the resume-priority rule",
             responses=AWAITS_APPROVAL)
def resume(job_id: JobId, ctx: Ctx, response: Response, body: ResumeBody | None = None) -> dict[str, Any]:
    """The job keeps its priority and the wait it accumulated (P2); the ledger records the rule version. Where
    the policy asks for a second person (an external-rights job, R3): HTTP 202 with `approval_id`."""
    with ctx.gw.transaction() as session:
        job, rec, approval = lifecycle.resume(ctx.gw, session, ctx.caller(session), job_id,
                                              body.reason if body else None)
        return _out(job, rec, response, approval, resume_priority_rule=lifecycle.RESUME_PRIORITY_RULE)


@router.delete("/{job_id}", summary="Delete a job and, after the recovery window, its artifacts (A6)",
               responses=AWAITS_APPROVAL)
def delete_job(job_id: JobId, body: Reasoned, ctx: Ctx, response: Response) -> dict[str, Any]:
    """Only the owner, with the rights holder's consent (HTTP 202 with `approval_id` until a queue admin of
    the rights-holder project approves). The job becomes `deleted` at once; its files are removed by its
    nodes only after the recovery window, each removed file ledgered. The id is never reused (R1)."""
    with ctx.gw.transaction() as session:
        job, rec, approval = lifecycle.delete_job(ctx.gw, session, ctx.caller(session), job_id, body.reason,
                                                  body.ticket)
        if approval is not None:
            response.status_code = status.HTTP_202_ACCEPTED
        row = session.get(JobDeletion, job.id)
        return _out(job, rec, approval_id=approval.id if approval else None,
                    recovery_window_s=lifecycle.recovery_window(ctx.gw).total_seconds(),
                    purge_after=row.purge_after.isoformat() if row else None)


@router.post("/{job_id}/undelete", summary="Restore a deleted job within its recovery window",
             responses=AWAITS_APPROVAL)
def undelete(job_id: JobId, body: Reasoned, ctx: Ctx, response: Response) -> dict[str, Any]:
    """Decided like the delete (the owner, with the rights holder's consent where the policy asks for it).
    The job returns to the state it was deleted from; nothing was purged yet, so its files are intact. Where a
    second person must consent: HTTP 202 with `approval_id`, and the job stays deleted until it is approved."""
    with ctx.gw.transaction() as session:
        job, rec, approval = lifecycle.undelete(ctx.gw, session, ctx.caller(session), job_id, body.reason)
        return _out(job, rec, response, approval)
