"""/v1/emergency-stops: stop a job, a workload or a whole scope now, for a safety or security concern."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.deps import Ctx, path_id
from gateway.api.openapi_doc import AWAITS_APPROVAL
from gateway.decisions.verdict import decision_out
from gateway.jobs import emergency
from gateway.schemas import Entry, Name

router = APIRouter(prefix="/v1/emergency-stops", tags=["emergency stops"])


class Scope(BaseModel):
    """What to stop."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["job", "workload", "environment", "selector"] = Field(
        description="job (one id), workload (jobs of one goal), environment, or selector (label map)")
    value: Entry | dict[Name, Entry] = Field(
        description="Job id, workload name, environment name, or labels to match.")


class EmergencyCreate(BaseModel):
    """An emergency stop request: scope, concern, reason and grace window."""

    model_config = ConfigDict(extra="forbid")

    scope: Scope = Field(description="What to stop; resolved to job ids when the request is made.")
    trigger: Literal["safety", "security"] = Field(description="The concern behind the stop (C6).")
    reason: str = Field(min_length=3, max_length=2000, description="Written reason, kept in the ledger.")
    grace_seconds: float = Field(5.0, ge=0, le=300, description="Grace window for every target; may be 0.")
    ticket: str | None = Field(None, max_length=200, description="Linked ticket or incident id.")
    hold: bool = Field(True, description=(
        "A workload or scope stop keeps its scope closed to new jobs once carried out (rule C2.emergency_hold),"
        " until lifted at `POST /v1/emergency-stops/{id}/lift`; false stops the jobs and holds nothing."
        " A job stop never holds."))


class HoldLift(BaseModel):
    """Why the scope may take new jobs again."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=3, max_length=2000, description="Written reason, kept in the ledger.")


@router.post("", status_code=status.HTTP_201_CREATED, summary="Request an emergency stop",
             responses=AWAITS_APPROVAL)
def create(body: EmergencyCreate, ctx: Ctx, response: Response) -> dict[str, Any]:
    """The scope is resolved to job ids now and frozen. Policy decides how many people must agree by
    granularity: a job-level stop by on-call or a security reviewer runs at once; a workload or scope stop
    waits (HTTP 202 with `approval_id`) for a holder of the other role to approve at
    `POST /v1/approvals/{approval_id}/approve`. Then every target is stopped in parallel with
    `grace_seconds`, and a workload or scope stop holds its scope: new jobs there are refused until the hold
    is lifted. Follow progress at `GET /v1/emergency-stops/{id}`."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        row, rec = emergency.create(ctx.gw, session, caller, kind=body.scope.kind, value=body.scope.value,
                                    trigger=body.trigger, reason=body.reason, grace_seconds=body.grace_seconds,
                                    ticket=body.ticket, hold=body.hold)
        if row.state == "pending_approval":
            response.status_code = status.HTTP_202_ACCEPTED
        out = emergency.report(session, row, ctx.gw.clock())
        emergency.settle(session, [row], [out])  # (queued targets are cancelled at once: it may be done already)
        out["decision"] = decision_out(rec).model_dump()
        return out


@router.get("", summary="Emergency stops, newest first")
def list_stops(
    ctx: Ctx, limit: Annotated[int, Query(ge=1, le=500, description="At most this many")] = 50
) -> dict[str, list[dict[str, Any]]]:
    """Trigger, scope, who asked, state and summary counts of each (per-job detail: the single stop)."""
    with ctx.gw.transaction(immediate=False) as session:
        emergency.may_view(ctx.gw, ctx.caller(session), None)
        rows = emergency.list_stops(session, limit)
        shown = emergency.reports(session, rows, ctx.gw.clock())
    emergency.settle_after_read(ctx.gw, rows, shown)
    return {"emergency_stops": [{k: v for k, v in out.items() if k not in ("jobs", "blind_spots")} for out in shown]}


@router.get("/{emergency_id}", summary="Progress of one emergency stop: per-job state and a summary")
def show(
    emergency_id: Annotated[str, path_id("The emergency stop's id, from the answer that created it.")],
    ctx: Ctx,
) -> dict[str, Any]:
    """Summary counts: stopped_graceful, stopped_forced, cancelled (was queued), stop_failed, unreachable
    (its node is lost), in_progress; `accounted_for` reaches `targets` when every job has an outcome."""
    with ctx.gw.transaction(immediate=False) as session:
        row = emergency.load(ctx.gw, session, ctx.caller(session), emergency_id)
        out = emergency.report(session, row, ctx.gw.clock())
    emergency.settle_after_read(ctx.gw, [row], [out])
    return out



@router.post("/{emergency_id}/lift", summary="Lift the hold an emergency stop keeps on its scope")
def lift(
    emergency_id: Annotated[str, path_id("The emergency stop whose hold to lift.")],
    body: HoldLift,
    ctx: Ctx,
) -> dict[str, Any]:
    """New jobs may be submitted to the stop's workload or scope again. Whoever may make emergency stops may
    lift one, with a written reason; the decision and the lift are ledgered. 404 if the stop holds nothing,
    409 if its hold was already lifted."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        hold, rec = emergency.lift(ctx.gw, session, caller, emergency_id, body.reason)
        return {"emergency_id": emergency_id, "hold": emergency.hold_out(hold, asked=True),
                "decision": decision_out(rec).model_dump()}
