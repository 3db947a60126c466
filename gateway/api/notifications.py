"""/v1/notifications: notices for the caller (approval requests, actions on their jobs, preemptions)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from sqlalchemy import select

from gateway.api.deps import Ctx, path_id
from gateway.decisions.obligations import acknowledge, note_json
from gateway.store.service_tables import Notification

router = APIRouter(prefix="/v1/notifications", tags=["notifications"])


@router.get("", summary="Your notices, newest first")
def my_notifications(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    """The latest 200: approval requests, actions others took on your jobs, preemptions. `receipt` is
    not_required, pending (acknowledge it), acknowledged, or timed_out."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        now = ctx.gw.clock()
        rows = session.scalars(select(Notification).where(Notification.principal == caller.real_identity)
                               .order_by(Notification.created_at.desc()).limit(200)).all()
        return {"notifications": [note_json(n, now) for n in rows]}


@router.post("/{notification_id}/ack", summary="Acknowledge a notice (the receipt the ledger records)")
def ack(
    notification_id: Annotated[str, path_id("The notice's id, as listed.")], ctx: Ctx
) -> dict[str, Any]:
    """Yours only, once, and in person: a service account or break-glass credential sees your notices but
    cannot acknowledge them. The receipt is ledgered; an action waiting for your acknowledgement (A4) goes on."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        return note_json(acknowledge(ctx.gw, session, caller, notification_id), ctx.gw.clock())
