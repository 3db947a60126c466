"""POST /v1/jobs/{id}/priority: change a job's priority (A2 own job; A3 another's, with a second person).

A2 is for ordering one's own work, not for jumping the queue: alone, an owner sets her job at most to the higher
of its priority now and its unadjusted priority (now minus the `manual` part: what the scheduler alone gives it),
so she may lower it and take the lowering back. Above that the policy (policies/jobs.rego, priority_finding)
treats it as A3: a queue admin or on-call gives a written reason and a second person confirms; another owner
is refused (A2.raise_needs_admin) and told the highest value she may set herself.

Audit fields (REQUIREMENTS A2, A3): the value before and after, the queue snapshot at that moment (a
blob of the decision and of the outcome entry), the operator, the affected owner and the written reason.
The new value becomes the job's effective priority now (its `manual` part absorbs the difference, so
aging goes on from there); every change is kept in the job's priority history with basis `manual`.
"""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from gateway.api.deps import Ctx, JobId
from gateway.context import Gateway
from gateway.decisions.approvals import open_request
from gateway.decisions.pipeline import decide
from gateway.decisions.verdict import decision_out, refuse_if_denied
from gateway.identity.auth import Caller
from gateway.jobs.priority import apply_priority
from gateway.jobs.records import load_job, refuse_in_state
from gateway.schemas import DecisionOut
from gateway.store.states import PAST_STATES

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


class PriorityRequest(BaseModel):
    """The new priority and why."""

    model_config = ConfigDict(extra="forbid")
    priority: float = Field(ge=-1_000_000, le=1_000_000, allow_inf_nan=False,
                            description="The job's new effective priority (higher runs first). For your own job "
                                        "alone, at most the higher of its priority now and its unadjusted "
                                        "priority (A2); more needs a queue admin or on-call and a second person.")
    reason: str | None = Field(None, max_length=1000, description="Written reason; required for others' jobs (A3).")
    ticket: str | None = Field(None, max_length=200, description="Linked ticket or incident id.")


class PriorityResponse(BaseModel):
    """The decision and, once applied, the value before and after."""

    job_id: str = Field(description="The job.")
    decision: DecisionOut = Field(description="The policy's decision, recorded in the ledger.")
    approval_id: str | None = Field(None, description="Set when a second person must approve (A3, M2).")
    priority_before: float | None = Field(None, description="Effective priority before the change; null until applied.")
    priority_after: float | None = Field(None, description="Effective priority after the change; null until applied.")
    outcome_seq: int | None = Field(None, description="Seq of the ledger entry recording the change, once applied.")


def change_priority(gw: Gateway, session: Session, caller: Caller, job_id: str,
                    body: PriorityRequest) -> tuple[PriorityResponse, bool]:
    """Decide, then apply or open an approval. Returns (response, waiting). Raises NotFound, PolicyDenied,
    Conflict, LedgerUnavailable."""
    job = load_job(session, job_id, for_update=True)
    if job.state in PAST_STATES:
        refuse_in_state(gw, session, caller, job, f"job {job.id} already ended ({job.state})")
    params = {"priority": body.priority}
    rec = decide(gw, session, caller, "job.priority", targets=[job], project=job.project, params=params,
                 reason=body.reason, ticket=body.ticket)
    refuse_if_denied(rec)
    if rec.decision.effect == "needs_approval":
        approval = open_request(gw, session, caller, rec, action="job.priority", target_ids=[job.id],
                                project=job.project, params=params, reason=body.reason, ticket=body.ticket)
        return PriorityResponse(job_id=job.id, decision=decision_out(rec), approval_id=approval.id), True
    done = apply_priority(gw, session, job, body.priority, by=caller.id, request_id=rec.request_id,
                          decision_seq=rec.seq, reason=body.reason, approved_by=[],
                          obligations=rec.decision.obligations)
    return PriorityResponse(decision=decision_out(rec), **done), False


@router.post(
    "/{job_id}/priority",
    response_model=PriorityResponse,
    summary="Change a job's priority (own job; others' with a second person)",
    responses={202: {"description": "A second person must approve; `approval_id` is set"}},
)
def set_priority(job_id: JobId, body: PriorityRequest, ctx: Ctx, response: Response) -> PriorityResponse:
    """Your own job (creator or owner): applied at once (A2) when the new value is at most the higher of the
    job's effective priority now and its unadjusted priority (now minus its manual part, i.e. what the
    scheduler alone gives it): you may lower your job to give way, and take that lowering back, but not push
    it above what the scheduler computes. A higher value for your own job is refused (403,
    `A2.raise_needs_admin`, naming the highest value you may set) unless you are a queue admin of its project
    or on-call, when it goes the A3 way. Another's job: queue admin of its project or on-call, with a written
    reason and a second person (A3) — the answer is 202 with `approval_id` and nothing changes until it is
    approved. Value before/after and a queue snapshot are recorded."""
    with ctx.gw.transaction() as session:
        out, waiting = change_priority(ctx.gw, session, ctx.caller(session), job_id, body)
    if waiting:
        response.status_code = status.HTTP_202_ACCEPTED
    return out
