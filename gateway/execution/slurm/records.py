"""What the client asks Slurm to do and what it reads back, as frozen dataclasses.

`JobSpec` is one `sbatch`; `QueuedJob` is one job as slurmctld holds it (`squeue --json`, slurmrestd
GET /slurm/v0.0.38/jobs); `AccountedJob` is one attempt of a job as slurmdbd recorded it (`sacct --json`:
a requeued job has one row per attempt); `StartEstimate` is the backfill scheduler's expected start of
a pending job (`squeue --start`). Times are timezone-aware UTC datetimes, None where Slurm has none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NewType

from gateway.execution.slurm.errors import InvalidRequest

SlurmJobId = NewType("SlurmJobId", int)

# Slurm names (accounts, partitions, QOS, users): no spaces, quotes or separators that a command line or
# Slurm's own "a,b" lists would split on.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
# Signals as scancel and sbatch --signal take them (TERM, SIGUSR1, 10).
_SIGNAL = re.compile(r"^(SIG)?[A-Z][A-Z0-9+]{0,15}$|^[0-9]{1,2}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_name(kind: str, value: str) -> str:
    """The value if it is a plain Slurm name. Raises InvalidRequest."""
    if not _NAME.match(value):
        raise InvalidRequest("sbatch", f"{kind} {value!r} is not a Slurm name (letters, digits, _ . -)")
    return value


def check_signal(value: str) -> str:
    """The signal name or number as Slurm takes it. Raises InvalidRequest."""
    if not _SIGNAL.match(value):
        raise InvalidRequest("scancel", f"signal {value!r} is not a signal name or number")
    return value


@dataclass(frozen=True)
class JobSpec:
    """One batch job to submit with `sbatch --parsable`, the script on its standard input.

    The job runs as the submitting user (jobgate's service user) and is charged to `account`.
    `prepare_signal`, if set, is also what Slurm itself sends to the batch script `prepare_lead_s`
    before the time limit (`--signal=B:SIG@LEAD`). `comment` is where jobgate writes its own id (sacct
    keeps it with AccountingStoreFlags=job_comment). `environment` is the job's whole environment besides
    what Slurm adds (the client passes no variable of its own process to the job but PATH and LANG)."""

    script: str
    account: str
    partition: str
    name: str = "job"
    nodes: int = 1
    gpus_per_node: int = 0
    time_limit_min: int | None = None
    prepare_signal: str | None = None
    prepare_lead_s: int = 60
    comment: str | None = None
    workdir: str = "/tmp"
    output: str = "/dev/null"
    environment: Mapping[str, str] = field(default_factory=dict)
    requeue: bool = True
    hold: bool = False

    def __post_init__(self) -> None:
        if not self.script.startswith("#!"):
            raise InvalidRequest("sbatch", "the batch script must start with #! (an interpreter line)")
        check_name("account", self.account)
        check_name("partition", self.partition)
        if not self.name or any(c in self.name for c in "\n\r\0"):
            raise InvalidRequest("sbatch", f"job name {self.name!r} must be one non-empty line")
        if self.nodes < 1 or self.gpus_per_node < 0:
            raise InvalidRequest("sbatch", f"{self.nodes} nodes x {self.gpus_per_node} GPUs is not a job size")
        if self.time_limit_min is not None and self.time_limit_min < 1:
            raise InvalidRequest("sbatch", f"time limit {self.time_limit_min} min: Slurm counts whole minutes >= 1")
        if self.prepare_signal is not None:
            check_signal(self.prepare_signal)
            if not 0 <= self.prepare_lead_s <= 65535:
                raise InvalidRequest("sbatch", f"prepare lead {self.prepare_lead_s} s is outside 0..65535")
        if self.comment is not None and any(c in self.comment for c in "\n\r\0"):
            raise InvalidRequest("sbatch", "the comment must be one line")
        for path, what in ((self.workdir, "working directory"), (self.output, "output file")):
            if not path.startswith("/") or "\0" in path or "\n" in path:
                raise InvalidRequest("sbatch", f"{what} {path!r} must be an absolute path")
        for key in self.environment:
            if not _ENV_NAME.match(key):
                raise InvalidRequest("sbatch", f"environment variable name {key!r} is not a name")

    def sbatch_args(self) -> list[str]:
        """The options of `sbatch --parsable` for this job (the script goes on standard input)."""
        args = ["--parsable", f"--account={self.account}", f"--partition={self.partition}",
                f"--job-name={self.name}", f"--nodes={self.nodes}", f"--chdir={self.workdir}",
                f"--output={self.output}", "--export=ALL"]
        if self.gpus_per_node:
            args.append(f"--gres=gpu:{self.gpus_per_node}")
        if self.time_limit_min is not None:
            args.append(f"--time={self.time_limit_min}")
        if self.prepare_signal is not None:
            args.append(f"--signal=B:{self.prepare_signal}@{self.prepare_lead_s}")
        if self.comment is not None:
            args.append(f"--comment={self.comment}")
        args.append("--requeue" if self.requeue else "--no-requeue")
        if self.hold:
            args.append("--hold")
        return args


@dataclass(frozen=True)
class ExitStatus:
    """How a job (or its batch step) ended: `code` for a normal exit, `signal` when a signal ended it."""

    code: int | None
    signal: int | None

    @property
    def clean(self) -> bool:
        """Exited by itself with status 0."""
        return self.code == 0 and not self.signal


@dataclass(frozen=True)
class QueuedJob:
    """A job as slurmctld holds it (pending, running, or finished less than MinJobAge ago).

    `state` is COMPLETING from a cancel (or the script's exit) until its last process is gone, and
    only then the final state (CANCELLED, COMPLETED, ...): read the evidence after that. `priority` 0
    means held; `nice` is Slurm's nice offset (0 when squeue reports none);
    `gpus_per_node` comes from the job's per-node GRES request; `restarts` counts requeues; `submit_time`
    is reset by every requeue (Slurm's age factor starts again)."""

    job_id: SlurmJobId
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    reason: str
    priority: int
    nice: int
    comment: str
    nodes: int
    node_list: str
    gpus_per_node: int
    gres: str
    time_limit_min: int | None
    restarts: int
    requeue: bool
    submit_time: datetime | None
    eligible_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    exit: ExitStatus

    @property
    def held(self) -> bool:
        return self.state == "PENDING" and self.priority == 0


@dataclass(frozen=True)
class AccountedJob:
    """One attempt of a job as accounting (slurmdbd) recorded it.

    `state` is Slurm's (COMPLETED, CANCELLED, FAILED, TIMEOUT, PREEMPTED, REQUEUED, NODE_FAIL, PENDING,
    RUNNING, ...). `exit` is the job's exit status, `batch_exit` the batch step's: a job cancelled while
    its script ran shows exit 0:0 and the signal only on the batch step, whose record comes last (until
`batch_state` leaves RUNNING, `batch_exit` is a placeholder 0:0). `cancelled_by` is who asked
    Slurm to kill it (kill_request_user), when accounting knows: Slurm records none for a requeue."""

    job_id: SlurmJobId
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    reason: str
    comment: str | None
    priority: int | None
    nodes: str
    gpus: int
    cancelled_by: str | None
    submit_time: datetime | None
    eligible_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    elapsed_s: int
    exit: ExitStatus
    batch_exit: ExitStatus | None
    batch_state: str | None
    working_directory: str


@dataclass(frozen=True)
class StartEstimate:
    """When the backfill scheduler expects a pending job to start, where, and why it waits now."""

    job_id: SlurmJobId
    start_time: datetime | None
    nodes: str | None
    reason: str
