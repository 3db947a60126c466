"""Request and response bodies of the HTTP API (pydantic lives only at the edges)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

Queue = Literal["urgent", "normal", "batch"]
Environment = Literal["research", "staging", "production"]
StopSignal = Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_RUNTIME_LIMIT_S = 366 * 24 * 3600
# Every string a request carries is bounded, so an absurd one is refused naming its field instead of being
# stored, or echoed back whole in a "no such ..." answer. Names of principals, projects, jobs and actions fit
# the 64-character id columns; an entry of a list or map (a dependency, a label value, a mount) gets 256; one
# argv word or environment value, 32 KiB (a config passed inline fits).
Name = Annotated[str, StringConstraints(max_length=64)]
Entry = Annotated[str, StringConstraints(max_length=256)]
Word = Annotated[str, StringConstraints(max_length=32768)]
LAST_UNIX_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z


def _stays_in_range_in_utc(value: datetime) -> datetime:
    """Both databases keep times in UTC: 9999-12-31T23:59:59-14:00 is past year 9999 there, and PostgreSQL
    then stored a row no later read could load."""
    if value.tzinfo is not None:
        try:
            value.astimezone(UTC)
        except OverflowError as e:
            raise ValueError("the time is out of range once converted to UTC") from e
    return value


Timestamp = Annotated[datetime, AfterValidator(_stays_in_range_in_utc)]


class JobSubmit(BaseModel):
    """A job to run: what, where, how big, and who answers for it (R2)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Human name; not unique. The id is assigned.")
    project: str = Field(pattern=NAME_PATTERN, description="Project the job runs in (and is charged to).")
    queue: Queue = Field("normal", description="urgent (may preempt others' jobs; queue admins only), normal"
                         " (weighted fair share) or batch (tolerates long waits; often large).")
    gpus_per_node: int = Field(ge=1, le=64, description="GPUs on each node of the gang.")
    nodes: int = Field(1, ge=1, le=1024, description="Nodes of the gang; all start at once or none do.")
    command: list[Word] = Field(min_length=1, max_length=1024, description="argv, run as its own process group.")
    env: dict[Entry, Word] = Field(default_factory=dict, max_length=256,
                                   description="Environment variables for the process.")
    grace_seconds: float = Field(30.0, ge=0, le=3600, description="Window between prepare signal and SIGKILL.")
    stop_signal: StopSignal = Field("SIGTERM", description="Prepare signal delivered before a stop.")
    # Bounded: the scheduler adds it to the current time, and one job past datetime's range failed every cycle.
    runtime_limit_seconds: float | None = Field(None, gt=0, le=MAX_RUNTIME_LIMIT_S, allow_inf_nan=False,
                                                description="Declared limit, at most a year; used for backfill.")
    owner: Name | None = Field(None, description="Responsible owner; defaults to the caller (or its person).")
    beneficiary_project: Name | None = Field(None, description="Project that uses the result; default: project.")
    rights_holder: Name | None = Field(
        None, description="Project holding the rights to the data and artifacts (default: the job's project); "
        "one from another organisation makes the job external-rights (R3).",
    )
    valid_until: Timestamp | None = Field(None, description="End of the job's validity period (R4).")
    auto_offline: bool = Field(False, description="Reclaim the job automatically at valid_until (R4).")
    contact: str | None = Field(None, max_length=128, description="First contact for incidents; default: the owner.")
    environment: Environment = Field(
        "research", description="Where the job sits; an emergency stop can target a whole environment (C2).")
    dependencies: list[Entry] = Field(default_factory=list, max_length=256, description=(
        "What the job needs to run (services, data); listed in the inventory (C1)."))
    downstream: list[Entry] = Field(default_factory=list, max_length=256,
                                    description="What depends on the job's output (C1).")
    labels: dict[Name, Entry] = Field(default_factory=dict, max_length=64, description=(
        "Free key/value labels; batch and emergency selectors match them."))
    workload: str | None = Field(None, pattern=NAME_PATTERN, max_length=64, description="Group of jobs from one goal.")
    trackable: bool = Field(True, description="The gateway can see the job's processes (R5).")
    stoppable: bool = Field(
        True, description="The job can be stopped from here; a tracked job that cannot is a blind spot (R5, C4).")
    mounts: list[Entry] = Field(default_factory=list, max_length=64,
                                description="Storage mounts the job needs (Q1 registry).")
    datasets: list[Entry] = Field(default_factory=list, max_length=64,
                                  description="Data sets the job reads (Q1 registry).")


