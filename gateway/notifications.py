"""Notices to people (owners, requesters, on-call): an outbox table the console, CLI and webhooks read.

A notice may ask for a receipt (A4: the owner was notified before their job was stopped); the receipt is
the recipient's acknowledgement, or a timeout — the ledger says which.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, String
from sqlalchemy.orm import Mapped, Session, mapped_column

from gateway.models import Base


class Notification(Base):
    __tablename__ = "notifications"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    principal: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime]
    read_at: Mapped[datetime | None] = mapped_column(nullable=True)
    receipt_required: Mapped[bool] = mapped_column(default=False)
    acknowledged_at: Mapped[datetime | None] = mapped_column(nullable=True)


def notify(
    session: Session, principal: str, kind: str, body: dict[str, Any], now: datetime, *, receipt: bool = False
) -> Notification:
    """Queue a notice for one principal in the caller's transaction."""
    note = Notification(
        id="ntf-" + secrets.token_hex(8),
        principal=principal,
        kind=kind,
        body=body,
        created_at=now,
        receipt_required=receipt,
    )
    session.add(note)
    return note
