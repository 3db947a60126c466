"""Business-DB tables of the scheduler: quotas, the mount/data-set registry, per-job scheduling state,
priority history (Q3 basis), preemptions (Q8/Q9 statistics), earlier runs of requeued jobs (Q11 statistics)
and decayed usage (Q3 fair share)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.store.models import Base

# The quota row of the cluster tier uses this project key; tenants use their project id.
CLUSTER = "*"


class QuotaRow(Base):
    """Q4 quota of one tenant (project), or of the cluster (project "*"); user limits in `users`."""

    __tablename__ = "quotas"
    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpus: Mapped[int] = mapped_column(Integer)
    borrow_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lend_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    users: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    effective_from: Mapped[datetime | None] = mapped_column(nullable=True)
    effective_until: Mapped[datetime | None] = mapped_column(nullable=True)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(64))


class QuotaChange(Base):
    """A7: every applied quota change with before/after and its effective period (also in the ledger)."""

    __tablename__ = "quota_changes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project: Mapped[str] = mapped_column(String(64), index=True)
    before: Mapped[dict[str, Any]] = mapped_column(JSON)
    after: Mapped[dict[str, Any]] = mapped_column(JSON)
    requested_by: Mapped[str] = mapped_column(String(64))
    approved_by: Mapped[list[Any]] = mapped_column(JSON, default=list)
    reason: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime]


class MountRow(Base):
    """Q1 registry of storage mounts and data sets a job may declare; `projects` may use it ("*": all)."""

    __tablename__ = "mounts"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # mount | dataset
    path: Mapped[str] = mapped_column(Text, default="")
    projects: Mapped[list[Any]] = mapped_column(JSON, default=lambda: ["*"])
    available: Mapped[bool] = mapped_column(default=True)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]


class SchedJob(Base):
    """Scheduling facts of one job beside its jobs row: priority parts, wait carried over, quota mode,
    the last explanation and estimate (refreshed each cycle), occupancy renewal."""

    __tablename__ = "sched_jobs"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    contribution: Mapped[float] = mapped_column(Float, default=0.0)
    manual: Mapped[float] = mapped_column(Float, default=0.0)
    compensation: Mapped[float] = mapped_column(Float, default=0.0)
    queued_at: Mapped[datetime]
    wait_credit_s: Mapped[float] = mapped_column(Float, default=0.0)
    mounts: Mapped[list[Any]] = mapped_column(JSON, default=list)
    datasets: Mapped[list[Any]] = mapped_column(JSON, default=list)
    borrowed: Mapped[bool] = mapped_column(default=False)
    priority: Mapped[float] = mapped_column(Float, default=0.0)  # effective priority at the last cycle
    parts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    recorded_priority: Mapped[float | None] = mapped_column(Float, nullable=True)  # at the last history entry
    position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    blocked_reason: Mapped[str] = mapped_column(Text, default="")
    estimated_start: Mapped[datetime | None] = mapped_column(nullable=True)
    estimated_at: Mapped[datetime | None] = mapped_column(nullable=True)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    # Q9: after a requeue, the owner is told the expected restart once the next cycle has estimated it.
    restart_notice_pending: Mapped[bool] = mapped_column(default=False)
    renewal_due_at: Mapped[datetime | None] = mapped_column(nullable=True)
    renewals: Mapped[list[Any]] = mapped_column(JSON, default=list)


class PriorityChange(Base):
    """Q3: one change of a job's priority and its basis (submit, aging, fairshare, manual, compensation, requeue)."""

    __tablename__ = "priority_history"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[datetime]
    basis: Mapped[str] = mapped_column(String(32))
    before: Mapped[float | None] = mapped_column(Float, nullable=True)
    after: Mapped[float] = mapped_column(Float)
    parts: Mapped[dict[str, Any]] = mapped_column(JSON)
    note: Mapped[str] = mapped_column(Text, default="")


class PreemptionRow(Base):
    """Q8/Q9: one victim of one preemption plan; closed when the victim is back in the queue."""

    __tablename__ = "preemptions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    victim: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    preemptor: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(16))  # reclaim | priority | occupancy
    project: Mapped[str] = mapped_column(String(64), index=True)
    owner: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    borrowed: Mapped[bool] = mapped_column(default=False)
    priority_before: Mapped[float] = mapped_column(Float)
    gpu_hours_lost: Mapped[float] = mapped_column(Float, default=0.0)
    # stopping | requeued | ended (ran out on its own first) | superseded (an emergency stop took over its stop)
    state: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(index=True)
    requeued_at: Mapped[datetime | None] = mapped_column(nullable=True)
    checkpoint: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    ledger_seq: Mapped[int] = mapped_column(Integer)


class PastRun(Base):
    """Q11: a run of a job that then went back to the queue (preempted, or paused and resumed). The jobs row
    knows only the current run (started_at, ended_at): without these rows the heat map lost the GPU-hours of
    the earlier runs, and the wait statistics counted them as waiting."""

    __tablename__ = "past_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    project: Mapped[str] = mapped_column(String(64))
    queue: Mapped[str] = mapped_column(String(16))
    gpus: Mapped[int] = mapped_column(Integer)
    waited_s: Mapped[float] = mapped_column(Float)  # this run's stint in the queue: from entering it to the start
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime] = mapped_column(index=True)


class TenantUsage(Base):
    """Q3 decayed GPU-hours of one tenant; decays by half every fairshare half-life."""

    __tablename__ = "tenant_usage"
    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime]


def quota_json(row: QuotaRow | None) -> dict[str, Any] | None:
    """A quota row as the API, the ledger (A7 before/after) and reconciliation show it; None for no row."""
    if row is None:
        return None
    return {"project": row.project, "gpus": row.gpus, "borrow_limit": row.borrow_limit,
            "lend_limit": row.lend_limit, "users": dict(row.users or {}),
            "effective_from": row.effective_from.isoformat() if row.effective_from else None,
            "effective_until": row.effective_until.isoformat() if row.effective_until else None,
            "updated_at": row.updated_at.isoformat(), "updated_by": row.updated_by}