class StopRequest(BaseModel):
    """Why a job is stopped; both go to the ledger with the decision."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=3, max_length=2000, description="Written reason, kept in the ledger.")
    ticket: str | None = Field(None, max_length=200, description="Linked ticket or incident id.")


class Selector(BaseModel):
    """Which jobs a batch means. Every field narrows; labels must all match."""

    model_config = ConfigDict(extra="forbid")

    project: Name | None = Field(None, description="Only jobs of this project.")
    queue: Queue | None = Field(None, description="Only jobs in this queue.")
    environment: Environment | None = Field(None, description="Only jobs in this environment.")
    workload: Name | None = Field(None, description="Only jobs of this workload.")
    owner: Name | None = Field(None, description="Only jobs this person is the responsible owner of.")
    state: Name | None = Field(None, description="Default: every job that can still be stopped.")
    labels: dict[Name, Entry] = Field(default_factory=dict, max_length=64,
                                      description="Only jobs carrying every one of these labels.")

    @model_validator(mode="after")
    def _narrows(self) -> Selector:
        """A script whose selector lost its fields (an unset variable, a typo in a key the model forbids is
        caught, an empty map is not) must not select every job the caller can see (H2)."""
        if not (self.project or self.queue or self.environment or self.workload or self.owner or self.labels):
            raise ValueError("a selector must name at least one of project, queue, environment, workload, owner or"
                             " labels; an empty one would select every job you can see")
        return self


class BatchRequest(BaseModel):
    """Act on several jobs as one decision: by explicit ids or by a selector, never both."""

    model_config = ConfigDict(extra="forbid")

    ids: list[Name] | None = Field(None, min_length=1, max_length=10000, description="Exactly these jobs.")
    selector: Selector | None = Field(None, description="The jobs matching this selector, resolved to ids now.")
    reason: str = Field(min_length=3, max_length=2000, description="Written reason, kept in the ledger.")
    ticket: str | None = Field(None, max_length=200, description="Linked ticket or incident id.")
    dry_run: bool = Field(False, description="Return the exact targets and blast radius; change nothing.")

    @model_validator(mode="after")
    def _one_way_to_select(self) -> BatchRequest:
        if (self.ids is None) == (self.selector is None):
            raise ValueError("give exactly one of `ids` or `selector`")
        return self


class BatchPriorityRequest(BatchRequest):
    """Set one priority on several jobs as one decision: ids or a selector, never both."""

    priority: float = Field(ge=-1_000_000, le=1_000_000, allow_inf_nan=False,
                            description="The new effective priority of every selected job. Your own jobs "
                                        "alone: at most the higher of each one's priority now and its "
                                        "unadjusted priority (A2).")


class DecisionOut(BaseModel):
    """What the policy decided about this request, as recorded in the ledger."""

    effect: str = Field(description="allow, deny or needs_approval.")
    reasons: list[str] = Field(description="The policy's reasons, in words.")
    rules: list[str] = Field(description="Ids of the rules that decided (requirement ids such as M2, H2).")
    approvals_required: dict[str, Any] = Field(
        description="For needs_approval: how many more approvals, and which roles, projects or people may give them.")
    obligations: list[dict[str, Any]] = Field(description="What must happen with the action, e.g. notify the owner.")
    policy_hash: str = Field(description="Hash of the policy set that decided (GET /v1/policy).")
    ledger_seq: int = Field(description="Seq of the decision's ledger entry (-1 for a decision not recorded).")


class JobOut(BaseModel):
    """A job as the gateway knows it: spec, ownerships, where it runs and its life so far."""

    id: str = Field(description="Globally unique and never reused (R1).")
    name: str = Field(description="Human name given at submission.")
    project: str = Field(description="Project the job runs in.")
    queue: str = Field(description="urgent, normal or batch.")
    state: str = Field(description="pending, starting, running, stop_requested, stopping, stopped, stop_failed,"
                       " succeeded, failed, paused or deleted.")
    state_reason: str = Field(description="Why the job is in its state, e.g. what it waits for.")
    gpus_per_node: int = Field(description="GPUs on each node of the gang.")
    nodes: int = Field(description="Nodes of the gang.")
    command: list[str] = Field(description="argv of the job's process.")
    grace_seconds: float = Field(description="Window between the prepare signal and SIGKILL when stopped.")
    stop_signal: str = Field(description="Prepare signal delivered first when stopped.")
    ownership: dict[str, Any] = Field(description="creator (and its kind), owner, beneficiary_project, rights_holder,"
                                      " external_rights, contact, valid_until, auto_offline, submitted_via (R2-R4).")
    environment: str = Field(description="research, staging or production.")
    dependencies: list[str] = Field(description="What the job needs (data sets, services), as declared (R2).")
    downstream: list[str] = Field(description="Who consumes its results and is affected by a stop (R2).")
    labels: dict[str, str] = Field(description="Labels given at submission.")
    workload: str | None = Field(description="Group of jobs from one goal, if any.")
    placement: list[dict[str, Any]] = Field(description="Nodes and GPU indexes the job holds; empty while queued.")
    submitted_at: datetime = Field(description="When it was admitted.")
    started_at: datetime | None = Field(description="When its processes started.")
    ended_at: datetime | None = Field(description="When it ended.")
    outcome: str | None = Field(description="How it ended: graceful, forced, cancelled, confirmed, exited, ...")
    exit_code: int | None = Field(description="Exit code of its process, when one was reported.")
    stop_request: dict[str, Any] = Field(description="Who asked for the stop, why, under which decision and approvals.")
    evidence: dict[str, Any] = Field(description="Stop evidence from the nodes: logs, exit code, checkpoint (C3, C5).")
    history: list[dict[str, Any]] = Field(description="Every state transition: state, time, by whom.")
    checkpoint_retention: dict[str, Any] | None = Field(
        None, description="How long its checkpoints are kept (P1): tier; state kept, in_use, cleaning or cleaned"
                          " (removed from the nodes, at cleaned_at); keep_until, or until_next_job_on_quota."
                          " Shown for one job (GET /v1/jobs/{id}); absent in lists.")


class StopResponse(BaseModel):
    """The job after the request, and the decision about it."""

    job: JobOut = Field(description="The job as it stands now.")
    decision: DecisionOut = Field(description="The policy's decision, recorded in the ledger.")
    approval_id: str | None = Field(None, description="Set when a second person must approve (M2).")


class JobList(BaseModel):
    """Jobs, newest first."""

    jobs: list[JobOut] = Field(description="The jobs you may see that match.")


class Heartbeat(BaseModel):
    """A node agent's periodic sign of life."""

    model_config = ConfigDict(extra="ignore")

    gpus: int = Field(ge=0, le=1024, description="GPUs the node offers.")
    running: list[dict[str, Any]] = Field(
        default_factory=list, max_length=1024, description="Jobs the agent runs: job_id, pid and GPU indexes of each.")
    version: Name = Field("", description="The agent's version.")
    at: float | None = Field(None, ge=0, le=LAST_UNIX_SECOND, allow_inf_nan=False,
                             description="When the agent took this view of its jobs, in Unix seconds on the node.")
    isolation: Literal["uid+cgroup", "uid", "none"] | None = Field(
        None, description="How the agent keeps jobs apart: each under its own uid and cgroup, its own uid only, or "
                          "none (jobs run as the agent's user and could act as the node).")


