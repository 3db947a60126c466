"""What every replica of one business database must see alike (issue 28): the policy set and role bindings the
replicas decide under, and the console's signed-in sessions. Kept in one replica's memory, a reload, a role
revoked or a sign-in through one replica was unknown to the others."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.store.models import Base


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
