"""Tables of replicas sharing one PostgreSQL business database (issue 28).

Who leads, under which epoch, and which replicas were seen lately (gateway/leadership.py): written on each
replica's own lock connection, read by /readyz and /v1/status. And what every replica must see alike: the policy
set and role bindings they decide under, and the console's signed-in sessions; kept in one replica's memory, a
reload, a role revoked or a sign-in through one replica was unknown to the others."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String, Text
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


class PolicyState(Base):
    """One row (id 1): the hash of the policy set every replica decides under (the last one loaded by any of them)
    and a counter of role binding changes, which each replica compares with what its engine holds before it
    decides (gateway/decisions/policy_sync.py)."""

    __tablename__ = "policy_state"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    policy_hash: Mapped[str] = mapped_column(String(64))
    directory: Mapped[str] = mapped_column(Text, default="")
    loaded_by: Mapped[str] = mapped_column(String(64), default="")  # the replica that loaded it
    changed_at: Mapped[datetime]
    bindings_version: Mapped[int] = mapped_column(Integer, default=0)


class ConsoleSessionRow(Base):
    """A signed-in console session (gateway/console/sessions.py). The cookie's secret is stored as its SHA-256
    only, like a token: a copy of this table signs nobody in."""

    __tablename__ = "console_sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), index=True)
    principal: Mapped[str] = mapped_column(String(64))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    last_seen: Mapped[datetime] = mapped_column(index=True)
