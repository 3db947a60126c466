"""A typed client for one Slurm 22.05 cluster through its commands, acting as jobgate's service user.

Mutations: sbatch, scancel (also only a signal to the batch script), scontrol requeue / hold / release /
update Priority / Nice. Reads: squeue --json, squeue --start, sacct --json. Every method returns
records from records.py or raises one SlurmError subclass (errors.py).

What Slurm does here that a caller must know (22.05.8, seen on the project's starter):
1. `squeue --json` ignores -j, -u, -t: it prints every job, so `jobs(ids)` filters here.
2. `scancel` of an unknown or finished job exits 0; with -v it says why on stderr, which is read.
   `scancel --signal` to a job that does not run retries for ~95 s unless filtered by --state.
   `squeue --json` exits 0 with slurmctld down, its document saying only "Unspecified error".
   Every command but `scontrol ping` retries an absent controller for MessageTimeout - 1 s.
3. `scontrol requeue` of a COMPLETED job puts it back in the queue: requeue only what still runs.
4. A refused submission ("Requested node configuration is not available") still uses up a job id and
   leaves a FAILED row, with the comment, in accounting.
5. Requeue resets the submit time (so the age factor) and makes the job wait cred_expire + 1 s; an
   explicitly set Priority survives requeue and preemption, clears the nice, and makes Slurm ignore
   (exit 0) any later nice. Accounting records who cancelled
   (`cancelled_by`), never who requeued, held or reprioritised.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from gateway.execution.slurm.commands import CommandRunner, classify
from gateway.execution.slurm.connection import SlurmConnection
from gateway.execution.slurm.errors import ControllerDown, InvalidRequest, SlurmBadOutput
from gateway.execution.slurm.parse import (
    START_FORMAT,
    DocumentError,
    parse_accounted_jobs,
    parse_queued_jobs,
    parse_start_estimates,
)
from gateway.execution.slurm.records import (
    AccountedJob,
    JobSpec,
    QueuedJob,
    SlurmJobId,
    StartEstimate,
    check_signal,
)

# sacct's "Nothing found with query": no rows, not a failure.
_NOTHING_FOUND = 9003


def _ids(job_ids: Iterable[int]) -> list[int]:
    out = []
    for j in job_ids:
        if isinstance(j, bool) or not isinstance(j, int) or j <= 0:
            raise InvalidRequest("slurm", f"{j!r} is not a Slurm job id")
        out.append(j)
    return out


class SlurmClient:
    """Commands to one cluster as one user (SlurmConnection). Thread-safe: it holds no mutable state."""

    def __init__(self, conn: SlurmConnection, runner: CommandRunner | None = None) -> None:
        self.conn = conn
        self.runner = runner or CommandRunner(conn)

    @property
    def user(self) -> str:
        return self.runner.user

    # ------------------------------------------------------------------------------------------ mutations

    def submit(self, spec: JobSpec) -> SlurmJobId:
        """Submit one batch job; its Slurm job id. Raises SlurmError (InvalidRequest for a job this
        cluster refuses, ControllerDown, SlurmTimeout: then whether it was queued is unknown)."""
        done = self.runner.check(["sbatch", *spec.sbatch_args()], stdin=spec.script, env=spec.environment)
        first = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
        head = first.split(";", 1)[0]
        if not head.isdigit():
            raise SlurmBadOutput(done.command, f"sbatch --parsable printed {first[:80]!r}, not a job id", self.user)
        return SlurmJobId(int(head))

    def signal_batch(self, job_id: int, signal: str) -> None:
        """Send `signal` to the job's batch script only (not its other steps): the prepare signal.
        Raises SlurmError (JobStateConflict unless the job runs)."""
        (jid,) = _ids([job_id])
        # --state=RUNNING: to a job that does not run, scancel would retry "Job is in transitional
        # state" for about 95 s before it failed; filtered, it says at once that no job matched.
        self._scancel([f"--signal={check_signal(signal)}", "--batch", "--state=RUNNING", str(jid)])

    def cancel(self, job_id: int) -> None:
        """Cancel the job (Slurm sends SIGTERM, then SIGKILL after KillWait). Raises SlurmError
        (JobStateConflict when it had already ended, JobNotFound when Slurm no longer knows it)."""
        (jid,) = _ids([job_id])
        self._scancel([str(jid)])

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        """Put a running job back in the queue (`scontrol requeue`, or `requeuehold` to hold it there).
        Slurm also requeues a job that already COMPLETED: check its state first. Raises SlurmError."""
        (jid,) = _ids([job_id])
        self._scontrol(["requeuehold" if hold else "requeue", str(jid)])

    def hold(self, job_id: int) -> None:
        """Keep a pending job from starting (priority 0, Reason JobHeldAdmin when an Operator holds).
        Raises SlurmError."""
        (jid,) = _ids([job_id])
        self._scontrol(["hold", str(jid)])

    def release(self, job_id: int) -> None:
        """Let a held job be scheduled again; its priority is recomputed. Raises SlurmError."""
        (jid,) = _ids([job_id])
        self._scontrol(["release", str(jid)])

    def set_priority(self, job_id: int, priority: int) -> None:
        """Fix the job's priority (Operators only; it then stays, through requeue and preemption, and
        the job's nice is reset to 0). Raises SlurmError (JobStateConflict for a held job)."""
        (jid,) = _ids([job_id])
        if isinstance(priority, bool) or not 1 <= priority < 2**32 - 1:
            raise InvalidRequest("scontrol update", f"priority {priority!r} is outside 1..4294967294")
        self._scontrol(["update", f"JobId={jid}", f"Priority={priority}"])

    def set_nice(self, job_id: int, nice: int) -> None:
        """Set the job's nice value (negative needs an Operator). Once a Priority was set, Slurm ignores
        this and still exits 0 (slurmctld logs "ignore nice set request"). Raises SlurmError."""
        (jid,) = _ids([job_id])
        if isinstance(nice, bool) or not -2147483645 <= nice <= 2147483645:
            raise InvalidRequest("scontrol update", f"nice {nice!r} is outside Slurm's range")
        self._scontrol(["update", f"JobId={jid}", f"Nice={nice}"])

    # ------------------------------------------------------------------------------------------ reads

    def jobs(self, job_ids: Iterable[int] | None = None) -> list[QueuedJob]:
        """Jobs slurmctld holds now (all of them, or those of `job_ids` it still knows). Raises SlurmError."""
        wanted = set(_ids(job_ids)) if job_ids is not None else None
        done = self.runner.run(["squeue", "--json"])
        jobs, errors = parse_queued_jobs(done.stdout, done.command, self.user) if done.returncode == 0 or \
            done.stdout.lstrip().startswith("{") else ([], [])
        self._raise_for(done.command, done.stderr, errors, done.returncode)
        return [j for j in jobs if wanted is None or j.job_id in wanted]

    def job(self, job_id: int) -> QueuedJob | None:
        """The job as slurmctld holds it, or None once it is gone from there. Raises SlurmError."""
        found = self.jobs([job_id])
        return found[0] if found else None

    def start_estimates(self, job_ids: Iterable[int] | None = None) -> list[StartEstimate]:
        """The backfill scheduler's expected start of pending jobs (`squeue --start`). Raises SlurmError."""
        argv = ["squeue", "--start", "--noheader", "-o", START_FORMAT]
        if job_ids is not None:
            ids = _ids(job_ids)
            if not ids:
                return []
            argv += ["-j", ",".join(map(str, ids))]
        done = self.runner.check(argv, env={"SLURM_TIME_FORMAT": "%s"})
        return parse_start_estimates(done.stdout, done.command, self.user)

    def accounting(self, job_ids: Iterable[int] | None = None, *, since: datetime | None = None,
                   until: datetime | None = None) -> list[AccountedJob]:
        """Accounting rows, one per attempt (a requeued job has several), of every user's jobs: those of
        `job_ids`, or those active between `since` and `until`. A window finds a job only once its
        eligible time reached slurmdbd, which can be seconds after `job_ids` already shows it ended:
        let consecutive windows overlap. Raises SlurmError (AccountingDown)."""
        argv = ["sacct", "--json", "--duplicates", "--allusers"]
        if job_ids is not None:
            ids = _ids(job_ids)
            if not ids:
                return []
            argv += ["--jobs", ",".join(map(str, ids))]
        for flag, when in (("--starttime", since), ("--endtime", until)):
            if when is not None:
                argv += [flag, when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")]
        # sacct reads and prints times in the local zone: make that UTC
        done = self.runner.run(argv, env={"TZ": "UTC"})
        parsed = done.returncode == 0 or done.stdout.lstrip().startswith("{")
        rows, errors = parse_accounted_jobs(done.stdout, done.command, self.user) if parsed else ([], [])
        errors = [e for e in errors if e.number != _NOTHING_FOUND]
        self._raise_for(done.command, done.stderr, errors, done.returncode)
        return rows

    def ping(self) -> None:
        """Return if slurmctld answers. Raises ControllerDown, or the error that kept the client from asking."""
        done = self.runner.run(["scontrol", "ping"])
        if done.returncode != 0 or " is UP" not in done.stdout:
            raise ControllerDown(done.command, (done.stdout + " " + done.stderr).strip() or "no answer", self.user)

    # ------------------------------------------------------------------------------------------ helpers

    def _scancel(self, args: list[str]) -> None:
        # -v: without it scancel says nothing (and exits 0) for an unknown or finished job.
        done = self.runner.run(["scancel", "-v", *args])
        errors = [ln for ln in done.stderr.splitlines() if "error:" in ln]
        if done.returncode != 0 or errors:
            raise classify(done.command, self.user, "\n".join(errors) or done.stderr, done.returncode)

    def _scontrol(self, args: list[str]) -> None:
        done = self.runner.run(["scontrol", *args])
        if done.returncode == 0:
            return
        text = done.stderr + "\n" + done.stdout
        # With slurmctld down, `scontrol requeue|hold|release` says only "Unexpected message received".
        if "unexpected message received" in text.lower():
            self.ping()
        raise classify(done.command, self.user, text, done.returncode)

    def _raise_for(self, command: str, stderr: str, errors: list[DocumentError], returncode: int) -> None:
        if returncode == 0 and not errors:
            return
        text = "\n".join([stderr, *(e.line() for e in errors)])
        # With slurmctld down, `squeue --json` exits 0, prints nothing on stderr, and its document says
        # only "slurm_load_jobs: Unspecified error": ask the controller itself (scontrol ping is instant).
        if "unspecified error" in text.lower() and command.startswith("squeue"):
            self.ping()
        raise classify(command, self.user, text, returncode) from None
