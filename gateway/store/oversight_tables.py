"""Business-DB tables of the watch over a Slurm cluster (gateway/execution/slurm/oversight.py): what it found
done behind jobgate's back, the jobs submitted straight to Slurm, and the association limits jobgate set.

A finding is ledgered once: its key (watch.Finding.key) is the primary key here, written in the same
transaction as its ledger entry, so the next look that reads the same act finds it already told.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.store.models import Base


class SlurmFindingRow(Base):
    """An act on a governed Slurm job, or on an association, that jobgate did not do (F3), once ledgered."""

    __tablename__ = "slurm_findings"
    key: Mapped[str] = mapped_column(String(160), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    act: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    slurm_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime]
    ledger_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)


class SlurmForeignJob(Base):
    """A job submitted straight to Slurm (not by jobgate): tracked, not governed (R5). `live` until Slurm no
    longer holds it; kept after, so the inventory's history and the ledger's first sighting agree."""

    __tablename__ = "slurm_foreign_jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(64))
    slurm_job_id: Mapped[int] = mapped_column(Integer)
    user: Mapped[str] = mapped_column(String(64))
    account: Mapped[str] = mapped_column(String(64), index=True)
    partition: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(24))
    name: Mapped[str] = mapped_column(Text, default="")
    nodes: Mapped[int] = mapped_column(Integer, default=1)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    claims: Mapped[str | None] = mapped_column(String(64), nullable=True)  # a jobgate id its comment claims
    submitted_at: Mapped[datetime | None] = mapped_column(nullable=True)
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]
    live: Mapped[bool] = mapped_column(Boolean, default=True, index=True)
    ledger_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)


Index("ix_slurm_foreign_jobs_id", SlurmForeignJob.cluster, SlurmForeignJob.slurm_job_id, SlurmForeignJob.live)


class SlurmAssocLimit(Base):
    """The GPU limit (GrpTRES gres/gpu) jobgate last set on one association; None: it cleared it."""

    __tablename__ = "slurm_assoc_limits"
    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)
    account: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(64), primary_key=True)  # "" for the account's own
    gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    applied_at: Mapped[datetime]
