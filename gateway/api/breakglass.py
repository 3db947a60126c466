"""/v1/break-glass: temporary one-time grants for on-call troubleshooting (F2, F3)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, status
from pydantic import BaseModel, ConfigDict, Field

from gateway.access import breakglass
from gateway.api.deps import Ctx, path_id
from gateway.schemas import Name

router = APIRouter(prefix="/v1/break-glass", tags=["break-glass"])


class GrantRequest(BaseModel):
    """What an on-call engineer asks for, for how long, and why."""

    model_config = ConfigDict(extra="forbid")
    projects: list[Name] = Field(min_length=1, max_length=100, description="Projects the grant covers ('*' for all).")
    actions: list[Name] = Field(min_length=1, max_length=100, description="Actions it covers, e.g. job.stop.")
    duration_minutes: float = Field(gt=0, le=240, description="At most 4 hours.")
    max_uses: int = Field(1, ge=1, le=100, description="Calls it may make before it is spent.")
    reason: str = Field(min_length=10, max_length=2000, description="Why normal routes are not enough; ledgered.")
    ticket: str = Field(min_length=1, max_length=200, description="Incident ticket; required.")


@router.post("", status_code=status.HTTP_201_CREATED, summary="Request a break-glass grant (shown once)")
def request_grant(body: GrantRequest, ctx: Ctx) -> dict[str, Any]:
    """Policy decides whether a second on-call must approve (then `approval_id` is set and the credential
    works only after approval). The credential is returned once; every use is ledgered with
    `bypass: true` and raises an alert; expiry is ledgered as a revocation."""
    with ctx.gw.transaction() as session:
        grant, secret = breakglass.request_grant(
            ctx.gw, session, ctx.caller(session), projects=body.projects, actions=body.actions,
            duration=timedelta(minutes=body.duration_minutes), max_uses=body.max_uses, reason=body.reason,
            ticket=body.ticket)
        return {**breakglass.grant_json(grant), "credential": secret}


@router.get("", summary="Your grants (auditors and reviewers: all)")
def list_grants(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    """Newest first: scope, uses left, expiry and state of each grant (never its credential). Holders of
    `ledger.read` see everyone's."""
    with ctx.gw.transaction() as session:
        rows = breakglass.visible(ctx.gw, session, ctx.caller(session))
        return {"grants": [breakglass.grant_json(g) for g in rows]}


@router.post("/{grant_id}/revoke", summary="End a grant early")
def revoke(
    grant_id: Annotated[str, path_id("The grant's id, from the answer that created it.")], ctx: Ctx
) -> dict[str, Any]:
    """The holder or a security reviewer ends the grant now; its credential stops working at once and the
    revocation is ledgered."""
    with ctx.gw.transaction() as session:
        return breakglass.grant_json(breakglass.revoke(ctx.gw, session, ctx.caller(session), grant_id))
