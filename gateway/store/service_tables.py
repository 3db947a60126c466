"""Tables of the services above the store: approval requests (M2) and what their targets were when asked,
break-glass grants (F2), notices to people (A4 receipts) and the reconciliation watermark (DESIGN step 7). They
lived beside their services, which made the schema import the services; the services now import them from
here."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.store.models import Base


class Approval(Base):
    __tablename__ = "approvals"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    action: Mapped[str] = mapped_column(String(64))
    target_ids: Mapped[list[Any]] = mapped_column(JSON)
    project: Mapped[str | None] = mapped_column(String(64), nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    ticket: Mapped[str | None] = mapped_column(String(200), nullable=True)
    granularity: Mapped[str] = mapped_column(String(16), default="job")
    digest: Mapped[str] = mapped_column(String(64))
    requester: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    requester_real: Mapped[str] = mapped_column(String(64))
    requester_trigger: Mapped[str | None] = mapped_column(String(200), nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True)  # pending | executed | rejected | expired
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    decision_seq: Mapped[int]
    required: Mapped[dict[str, Any]] = mapped_column(JSON)
    blast_radius: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    approvals: Mapped[list[Any]] = mapped_column(JSON, default=list)
    resolved_at: Mapped[datetime | None] = mapped_column(nullable=True)
    resolved_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    resolution: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class BreakGlassGrant(Base):
    __tablename__ = "break_glass_grants"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    credential_hash: Mapped[str] = mapped_column(String(64), unique=True)
    projects: Mapped[list[Any]] = mapped_column(JSON)
    actions: Mapped[list[Any]] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(Text)
    ticket: Mapped[str] = mapped_column(String(200))
    duration_s: Mapped[float]
    max_uses: Mapped[int]
    uses: Mapped[int] = mapped_column(default=0)
    state: Mapped[str] = mapped_column(String(16), index=True)  # pending | active | revoked
    created_at: Mapped[datetime]
    activated_at: Mapped[datetime | None] = mapped_column(nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_because: Mapped[str | None] = mapped_column(String(32), nullable=True)
    approval_id: Mapped[str | None] = mapped_column(String(32), nullable=True)


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


class ReconcileMark(Base):
    """Where the next reconciliation pass starts reading the ledger (one row, id 1)."""

    __tablename__ = "ledger_reconcile_mark"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    next_seq: Mapped[int] = mapped_column(Integer, default=0)


class ApprovalSnapshot(Base):
    """What an approval request's targets and settings were when it was made (its summary's "before")."""

    __tablename__ = "approval_snapshots"
    approval_id: Mapped[str] = mapped_column(String(32), ForeignKey("approvals.id"), primary_key=True)
    taken_at: Mapped[datetime]
    facts: Mapped[dict[str, Any]] = mapped_column(JSON)
