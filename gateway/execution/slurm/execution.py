"""The Slurm implementation of the execution port (gateway/execution/port.py): jobgate decides and records,
Slurm places and runs.

What each ask becomes (the poll loop, poll.py, carries out what must wait for Slurm and reads back what happened):
- `queued`: the loop submits the waiting job with `sbatch` as jobgate's service user (account = project,
  partition = queue, GPUs per node, nodes, time limit = runtime limit, the prepare signal, `jobgate:<id>` in the
  comment) and keeps the map row (gateway/store/slurm_tables.py). A pending job paused in jobgate is held in
  Slurm (`scontrol hold`), released when resumed; one stopped or deleted while it waits is cancelled.
- `stop`: the prepare signal to the batch script (`scancel --signal=SIG --batch`), the grace window, then
  `scancel` (forced) or, for a preemption, `scontrol requeue`; the evidence (state, exit code and signal, who
  cancelled, end time, the accounting row, the checkpoint files) is read back from Slurm when the job has ended.
- `requeued` / `reprioritised`: `scontrol update Priority=` as Operator (P2: the priority it had before the
  preemption, which Slurm then keeps through the requeue instead of restarting its age factor).
- `delete_artifacts`: the job's checkpoint directory on the shared checkpoint root, file by file.
Placement is Slurm's: `placed` is reported when Slurm runs the job, with the nodes Slurm chose.

Mutations are refused (ExecutorUnavailable, 503) while slurmctld does not answer, inside the
caller's transaction: nothing is recorded as asked that Slurm could not be told. What is asked is carried out only
once the transaction commits: the ask is written into the map row, and the loop, woken after the commit, tells
Slurm (again after a restart or an outage, until Slurm has it).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import pwd
import secrets
import shlex
import shutil
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from gateway.errors import ExecutorUnavailable
from gateway.execution.port import ArtifactScope, CheckpointFile, Reports, Running
from gateway.execution.slurm.client import SlurmClient
from gateway.execution.slurm.errors import SlurmUnavailable
from gateway.execution.slurm.hostlist import expand
from gateway.execution.slurm.records import JobSpec
from gateway.store.models import Allocation, Job
from gateway.store.scheduler_tables import SchedJob
from gateway.store.slurm_tables import SlurmRun

COMMENT_PREFIX = "jobgate:"  # the comment of every job jobgate submits: jobgate:<job id>
Transaction = Callable[..., AbstractContextManager[Session]]  # (immediate=...) like Gateway.transaction


@dataclass(frozen=True)
class Delete:
    job_id: str
    node: str
    what: ArtifactScope
    reason: str
    reference: str


def batch_script(job: Job) -> str:
    """The job's command as a batch script. `exec`: the command is the batch step's process, so the prepare
    signal sent to the batch script (scancel --batch) reaches it, not a shell that would die of it."""
    return ("#!/bin/bash\n"
            'mkdir -p "$JOBGATE_CHECKPOINT_DIR"\n'
            f"exec {shlex.join(str(a) for a in job.command)}\n")


def job_spec(job: Job, checkpoint_dir: Path, log: Path) -> JobSpec:
    """What one sbatch of `job` asks of Slurm (the module docstring's mapping)."""
    limit = None if job.runtime_limit_s is None else max(1, math.ceil(job.runtime_limit_s / 60.0))
    name = "".join(c if c.isprintable() else "_" for c in job.name)[:128] or "job"
    env = {str(k): str(v) for k, v in (job.env or {}).items()}
    env.update({"JOBGATE_JOB_ID": job.id, "JOBGATE_CHECKPOINT_DIR": str(checkpoint_dir)})
    return JobSpec(script=batch_script(job), account=job.project, partition=job.queue, name=name, nodes=job.nodes,
                   gpus_per_node=job.gpus_per_node, time_limit_min=limit, prepare_signal=job.stop_signal,
                   # Slurm sends it this long before the time limit: the job's own grace window.
                   prepare_lead_s=max(1, min(65535, int(job.grace_seconds))),
                   comment=f"{COMMENT_PREFIX}{job.id}", workdir=str(checkpoint_dir.parent), output=str(log),
                   environment=env)


def list_files(directory: Path) -> list[CheckpointFile]:
    """Every file under `directory` with its size, mtime and SHA-256 (C5), paths relative to it."""
    out: list[CheckpointFile] = []
    if not directory.is_dir():
        return out
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        st = path.stat()
        out.append({"path": str(path.relative_to(directory)), "size": st.st_size, "mtime": st.st_mtime,
                    "sha256": digest.hexdigest()})
    return out


def slurm_view(session: Session, job_id: str) -> dict[str, object] | None:
    """Q10: what Slurm says of the job's latest Slurm job (its reason, priority and `squeue --start` estimate),
    shown beside jobgate's explanation by `job why` and the console; None off this backend."""
    r = session.scalars(select(SlurmRun).where(SlurmRun.job_id == job_id).order_by(SlurmRun.id.desc())).first()
    if r is None:
        return None
    return {"cluster": r.cluster, "slurm_job_id": r.slurm_job_id, "submitted_at": r.submitted_at.isoformat(),
            "state": r.state, "reason": r.reason, "priority": r.slurm_priority, "node_list": r.node_list,
            "restarts": r.restarts, "held": r.held,
            "estimated_start": r.estimated_start.isoformat() if r.estimated_start else None}


def live_run(session: Session, job_id: str) -> SlurmRun | None:
    return session.scalars(select(SlurmRun).where(SlurmRun.job_id == job_id, SlurmRun.live.is_(True))
                           .order_by(SlurmRun.id.desc())).first()


class SlurmExecution:
    """The port on one Slurm cluster (see the module docstring). `client` acts as jobgate's service user, the
    cluster's only Operator; `checkpoint_root` is storage the gateway and every node share (each job writes
    under <root>/<job id>)."""

    def __init__(self, client: SlurmClient, *, cluster: str, checkpoint_root: Path, transaction: Transaction,
                 clock: Callable[[], datetime], reports: Reports,
                 after_commit: Callable[[Session, Callable[[], None]], None]) -> None:
        self.client = client
        self.cluster = cluster
        self.checkpoint_root = checkpoint_root
        self.transaction = transaction
        self.clock = clock
        self.reports = reports
        self._after_commit = after_commit
        self.kick = threading.Event()  # the poll loop waits on it
        self._lock = threading.Lock()
        self._deletes: list[Delete] = []
        self._references = itertools.count(1)
        self.answering: bool | None = None  # slurmctld answered the loop's last read (None: not asked yet)

    # -- where jobs write -------------------------------------------------------------------------------

    def prepare_storage(self) -> None:
        """The checkpoint root, writable by the service user the jobs run as (and nobody else)."""
        self.checkpoint_root.mkdir(parents=True, exist_ok=True, mode=0o750)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(self.client.user)
            os.chown(self.checkpoint_root, entry.pw_uid, entry.pw_gid)

    def checkpoint_dir(self, job_id: str) -> Path:
        return self.checkpoint_root / job_id

    def log_path(self, job_id: str) -> Path:
        return self.checkpoint_root / f"{job_id}.log"

    # -- the port ---------------------------------------------------------------------------------------

    def queued(self, job: Job) -> None:
        """The loop submits it, or releases the Slurm job held while it was paused: woken once the asking
        transaction commits too (woken only before, its read missed the job and it slept a whole interval; a
        plain database transaction runs no after-commit action, hence the kick now as well)."""
        self.kick.set()
        session = object_session(job)
        if session is not None:
            self._wake_after(session)

    def requeued(self, job: Job) -> None:
        """P2: the priority jobgate kept for it (its SchedJob row: the priority before the preemption plus any
        compensation) becomes its Slurm priority; Slurm would otherwise start its age factor again."""
        session = object_session(job)
        if session is None:
            return
        row = session.get(SchedJob, job.id)
        run = live_run(session, job.id)
        if run is not None and row is not None:
            run.priority_set = max(1, round(row.priority))
            self._wake_after(session)

    def reprioritised(self, job: Job, priority: float) -> None:
        """A2, A3: jobgate's priority numbers are Slurm's on this backend (a person who lowers a job to 100 gives
        it Slurm priority 100). Raises SlurmUnavailable while slurmctld does not answer."""
        session = object_session(job)
        run = live_run(session, job.id) if session is not None else None
        if run is None or session is None:
            return
        self.refuse_unless_answering()
        run.priority_set = max(1, round(priority))
        self._wake_after(session)

    def changed(self) -> None:
        self.kick.set()

    def refuse_unless_answering(self) -> None:
        """Raises ExecutorUnavailable (503) unless slurmctld answers now (`scontrol ping`, a few ms)."""
        try:
            self.client.ping()
        except SlurmUnavailable as e:
            raise ExecutorUnavailable(f"Slurm cluster {self.cluster} does not answer ({e}); nothing was "
                                      "changed: ask again once it does") from e

    def stop(self, session: Session, job: Job, node: str, *, grace_seconds: float, reason: str) -> str:
        """One stop per Slurm job, however many nodes its gang has: the first call asks it, a later one only
        brings its window's end forward. Raises SlurmUnavailable while slurmctld does not answer."""
        run = live_run(session, job.id)
        if run is None:
            return "slurm-none"  # never reached Slurm: nothing runs there to stop
        self.refuse_unless_answering()
        now = self.clock()
        end = now + timedelta(seconds=max(0.0, grace_seconds))
        if run.stop_reference and run.stop_asked_at is not None and run.forced_at is None:
            asked_end = run.stop_asked_at + timedelta(seconds=run.stop_grace_s or 0.0)
            if end < asked_end:
                run.stop_grace_s = (end - run.stop_asked_at).total_seconds()
            self._wake_after(session)
            return run.stop_reference
        run.stop_reference = f"slurm-stop-{secrets.token_hex(6)}"
        run.stop_asked_at, run.stop_grace_s = now, max(0.0, grace_seconds)
        run.signal_sent_at, run.forced_at = None, None
        run.stop_requeue = bool(job.stop_request.get("preemption"))
        self._wake_after(session)
        return run.stop_reference

    def delete_artifacts(self, session: Session, job: Job, node: str, *, what: ArtifactScope, reason: str) -> str:
        reference = f"slurm-delete-{next(self._references)}-{secrets.token_hex(4)}"
        ask = Delete(job.id, node, what, reason, reference)

        def queue_it() -> None:
            with self._lock:
                self._deletes.append(ask)
            self.kick.set()

        self._after_commit(session, queue_it)
        return reference

    def holders(self, session: Session, job: Job) -> list[str]:
        """The files are on the shared checkpoint root: one holder, the first node the job ran on, answers for
        them (each holder is asked to delete, and must answer, once)."""
        nodes: list[str] = [str(p["node"]) for p in job.placement]
        for run in session.scalars(select(SlurmRun).where(SlurmRun.job_id == job.id).order_by(SlurmRun.id)):
            nodes.extend(expand(run.node_list))
        return nodes[:1]

    def running(self, session: Session) -> list[Running]:
        rows = session.execute(select(Allocation.job_id, Allocation.node, Allocation.gpus, Allocation.state)
                               .where(Allocation.released.is_(False)).order_by(Allocation.job_id, Allocation.node))
        return [Running(job_id, node, tuple(gpus), state) for job_id, node, gpus, state in rows]

    # -- for the loop -------------------------------------------------------------------------------------

    def take_deletes(self) -> list[Delete]:
        with self._lock:
            out, self._deletes = self._deletes, []
        return out

    def remove_files(self, ask: Delete) -> tuple[list[CheckpointFile], list[str]]:
        """Carry out one delete: the files removed, and those left."""
        directory = self.checkpoint_dir(ask.job_id)
        files = list_files(directory)
        left: list[str] = []
        for f in files:
            try:
                (directory / f["path"]).unlink()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(f["path"])
        if ask.what == "all" and not left:
            shutil.rmtree(directory, ignore_errors=True)
            self.log_path(ask.job_id).unlink(missing_ok=True)
        return [f for f in files if f["path"] not in left], left

    def _wake_after(self, session: Session) -> None:
        self._after_commit(session, self.kick.set)
