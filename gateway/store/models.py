"""Business DB tables (SQLAlchemy 2). Rows of jobs are never deleted, so job ids are never reused (R1)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Stores aware UTC datetimes; SQLite drops the zone, so it is put back on the way out."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


class Meta(Base):
    """Small key/value facts about this database (schema version, demo seeded)."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    organisation: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")


class Principal(Base):
    """A person, a service account (with a responsible person) or a node agent."""

    __tablename__ = "principals"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # person | service | node
    display_name: Mapped[str] = mapped_column(String(128), default="")
    responsible: Mapped[str | None] = mapped_column(ForeignKey("principals.id"), nullable=True)
    created_at: Mapped[datetime]
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)


class Token(Base):
    """A bearer token: stored as its SHA-256 only, scoped to projects, actions and a purpose."""

    __tablename__ = "tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    principal_id: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    projects: Mapped[list[Any]] = mapped_column(default=lambda: ["*"])
    actions: Mapped[list[Any]] = mapped_column(default=lambda: ["*"])
    purpose: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class RoleBinding(Base):
    """Principal P holds role R in project X ("*" = every project). Capability bundles, never departments."""

    __tablename__ = "role_bindings"
    __table_args__ = (UniqueConstraint("principal_id", "role", "project"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    principal_id: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    role: Mapped[str] = mapped_column(String(32))
    project: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="registered")  # registered | alive | lost
    last_heartbeat: Mapped[datetime | None] = mapped_column(nullable=True)
    running: Mapped[list[Any]] = mapped_column(default=list)
    # What its agent says of how jobs are kept apart there (H1): uid+cgroup | uid | none; None until it said.
    isolation: Mapped[str | None] = mapped_column(String(16), nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    project: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    queue: Mapped[str] = mapped_column(String(16))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[int] = mapped_column(Integer)
    command: Mapped[list[Any]]
    env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    grace_seconds: Mapped[float] = mapped_column(Float)
    stop_signal: Mapped[str] = mapped_column(String(16))
    runtime_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The four ownerships (R2) and the facts that go with them.
    creator: Mapped[str] = mapped_column(ForeignKey("principals.id"))
    creator_kind: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str] = mapped_column(ForeignKey("principals.id"))
    beneficiary_project: Mapped[str] = mapped_column(String(64))
    rights_holder: Mapped[str] = mapped_column(String(64))
    external_rights: Mapped[bool] = mapped_column(Boolean, default=False)
    valid_until: Mapped[datetime | None] = mapped_column(nullable=True)
    auto_offline: Mapped[bool] = mapped_column(Boolean, default=False)
    contact: Mapped[str] = mapped_column(String(128))
    environment: Mapped[str] = mapped_column(String(16))
    dependencies: Mapped[list[Any]] = mapped_column(default=list)
    downstream: Mapped[list[Any]] = mapped_column(default=list)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    workload: Mapped[str | None] = mapped_column(String(64), nullable=True)
    trackable: Mapped[bool] = mapped_column(Boolean, default=True)
    stoppable: Mapped[bool] = mapped_column(Boolean, default=True)
    submitted_via: Mapped[dict[str, Any]] = mapped_column(default=dict)  # service account trigger (F1)
    # Scheduling and life cycle.
    base_priority: Mapped[float] = mapped_column(Float, default=0.0)
    state: Mapped[str] = mapped_column(String(16), index=True)
    state_reason: Mapped[str] = mapped_column(Text, default="")
    placement: Mapped[list[Any]] = mapped_column(default=list)
    submitted_at: Mapped[datetime]
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)
    stop_request: Mapped[dict[str, Any]] = mapped_column(default=dict)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)  # graceful | forced | ...
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)
    history: Mapped[list[Any]] = mapped_column(default=list)  # [{state, at, by}] every transition


# Every decision on existing jobs records the queue (H3): this index holds the queue snapshot's columns in
# its order, so reading a queue of thousands is one index scan, without a sort or a visit to each row.
Index("ix_jobs_queue_snapshot", Job.state, Job.queue, Job.base_priority.desc(), Job.submitted_at, Job.id,
      Job.project, Job.gpus_per_node, Job.nodes)


class Allocation(Base):
    """One node's share of a job's gang: the GPUs it holds there and that part's process state."""

    __tablename__ = "allocations"
    __table_args__ = (UniqueConstraint("job_id", "node"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    node: Mapped[str] = mapped_column(ForeignKey("nodes.id"), index=True)
    gpus: Mapped[list[Any]]
    state: Mapped[str] = mapped_column(String(16))  # starting | running | stopping | stopped | exited | failed
    released: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)


class NodeCommand(Base):
    """A signed command waiting for (or delivered to) a node agent."""

    __tablename__ = "node_commands"
    nonce: Mapped[str] = mapped_column(String(32), primary_key=True)
    node: Mapped[str] = mapped_column(ForeignKey("nodes.id"), index=True)
    job_id: Mapped[str] = mapped_column(String(40), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    envelope: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None] = mapped_column(nullable=True, index=True)

    def envelope_params(self) -> dict[str, Any]:
        """The parameters the gateway signed into this command (its own record of what it asked)."""
        params = json.loads(str(self.envelope["payload"])).get("params")
        return params if isinstance(params, dict) else {}
