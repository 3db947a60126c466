"""/v1/notifications: notices for the caller (approval requests, actions on their jobs, preemptions)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select

from gateway.api.deps import Ctx
from gateway.notifications import Notification
from gateway.obligations import acknowledge, note_json

router = APIRouter(prefix="/v1/notifications", tags=["notifications"])


@router.get("", summary="Your notices, newest first")
def my_notifications(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        now = ctx.gw.clock()
        rows = session.scalars(select(Notification).where(Notification.principal == caller.real_identity)
                               .order_by(Notification.created_at.desc()).limit(200)).all()
        return {"notifications": [note_json(n, now) for n in rows]}


@router.post("/{notification_id}/ack", summary="Acknowledge a notice (the receipt the ledger records)")
def ack(notification_id: str, ctx: Ctx) -> dict[str, Any]:
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        return note_json(acknowledge(ctx.gw, session, caller.real_identity, notification_id), ctx.gw.clock())
