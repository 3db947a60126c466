"""Business-DB table of the Slurm backend (gateway/execution/slurm/execution.py): which Slurm job runs which
jobgate job.

jobgate's ids are global and never reused (R1); Slurm's wrap and start again after a reset of its state, so one
Slurm run is named by (cluster, Slurm job id, first submit time), never by the Slurm id alone. A jobgate job has
one row per Slurm job it became: a requeue keeps the Slurm job (and its row), a pause and resume submits a new
one. Rows are never deleted: they are how an auditor finds a jobgate job in Slurm's accounting.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gateway.store.models import Base


class SlurmRun(Base):
    """One Slurm job a jobgate job became, and what jobgate asked of it and last saw of it."""

    __tablename__ = "slurm_runs"
    __table_args__ = (UniqueConstraint("cluster", "slurm_job_id", "submitted_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40), index=True)  # jobgate's id
    cluster: Mapped[str] = mapped_column(String(64))
    slurm_job_id: Mapped[int] = mapped_column(Integer)
    submitted_at: Mapped[datetime]  # the first submit time (Slurm resets its own at every requeue)
    # Slurm's state as last seen (PENDING, RUNNING, COMPLETING, CANCELLED, COMPLETED, ...); "SUBMITTED" until
    # the first read after sbatch.
    state: Mapped[str] = mapped_column(String(24), default="SUBMITTED")
    reason: Mapped[str] = mapped_column(Text, default="")  # Slurm's reason for a pending job (Q10)
    estimated_start: Mapped[datetime | None] = mapped_column(nullable=True)  # `squeue --start` (Q10)
    node_list: Mapped[str] = mapped_column(Text, default="")
    restarts: Mapped[int] = mapped_column(Integer, default=0)  # Slurm's requeue count, as last seen
    slurm_priority: Mapped[int | None] = mapped_column(Integer, nullable=True)  # as last seen
    priority_set: Mapped[int | None] = mapped_column(Integer, nullable=True)  # what jobgate set (P2, A2)
    held: Mapped[bool] = mapped_column(Boolean, default=False)  # held by jobgate
    live: Mapped[bool] = mapped_column(Boolean, default=True, index=True)  # Slurm may still run it
    # The stop jobgate asked for (P4): its reference, the prepare signal's delivery, the window's end, and
    # whether jobgate had to cancel (forced) or requeue (a preemption) when the window ended.
    stop_reference: Mapped[str | None] = mapped_column(String(40), nullable=True)
    stop_requeue: Mapped[bool] = mapped_column(Boolean, default=False)
    # How many `scontrol requeue` of this Slurm job jobgate made (the watch counts the REQUEUED attempts beyond
    # them as someone else's). Nullable: added to an older table, its rows read as none.
    requeues_made: Mapped[int | None] = mapped_column(Integer, nullable=True, default=0)
    stop_asked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    stop_grace_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    signal_sent_at: Mapped[datetime | None] = mapped_column(nullable=True)
    forced_at: Mapped[datetime | None] = mapped_column(nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_signal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cancelled_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    updated_at: Mapped[datetime]


Index("ix_slurm_runs_slurm_id", SlurmRun.cluster, SlurmRun.slurm_job_id)
