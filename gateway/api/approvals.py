"""/v1/approvals: the second person's inbox (M2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.deps import ApprovalId, Ctx
from gateway.decisions import approvals

router = APIRouter(prefix="/v1/approvals", tags=["approvals"])


class ApproveBody(BaseModel):
    """An optional comment from the approver."""

    model_config = ConfigDict(extra="forbid")
    comment: str | None = Field(None, max_length=2000, description="Kept with the approval in the ledger.")


class RejectBody(BaseModel):
    """Why the request is refused or withdrawn."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=3, max_length=2000, description="Why the request is refused; ledgered.")


@router.get("", summary="Approval requests you made or could approve")
def list_approvals(
    ctx: Ctx,
    state: Annotated[Literal["pending", "executed", "rejected", "expired"] | None,
                     Query(description="Only requests in this state")] = "pending",
) -> dict[str, list[dict[str, Any]]]:
    """Newest first: the requests you made, and those you are an eligible second person for (named, owner of
    a target, or holding an approving role in the affected projects). Auditors see all of them."""
    with ctx.gw.transaction(immediate=False) as session:
        caller = ctx.caller(session)
        found = approvals.visible_to(ctx.gw, session, caller, state)
        return {"approvals": approvals.with_summaries(ctx.gw, session, caller, found)}


@router.get("/{approval_id}", summary="One approval request: exact targets, blast radius, reason, expiry")
def show_approval(approval_id: ApprovalId, ctx: Ctx) -> dict[str, Any]:
    """What exactly would be done and why: action, sorted target ids, parameters, reason, the digest they are
    bound to, the approvals so far and those still required, and when the request expires. `summary` says it
    in words: the action, every parameter before → after (before: its value when the request was made, and
    what it is now where that differs), the targets you may see, blast radius, and who must still approve."""
    with ctx.gw.transaction(immediate=False) as session:
        caller = ctx.caller(session)
        found = approvals.visible_one(ctx.gw, session, caller, approval_id)
        return approvals.with_summaries(ctx.gw, session, caller, [found])[0]


@router.post("/{approval_id}/approve", summary="Approve as the second person; executes once enough approvals exist")
def approve(approval_id: ApprovalId, ctx: Ctx, body: ApproveBody | None = None) -> dict[str, Any]:
    """Checked in the transaction that executes: a person, not the requester (nor the person behind a service
    account), whose credential covers `approval.grant` in every affected project and whose role there makes
    them eligible; the requester and earlier approvers still enabled and eligible; not expired, digest
    unchanged. A refused attempt is ledgered. Targets that ended meanwhile are skipped and reported; the target
    set never widens."""
    with approvals.answering(ctx.gw, approval_id) as session:
        caller = ctx.caller(session)
        done = approvals.approve(ctx.gw, session, caller, approval_id, body.comment if body else None)
        return approvals.to_json(done)


@router.post("/{approval_id}/reject", summary="Reject (or, as the requester, withdraw) a pending request")
def reject(approval_id: ApprovalId, body: RejectBody, ctx: Ctx) -> dict[str, Any]:
    """An eligible approver refuses, or the requester withdraws. Nothing is executed; the reason is ledgered
    and the requester is notified."""
    with approvals.answering(ctx.gw, approval_id) as session:
        caller = ctx.caller(session)
        return approvals.to_json(approvals.reject(ctx.gw, session, caller, approval_id, body.reason))
