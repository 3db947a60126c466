"""Tables of the stop area: command acknowledgements, agent sessions, emergency stops, deletions, retention.

Rows here are never deleted either: they are part of what a forensics export reads back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.store.models import Base


class CommandAck(Base):
    """A node command counts as delivered only once a report carrying its nonce came back (or a replay refusal)."""

    __tablename__ = "command_acks"
    nonce: Mapped[str] = mapped_column(String(32), primary_key=True)
    node: Mapped[str] = mapped_column(String(64), index=True)
    acked_at: Mapped[datetime]
    event: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="")


class AgentSession(Base):
    """Which agent process (instance id from its heartbeat) speaks for a node; a new one means a restart."""

    __tablename__ = "agent_sessions"
    node: Mapped[str] = mapped_column(String(64), primary_key=True)
    instance: Mapped[str] = mapped_column(String(64), default="")
    since: Mapped[datetime]
    last_reconcile_nonce: Mapped[str | None] = mapped_column(String(32), nullable=True)


class EmergencyStop(Base):
    """One emergency stop (C2, C6): scope, trigger, who decided, and the jobs it froze as targets."""

    __tablename__ = "emergency_stops"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    scope_kind: Mapped[str] = mapped_column(String(16))  # job | workload | environment | selector
    scope_value: Mapped[dict[str, Any]] = mapped_column(default=dict)
    granularity: Mapped[str] = mapped_column(String(16))  # job | workload | scope
    trigger: Mapped[str] = mapped_column(String(16))  # safety | security
    reason: Mapped[str] = mapped_column(Text)
    requested_by: Mapped[str] = mapped_column(String(64))
    deciders: Mapped[list[Any]] = mapped_column(default=list)
    grace_seconds: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(24))  # pending_approval | executing | done | rejected | expired
    approval_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    request_id: Mapped[str] = mapped_column(String(32))
    decision_seq: Mapped[int] = mapped_column(Integer)
    target_ids: Mapped[list[Any]] = mapped_column(default=list)
    skipped: Mapped[list[Any]] = mapped_column(default=list)  # [{job_id, reason}] tracked but not stoppable
    created_at: Mapped[datetime]
    approved_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)


class EmergencyHold(Base):
    """An executed workload or scope emergency stop keeps its scope closed to new jobs until on-call lifts it:
    otherwise whatever was stopped (a runaway pipeline, a compromised account) could submit it straight back."""

    __tablename__ = "emergency_holds"
    emergency_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    scope_kind: Mapped[str] = mapped_column(String(16))  # workload | environment | selector
    scope_value: Mapped[dict[str, Any]] = mapped_column(default=dict)  # {"value": ...}, as on the stop
    trigger: Mapped[str] = mapped_column(String(16))
    since: Mapped[datetime]
    # Set once, when lifted (the hold row is kept: forensics reads it back).
    lifted_at: Mapped[datetime | None] = mapped_column(nullable=True, index=True)
    lifted_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lift_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    lift_decision_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)


class JobDeletion(Base):
    """A deleted job (A6): artifacts are purged through the agent only after the recovery window."""

    __tablename__ = "job_deletions"
    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # pending | purging | purged | restored
    state_before: Mapped[str] = mapped_column(String(16))
    requested_by: Mapped[str] = mapped_column(String(64))
    approvers: Mapped[list[Any]] = mapped_column(default=list)
    reason: Mapped[str] = mapped_column(Text)
    requested_at: Mapped[datetime]
    purge_after: Mapped[datetime]
    objects: Mapped[list[Any]] = mapped_column(default=list)
    purged_at: Mapped[datetime | None] = mapped_column(nullable=True)


class CheckpointRetention(Base):
    """How long a stopped or paused job's checkpoints are kept (P1), and when cleanup removed them."""

    __tablename__ = "checkpoint_retention"
    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tier: Mapped[str] = mapped_column(String(16))  # normal | important | external
    quota: Mapped[str] = mapped_column(String(64))
    kept_since: Mapped[datetime]
    keep_until: Mapped[datetime | None] = mapped_column(nullable=True)  # None: until the next job on the quota
    state: Mapped[str] = mapped_column(String(16), default="kept")  # kept | cleaning | cleaned
    cleaned_at: Mapped[datetime | None] = mapped_column(nullable=True)


class RetentionCleanupNode(Base):
    """One node's part of a checkpoint cleanup (P1). A job run on several nodes keeps checkpoints on each, so its
    retention is cleaned only once every node the cleanup went to has removed all of them, as a purge waits for
    every node (JobDeletion.objects). A later cleanup of the same job sends again and starts the row over."""

    __tablename__ = "retention_cleanup_nodes"
    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    node: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # sent | removed | incomplete (files left: a person must look)
    sent_at: Mapped[datetime]
    reported_at: Mapped[datetime | None] = mapped_column(nullable=True)
