"""POST /v1/jobs/{id}/priority: change a job's priority (A2 own job; A3 another's, with a second person).

Audit fields (REQUIREMENTS A2, A3): the value before and after, the queue snapshot at that moment (a
blob of the decision and of the outcome entry), the operator, the affected owner and the written reason.
The new value becomes the job's effective priority now (its `manual` part absorbs the difference, so
aging goes on from there); every change is kept in the job's priority history with basis `manual`.
"""

from __future__ import annotations

from typing import Any

import rfc8785
from fastapi import APIRouter, Response, status
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from gateway import priority_history
from gateway.api.deps import Ctx
from gateway.approvals import Approval, executor, open_request
from gateway.auth import Caller
from gateway.context import Gateway
from gateway.errors import Conflict
from gateway.jobs import decision_out, load_job, refuse_unless_allowed
from gateway.models import Job
from gateway.pipeline import decide, queue_snapshot, record_outcome
from gateway.schemas import DecisionOut
from gateway.states import ENDED_STATES

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


class PriorityRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: float = Field(ge=-1_000_000, le=1_000_000, allow_inf_nan=False,
                            description="The job's new effective priority (higher runs first).")
    reason: str | None = Field(None, max_length=1000, description="Written reason; required for others' jobs (A3).")
    ticket: str | None = Field(None, max_length=200)


class PriorityResponse(BaseModel):
    job_id: str
    decision: DecisionOut
    approval_id: str | None = Field(None, description="Set when a second person must approve (A3, M2).")
    priority_before: float | None = None
    priority_after: float | None = None
    outcome_seq: int | None = None


def apply_priority(gw: Gateway, session: Session, job: Job, value: float, *, by: str, request_id: str,
                   decision_seq: int, reason: str | None, approved_by: list[str]) -> dict[str, Any]:
    """Set the job's effective priority; record before/after, basis and a queue snapshot. Raises Conflict."""
    if job.state in ENDED_STATES:
        raise Conflict(f"job {job.id} already ended ({job.state})", state=job.state)
    now = gw.clock()
    row = priority_history.ensure(session, job)
    parts = dict(row.parts or {})
    before = float(parts.get("total", row.priority or 0.0))
    row.manual = float(row.manual or 0.0) + (value - before)
    parts.update({"manual": row.manual, "total": value})
    row.parts = parts
    row.priority = value
    row.recorded_priority = value
    priority_history.record(session, job.id, now, "manual", before, parts,
                            note=f"set to {value:g} by {by}" + (f": {reason}" if reason else ""))
    session.flush()
    snapshot = rfc8785.dumps(queue_snapshot(session))
    seq = record_outcome(gw, "outcome", {
        "request_id": request_id, "decision_seq": decision_seq, "action": "job.priority", "job_id": job.id,
        "result": "changed", "priority_before": before, "priority_after": value, "operator": by,
        "affected_owner": job.owner, "approved_by": approved_by, "reason": reason,
    }, blobs={"queue_snapshot": snapshot})
    gw.scheduler_kick.set()
    return {"job_id": job.id, "priority_before": before, "priority_after": value, "outcome_seq": seq}


def change_priority(gw: Gateway, session: Session, caller: Caller, job_id: str,
                    body: PriorityRequest) -> tuple[PriorityResponse, bool]:
    """Decide, then apply or open an approval. Returns (response, waiting). Raises NotFound, PolicyDenied,
    Conflict, LedgerUnavailable."""
    job = load_job(session, job_id, for_update=True)
    if job.state in ENDED_STATES:
        raise Conflict(f"job {job.id} already ended ({job.state})", state=job.state)
    params = {"priority": body.priority}
    rec = decide(gw, session, caller, "job.priority", targets=[job], project=job.project, params=params,
                 reason=body.reason, ticket=body.ticket)
    refuse_unless_allowed(rec)
    if rec.decision.effect == "needs_approval":
        approval = open_request(gw, session, caller, rec, action="job.priority", target_ids=[job.id],
                                project=job.project, params=params, reason=body.reason, ticket=body.ticket)
        return PriorityResponse(job_id=job.id, decision=decision_out(rec), approval_id=approval.id), True
    done = apply_priority(gw, session, job, body.priority, by=caller.id, request_id=rec.request_id,
                          decision_seq=rec.seq, reason=body.reason, approved_by=[])
    return PriorityResponse(decision=decision_out(rec), **done), False


@executor("job.priority")
def _priority_after_approval(gw: Gateway, session: Session, approval: Approval, targets: list[Job],
                             approver: Caller) -> dict[str, Any]:
    value = float(approval.params["priority"])
    return {"changed": [apply_priority(gw, session, job, value, by=approval.requester, request_id=approval.id,
                                       decision_seq=approval.decision_seq, reason=approval.reason,
                                       approved_by=[a["by"] for a in approval.approvals]) for job in targets]}


@router.post(
    "/{job_id}/priority",
    response_model=PriorityResponse,
    summary="Change a job's priority (own job; others' with a second person)",
    responses={202: {"description": "A second person must approve; `approval_id` is set"}},
)
def set_priority(job_id: str, body: PriorityRequest, ctx: Ctx, response: Response) -> PriorityResponse:
    """Your own job (creator or owner): applied at once (A2). Another's job: queue admin of its project
    or on-call, with a written reason and a second person (A3) — the answer is 202 with `approval_id`
    and nothing changes until it is approved. Value before/after and a queue snapshot are recorded."""
    with ctx.gw.transaction() as session:
        out, waiting = change_priority(ctx.gw, session, ctx.caller(session), job_id, body)
    if waiting:
        response.status_code = status.HTTP_202_ACCEPTED
    return out
