"""Tables of replicas sharing one PostgreSQL business database (gateway/leadership.py): who leads, under which
epoch, and which replicas were seen lately. Written on each replica's own lock connection, read by /readyz and
/v1/status."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gateway.store.models import Base


class LeaderState(Base):
    """One row (id 1): the leader's epoch, bumped by every takeover, and who holds it. Leader-only writes check
    the epoch in their own transaction (gateway/leadership.py Leadership.fence), so a replica that lost its lock
    cannot act on a stale belief that it leads."""

    __tablename__ = "leader_state"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    holder: Mapped[str] = mapped_column(String(128))
    address: Mapped[str | None] = mapped_column(String(256), nullable=True)
    elected_at: Mapped[datetime]


class ReplicaRow(Base):
    """A replica that announced itself; seen_at moves every second while it runs (a row not seen for a few seconds
    is a replica that stopped or died; it is kept so an operator sees which)."""

    __tablename__ = "replicas"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    address: Mapped[str | None] = mapped_column(String(256), nullable=True)
    started_at: Mapped[datetime]
    seen_at: Mapped[datetime]
