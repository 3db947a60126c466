"""Request and response bodies of the HTTP API (pydantic lives only at the edges)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Queue = Literal["urgent", "normal", "batch"]
Environment = Literal["research", "staging", "production"]
StopSignal = Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class JobSubmit(BaseModel):
    """A job to run: what, where, how big, and who answers for it (R2)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Human name; not unique. The id is assigned.")
    project: str = Field(pattern=NAME_PATTERN, description="Project the job runs in (and is charged to).")
    queue: Queue = "normal"
    gpus_per_node: int = Field(ge=1, le=64, description="GPUs on each node of the gang.")
    nodes: int = Field(1, ge=1, le=1024, description="Nodes of the gang; all start at once or none do.")
    command: list[str] = Field(min_length=1, description="argv, run as its own process group.")
    env: dict[str, str] = Field(default_factory=dict)
    grace_seconds: float = Field(30.0, ge=0, le=3600, description="Window between prepare signal and SIGKILL.")
    stop_signal: StopSignal = Field("SIGTERM", description="Prepare signal delivered before a stop.")
    runtime_limit_seconds: float | None = Field(None, gt=0, description="Declared limit; used for backfill.")
    owner: str | None = Field(None, description="Responsible owner; defaults to the caller (or its person).")
    beneficiary_project: str | None = Field(None, description="Project that uses the result; default: project.")
    rights_holder: str | None = Field(
        None, description="Project holding the rights to the data and artifacts (default: the job's project); "
        "one from another organisation makes the job external-rights (R3).",
    )
    valid_until: datetime | None = Field(None, description="End of the job's validity period (R4).")
    auto_offline: bool = Field(False, description="Reclaim the job automatically at valid_until (R4).")
    contact: str | None = Field(None, description="First contact for incidents; default: the owner.")
    environment: Environment = "research"
    dependencies: list[str] = Field(default_factory=list)
    downstream: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    workload: str | None = Field(None, pattern=NAME_PATTERN, description="Group of jobs from one goal.")
    trackable: bool = True
    stoppable: bool = True
    mounts: list[str] = Field(default_factory=list, description="Storage mounts the job needs (Q1 registry).")
    datasets: list[str] = Field(default_factory=list, description="Data sets the job reads (Q1 registry).")


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=3, max_length=2000, description="Written reason, kept in the ledger.")
    ticket: str | None = Field(None, max_length=200, description="Linked ticket or incident id.")


class Selector(BaseModel):
    """Which jobs a batch means. Every field narrows; labels must all match."""

    model_config = ConfigDict(extra="forbid")

    project: str | None = None
    queue: Queue | None = None
    environment: Environment | None = None
    workload: str | None = None
    owner: str | None = None
    state: str | None = Field(None, description="Default: every job that can still be stopped.")
    labels: dict[str, str] = Field(default_factory=dict)


class BatchRequest(BaseModel):
    """Act on several jobs as one decision: by explicit ids or by a selector, never both."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] | None = Field(None, min_length=1, max_length=10000)
    selector: Selector | None = None
    reason: str = Field(min_length=3, max_length=2000)
    ticket: str | None = Field(None, max_length=200)
    dry_run: bool = Field(False, description="Return the exact targets and blast radius; change nothing.")

    @model_validator(mode="after")
    def _one_way_to_select(self) -> BatchRequest:
        if (self.ids is None) == (self.selector is None):
            raise ValueError("give exactly one of `ids` or `selector`")
        return self


class BatchPriorityRequest(BatchRequest):
    priority: float = Field(ge=-1_000_000, le=1_000_000, allow_inf_nan=False,
                            description="The new effective priority of every selected job.")


class DecisionOut(BaseModel):
    effect: str
    reasons: list[str]
    rules: list[str]
    approvals_required: dict[str, Any]
    obligations: list[dict[str, Any]]
    policy_hash: str
    ledger_seq: int


class JobOut(BaseModel):
    id: str
    name: str
    project: str
    queue: str
    state: str
    state_reason: str
    gpus_per_node: int
    nodes: int
    command: list[str]
    grace_seconds: float
    stop_signal: str
    ownership: dict[str, Any]
    environment: str
    labels: dict[str, str]
    workload: str | None
    placement: list[dict[str, Any]]
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None
    exit_code: int | None
    stop_request: dict[str, Any]
    evidence: dict[str, Any]
    history: list[dict[str, Any]]


class StopResponse(BaseModel):
    job: JobOut
    decision: DecisionOut
    approval_id: str | None = Field(None, description="Set when a second person must approve (M2).")


class JobList(BaseModel):
    jobs: list[JobOut]


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    gpus: int = Field(ge=0, le=1024)
    running: list[dict[str, Any]] = Field(default_factory=list)
    version: str = ""


class AgentReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    job_id: str
    nonce: str | None = None
    event: Literal["started", "stopping", "stopped", "exited", "rejected", "unknown", "deleted"]
    at: float
    pid: int | None = None
    detail: str = ""
    evidence: dict[str, Any] | None = None


class AgentReports(BaseModel):
    reports: list[AgentReport]