class AgentReport(BaseModel):
    """One process event on a node."""

    model_config = ConfigDict(extra="ignore")

    job_id: Name = Field(description="The job the event is about.")
    nonce: Name | None = Field(None, description="Nonce of the signed command this answers; acknowledges its delivery.")
    event: Literal["started", "stopping", "stopped", "exited", "rejected", "unknown", "deleted", "reconciled"] = Field(
        description="What happened to the job's processes (rejected: a command the agent refused; reconciled: a "
                    "reconcile command carried out).")
    # Bounded to what the gateway does with them: a datetime (at) and an INTEGER column (pid); past those a
    # report for a starting job failed with a 500.
    at: float = Field(ge=0, le=LAST_UNIX_SECOND, allow_inf_nan=False, description="When, in Unix seconds on the node.")
    pid: int | None = Field(None, ge=1, le=2**31 - 1, description="The process id, once started.")
    detail: Word = Field("", description="Words for the event, e.g. why a command was rejected.")
    evidence: dict[str, Any] | None = Field(
        None, description="For stops and exits: log tail, exit code, signals sent, checkpoint state.")

    @model_validator(mode="after")
    def _exit_code_is_an_exit_code(self) -> AgentReport:
        """The gateway computes with the exit code (a gang's worst, a job's outcome) and stores it in an INTEGER
        column: a string or list in it was a 500 that rolled back the agent's whole batch, and a float on SQLite
        broke every later read of the job."""
        code = (self.evidence or {}).get("exit_code")
        if code is not None and (type(code) is not int or not -(2**31) <= code < 2**31):
            raise ValueError(f"evidence.exit_code must be an integer process exit status or null, not {code!r:.40}")
        return self


class AgentReports(BaseModel):
    """Process events a node agent reports, oldest first."""

    reports: list[AgentReport] = Field(description="The events, oldest first.")
