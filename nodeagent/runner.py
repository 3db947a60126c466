"""Job processes as process groups: spawn, graceful stop (P4), evidence (C3, C5). No HTTP here.

Every job runs in its own session, hence its own process group, so one `killpg` reaches the whole tree
the training code forked. A stop is: prepare signal to the group → wait up to the grace window (cut
short when the job announces `checkpoint.done`) → SIGKILL to whatever is left → evidence.

Threads, not SIGCHLD handlers: each spawned leader has a waiter thread blocked in `Popen.wait()`, each
stop runs in its own thread, so a long grace window never blocks the agent's command loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent import cgroups, evidence, jobdir, procgroup, spawn
from nodeagent.confinement import Confinement, processes_of
from nodeagent.errors import InvalidCommand
from nodeagent.identity import JobIdentity
from nodeagent.isolation import Isolation

log = logging.getLogger("nodeagent.runner")

# Job ids become directory names; anything else could walk out of the work directory.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_POLL_SECONDS = 0.05
# After `checkpoint.done` the job should be exiting anyway; give it a moment before the kill.
CHECKPOINT_DONE_SETTLE_SECONDS = 1.0
# How long SIGKILL may take to empty a group before we report it as not gone.
_KILL_WAIT_SECONDS = 5.0
_ADOPTED_POLL_SECONDS = 0.1


def check_job_id(job_id: str) -> str:
    """Return `job_id` if it is safe as a directory name; raises InvalidCommand otherwise."""
    if not _JOB_ID.fullmatch(job_id) or job_id in (".", ".."):
        raise InvalidCommand("invalid", f"job id {job_id!r} is not [A-Za-z0-9._-]{{1,128}}")
    return job_id


@dataclass(frozen=True)
class RunnerEvent:
    """Something that happened to a job's process group; the agent turns it into a report."""

    job_id: str
    event: str
    nonce: str | None
    at: float
    pid: int | None
    detail: str = ""
    evidence: dict[str, Any] | None = None

    def to_report(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "nonce": self.nonce,
            "event": self.event,
            "at": self.at,
            "pid": self.pid,
            "detail": self.detail,
            "evidence": self.evidence,
        }


EventSink = Callable[[RunnerEvent], None]


@dataclass(frozen=True)
class ProcessRecord:
    """What a restarted agent needs to find, trust and stop a job it did not spawn itself."""

    job_id: str
    pid: int
    pgid: int
    gpus: tuple[int, ...]
    started_at: float
    nonce: str | None
    grace_seconds: float
    stop_signal: str
    # pid numbers are reused; boot id + kernel start time tell our process from a stranger.
    boot_id: str | None = None
    start_ticks: int | None = None
    # Isolation (H1): the run's own uid/gid (None: the agent's), whether that uid was allocated for this run
    # (not a person's account), and its cgroup directory.
    uid: int | None = None
    gid: int | None = None
    allocated_uid: bool = False
    cgroup: str | None = None

    @property
    def confinement(self) -> Confinement:
        return Confinement(self.pgid, self.cgroup, self.uid if self.allocated_uid else None)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "pid": self.pid,
            "pgid": self.pgid,
            "gpus": list(self.gpus),
            "started_at": self.started_at,
            "nonce": self.nonce,
            "grace_seconds": self.grace_seconds,
            "stop_signal": self.stop_signal,
            "boot_id": self.boot_id,
            "start_ticks": self.start_ticks,
            "uid": self.uid,
            "gid": self.gid,
            "allocated_uid": self.allocated_uid,
            "cgroup": self.cgroup,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        """Raises KeyError, TypeError or ValueError on a malformed record."""
        ticks = data.get("start_ticks")
        return cls(
            job_id=str(data["job_id"]),
            pid=int(data["pid"]),
            pgid=int(data["pgid"]),
            gpus=tuple(int(g) for g in data["gpus"]),
            started_at=float(data["started_at"]),
            nonce=None if data.get("nonce") is None else str(data["nonce"]),
            grace_seconds=float(data.get("grace_seconds", 30.0)),
            stop_signal=str(data.get("stop_signal", "SIGTERM")),
            boot_id=None if data.get("boot_id") is None else str(data["boot_id"]),
            start_ticks=None if ticks is None else int(ticks),
            uid=None if data.get("uid") is None else int(data["uid"]),
            gid=None if data.get("gid") is None else int(data["gid"]),
            allocated_uid=bool(data.get("allocated_uid", False)),
            cgroup=None if data.get("cgroup") is None else str(data["cgroup"]),
        )

    def still_ours(self) -> bool:
        """True if the recorded group still runs and is the very job we started (not a reused pid).

        Without isolation processes.json is writable by the job (same user), so the record alone proves
        nothing: the kernel must confirm it. The leader must match the recorded boot, start time and group and
        carry the job id the agent put in its environment; once the leader is gone, some live member must
        carry it. A job cgroup is the agent's own (root's) and only its job enters it: a member proves it.
        """
        current_boot = procgroup.boot_id()
        if current_boot is None:
            return procgroup.group_alive(self.pgid)  # no /proc: nothing better to ask
        if self.boot_id != current_boot or self.start_ticks is None:
            return False
        if self.cgroup:
            return cgroups.populated(Path(self.cgroup))
        if self.allocated_uid and self.uid is not None:
            return self.confinement.alive()  # only this run ever has that uid while it lives
        stat = procgroup.read_stat(self.pid)
        if stat is not None and stat.state != "Z":
            return (
                stat.start_ticks == self.start_ticks
                and stat.pgrp == self.pgid
                and procgroup.environ_has(self.pid, "JOBGATE_JOB_ID", self.job_id)
            )
        return any(
            m.state != "Z" and procgroup.environ_has(m.pid, "JOBGATE_JOB_ID", self.job_id)
            for m in procgroup.group_members(self.pgid)
        )


@dataclass
class _Job:
    record: ProcessRecord
    job_dir: Path
    popen: subprocess.Popen[bytes] | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    exited: threading.Event = field(default_factory=threading.Event)
    exit_code: int | None = None
    exit_signal: str | None = None
    exited_at: float | None = None
    stopping: bool = False
    finishing: bool = False
    deadline: float = float("inf")  # while stopping: when SIGKILL follows (a later stop may bring it forward)
    grace_cut: float | None = None  # the grace window of the later stop that brought it forward


class Runner:
    """Owns the job process groups of one node. Thread-safe; every outcome goes to `sink`."""

    def __init__(
        self,
        work_dir: Path,
        sink: EventSink,
        *,
        isolation: Isolation | None = None,
        subreaper: bool = True,
        reap_interval: float = 1.0,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.isolation = isolation
        self._sink = sink
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._stop_threads: list[threading.Thread] = []
        # Uids being given to a start right now, and allocated uids whose run left processes SIGKILL could not
        # end: neither is handed out, the second until nothing of that run is alive any more.
        self._reserved_uids: set[int] = set()
        self._spawn_lock = threading.Lock()
        self._lingering_uids: set[int] = set()
        self._closed = threading.Event()
        self._boot_id = procgroup.boot_id()
        self._janitor: threading.Thread | None = None
        if subreaper and procgroup.become_subreaper():
            # Orphaned grandchildren now become our zombies; reap them so groups really empty.
            self._janitor = threading.Thread(
                target=self._reap_loop, args=(reap_interval,), name="runner-reaper", daemon=True
            )
            self._janitor.start()

    # -- queries -------------------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        return self.work_dir / "jobs" / check_job_id(job_id)

    def running(self) -> list[ProcessRecord]:
        """Records of the jobs that have not finished yet (stopping ones included)."""
        with self._lock:
            return [job.record for job in self._jobs.values()]

    def get(self, job_id: str) -> ProcessRecord | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else job.record

    def _uids_in_use(self) -> set[int]:
        """Uids no new run may take (called under the lock)."""
        self._lingering_uids = {u for u in self._lingering_uids if processes_of(u)}
        running = {job.record.uid for job in self._jobs.values() if job.record.uid is not None}
        return running | self._reserved_uids | self._lingering_uids

    def busy_gpus(self) -> set[int]:
        with self._lock:
            return {g for job in self._jobs.values() for g in job.record.gpus}

    # -- start ---------------------------------------------------------------------------------------

    def start(
        self,
        job_id: str,
        argv: Sequence[str],
        gpus: Sequence[int],
        env: Mapping[str, str],
        grace_seconds: float,
        stop_signal: str,
        *,
        nonce: str | None = None,
        run_as: str | None = None,
    ) -> ProcessRecord | None:
        """Spawn `argv` as a new process group (with isolation: as its own identity, in its own cgroup, see
        nodeagent/spawn.py); emits `started`, or `exited` if spawning failed. `run_as` is the submitting person,
        whose mapped Unix account the job uses if the node has one.

        Raises InvalidCommand for a bad job id or signal, or if the job already runs here.
        Failures of the spawn itself (missing executable, unwritable job dir) are reported, not raised.
        """
        job_dir = self.job_dir(job_id)
        procgroup.parse_signal(stop_signal)
        with self._lock:
            if job_id in self._jobs:
                raise InvalidCommand("conflict", f"job {job_id} already runs on this node")
            identity = None
            if self.isolation is not None:
                identity = self.isolation.identities.assign(run_as, self._uids_in_use())
                self._reserved_uids.add(identity.uid)
        try:
            with self._spawn_lock:
                return self._spawn(job_id, job_dir, argv, gpus, env, grace_seconds, stop_signal, nonce, identity)
        finally:
            if identity is not None:
                with self._lock:
                    self._reserved_uids.discard(identity.uid)

    def _spawn(self, job_id: str, job_dir: Path, argv: Sequence[str], gpus: Sequence[int], env: Mapping[str, str],
               grace_seconds: float, stop_signal: str, nonce: str | None, identity: JobIdentity | None
               ) -> ProcessRecord | None:
        child_env = spawn.job_environment(env, job_id=job_id, job_dir=job_dir, gpus=gpus, identity=identity)
        cgroup = None
        try:
            relative = "/" in argv[0] and not argv[0].startswith("/")  # resolved in the job's directory
            if not relative and spawn.resolve_program(argv[0], child_env["PATH"]) is None:
                raise FileNotFoundError(f"no program {argv[0]!r} on the job's PATH ({child_env['PATH']})")
            owner = None if identity is None else (identity.uid, identity.gid)
            jobdir.make(job_dir, owner)
            if identity is not None and self.isolation is not None and self.isolation.cgroups is not None:
                cgroup = self.isolation.cgroups.create(job_id)
            chain = spawn.exec_chain(argv, identity, cgroup, self.isolation.setpriv if self.isolation else None)
            with jobdir.open_log(job_dir, owner) as out:
                popen = subprocess.Popen(
                    chain,
                    cwd=job_dir,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    # What the job writes is its own alone: other jobs (other uids) cannot read it.
                    umask=0o077 if identity is not None else -1,
                )
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            log.warning("spawn failed job_id=%s error=%s", job_id, e)
            if cgroup is not None:
                cgroups.remove(cgroup)
            self._emit(job_id, "exited", nonce, pid=None, detail=f"spawn failed: {e}")
            return None
        stat = procgroup.read_stat(popen.pid)
        record = ProcessRecord(
            job_id=job_id,
            pid=popen.pid,
            pgid=popen.pid,  # start_new_session: the leader's pid is the group id
            gpus=tuple(int(g) for g in gpus),
            started_at=time.time(),
            nonce=nonce,
            grace_seconds=float(grace_seconds),
            stop_signal=stop_signal,
            boot_id=self._boot_id,
            start_ticks=None if stat is None else stat.start_ticks,
            uid=None if identity is None else identity.uid,
            gid=None if identity is None else identity.gid,
            allocated_uid=identity is not None and identity.allocated,
            cgroup=None if cgroup is None else str(cgroup),
        )
        job = _Job(record=record, job_dir=job_dir, popen=popen)
        with self._lock:
            self._jobs[job_id] = job
        # `started` goes out before the waiter exists, so it always precedes that job's `exited`.
        self._emit(job_id, "started", nonce, pid=popen.pid, detail=" ".join(argv)[:200])
        threading.Thread(target=self._wait_child, args=(job,), name=f"wait-{job_id}", daemon=True).start()
        return record

    def adopt(self, record: ProcessRecord) -> bool:
        """Take over a group a previous agent started; False (nothing adopted) if it is gone or not ours."""
        if not record.still_ours():
            return False
        job = _Job(record=record, job_dir=self.job_dir(record.job_id), popen=None)
        with self._lock:
            if record.job_id in self._jobs:
                return False
            self._jobs[record.job_id] = job
        threading.Thread(
            target=self._watch_adopted, args=(job,), name=f"watch-{record.job_id}", daemon=True
        ).start()
        return True

    def report_vanished(self, record: ProcessRecord, detail: str) -> None:
        """Emit `exited` (exit status unknowable) for a recorded job that is no longer ours to watch."""
        job = _Job(record=record, job_dir=self.job_dir(record.job_id), popen=None)
        job.exited.set()
        # Gone unless the recorded group still lives: then it is a stranger's now, or the record was
        # edited; either way nobody may count its GPUs as free without a person looking.
        self._finish(job, "exited", None, detail=detail, gone=not record.confinement.alive())

    # -- stop ----------------------------------------------------------------------------------------

    def stop(
        self,
        job_id: str,
        grace_seconds: float | None = None,
        stop_signal: str | None = None,
        *,
        nonce: str | None = None,
        reason: str = "",
    ) -> threading.Thread | None:
        """Begin a graceful stop in a background thread and return it (None if nothing to stop).

        Emits `stopping` once the prepare signal is sent and `stopped` with evidence at the end; for a
        job that is not (or no longer) running, emits `stopped` with no evidence right away.
        Raises InvalidCommand for an unknown signal name or a negative grace window.
        """
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            self._emit(job_id, "stopped", nonce, pid=None, detail="not running on this node")
            return None
        grace = job.record.grace_seconds if grace_seconds is None else float(grace_seconds)
        if not grace >= 0 or grace == float("inf"):
            raise InvalidCommand("invalid", f"grace_seconds must be a finite number ≥ 0, got {grace_seconds}")
        sig_name = job.record.stop_signal if stop_signal is None else stop_signal
        sig = procgroup.parse_signal(sig_name)
        with job.lock:
            if job.finishing:
                already = "already exited"
            elif job.stopping:
                already = "stop already in progress"
                # A later, shorter stop (an emergency stop taking over a graceful one) brings SIGKILL forward;
                # it never pushes it back.
                if (cut_at := time.time() + grace) < job.deadline:
                    job.deadline, job.grace_cut = cut_at, grace
                    already += f"; grace window cut to {grace:g}s"
            else:
                already = ""
                job.stopping = True
        if already:
            event = "stopped" if already == "already exited" else "stopping"
            self._emit(job_id, event, nonce, pid=job.record.pid, detail=already)
            return None
        thread = threading.Thread(
            target=self._stop_job,
            args=(job, sig, grace, nonce, reason),
            name=f"stop-{job_id}",
            daemon=True,
        )
        with self._lock:
            self._stop_threads = [t for t in self._stop_threads if t.is_alive()]
            self._stop_threads.append(thread)
        thread.start()
        return thread

    def delete_artifacts(self, job_id: str, *, everything: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
        """Delete a finished job's checkpoints (or, with `everything`, its whole job directory); return a
        record (path, size, mtime, sha256) of every file removed and the paths that could not be.
        Raises InvalidCommand if the job runs, or if its directory was replaced by something else."""
        job_dir = self.job_dir(job_id)
        with self._lock:
            if job_id in self._jobs:
                raise InvalidCommand("conflict", f"job {job_id} still runs on this node")
        try:
            return evidence.delete_files(job_dir, "" if everything else "checkpoints")
        except FileNotFoundError:
            return [], []
        except OSError as e:
            # The job swapped its directory (or the jobs root) for a symlink or file: a person must look.
            raise InvalidCommand("unsafe", f"{job_dir} is not a plain directory ({e.strerror})") from e

    def join_stops(self, timeout: float | None = None) -> bool:
        """Wait for in-flight stops; True if none is left running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            threads = list(self._stop_threads)
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def close(self) -> None:
        """Stop background housekeeping. Jobs keep running: they outlive the agent by design."""
        self._closed.set()

    # -- internals -----------------------------------------------------------------------------------

    def _stop_job(self, job: _Job, sig: signal.Signals, grace: float, nonce: str | None, reason: str) -> None:
        record = job.record
        sent_at = time.time()
        # The whole job hears it: with a cgroup or an allocated uid also what it started in other sessions.
        record.confinement.signal(sig)
        self._emit(
            record.job_id,
            "stopping",
            nonce,
            pid=record.pid,
            detail=reason,
            evidence={"signal": sig.name, "signal_sent_at": sent_at, "grace_seconds": grace},
        )
        done_marker = job.job_dir / "checkpoint.done"
        with job.lock:
            job.deadline = min(job.deadline, sent_at + grace)
        settling = False
        while not job.exited.is_set():
            now = time.time()
            with job.lock:
                deadline = job.deadline
            if now >= deadline:
                break
            if not settling and _touched_since(done_marker, sent_at):
                settling = True
                with job.lock:
                    job.deadline = min(job.deadline, now + CHECKPOINT_DONE_SETTLE_SECONDS)
                continue
            job.exited.wait(min(_POLL_SECONDS, max(0.0, deadline - now)))
        graceful = job.exited.is_set() and sig != signal.SIGKILL
        # Also reaches stragglers a gracefully exited leader left behind.
        gone = _kill_whole(job)
        detail = "exited within the grace window" if graceful else "killed after the grace window"
        if settling:
            detail += " (checkpoint.done seen)"
        if job.grace_cut is not None:
            detail += f" (cut to {job.grace_cut:g}s by a later stop)"
        self._finish(
            job,
            "stopped",
            nonce,
            detail=detail,
            signal_name=sig.name,
            sent_at=sent_at,
            grace=grace,
            outcome="graceful" if graceful else "forced",
            gone=gone,
        )

    def _wait_child(self, job: _Job) -> None:
        assert job.popen is not None
        code = job.popen.wait()
        self._record_exit(job, code)

    def _watch_adopted(self, job: _Job) -> None:
        # Not our child: no waitpid, no exit status, only liveness of the group.
        while _adopted_alive(job.record):
            time.sleep(_ADOPTED_POLL_SECONDS)
        self._record_exit(job, None)

    def _record_exit(self, job: _Job, code: int | None) -> None:
        with job.lock:
            job.exited_at = time.time()
            if code is not None and code < 0:
                job.exit_signal = procgroup.signal_name(-code)
            else:
                job.exit_code = code
            finish_here = not job.stopping
            job.finishing = job.finishing or finish_here
            job.exited.set()
        if finish_here:
            # The leader defines the job's life, as PID 1 does a container's: leftovers go with it,
            # else they would hold GPUs we report as released.
            gone = _kill_whole(job)
            self._finish(job, "exited", None, detail="exited on its own", gone=gone)

    def _finish(
        self,
        job: _Job,
        event: str,
        nonce: str | None,
        *,
        detail: str,
        gone: bool,
        signal_name: str | None = None,
        sent_at: float | None = None,
        grace: float | None = None,
        outcome: str | None = None,
    ) -> None:
        with job.lock:
            job.finishing = True
        record = job.record
        confinement = record.confinement
        # A cgroup or an allocated uid holds everything the job started; only a bare process group has strays.
        strays = self._end_strays(job) if confinement.kind == "process_group" else []
        gone = gone and all(s["ended"] for s in strays)
        # With isolation only the run's own files are read: never one a job linked in from elsewhere.
        owner = record.uid if record.allocated_uid else None
        artifacts = evidence.scan_files(job.job_dir, "checkpoints", owner=owner)
        ev = {
            "signal": signal_name,
            "signal_sent_at": sent_at,
            "grace_seconds": grace,
            "exited_at": job.exited_at,
            "exit_code": job.exit_code,
            "exit_signal": job.exit_signal,
            "outcome": outcome,
            "process_group_gone": gone,
            "gpus_released": list(record.gpus) if gone else [],
            "checkpoints": evidence.since(artifacts, sent_at),
            "artifacts": artifacts,
            "log_tail": evidence.log_tail(job.job_dir / "output.log", owner=owner),
            "confinement": confinement.kind,
        }
        if strays:
            ev["strays"] = strays
        if record.allocated_uid and record.uid is not None and gone:
            jobdir.give_back(job.job_dir, record.uid)
        if record.cgroup and gone:
            cgroups.remove(Path(record.cgroup))
        with self._lock:
            if self._jobs.get(record.job_id) is job:
                del self._jobs[record.job_id]
            if record.allocated_uid and record.uid is not None and not gone:
                self._lingering_uids.add(record.uid)  # never handed out while something of this run lives
        self._emit(record.job_id, event, nonce, pid=record.pid, detail=detail, evidence=ev)

    def _end_strays(self, job: _Job) -> list[dict[str, Any]]:
        """SIGKILL what the job left running outside its process group (setsid, setpgid; see
        procgroup.strays): like leftovers inside the group, it would hold GPUs reported as released.
        Returns each stray with whether it ended; one that did not keeps the job's GPUs withheld."""
        with self._lock:
            others = [j.record for j in self._jobs.values() if j is not job]
        found = procgroup.strays(job.record.job_id, {r.pid for r in others})
        if not found:
            return []
        protected = {r.pgid for r in others}
        for stray in found:
            # One that leads its own group (setsid) takes its descendants with it; another job's group is
            # never signalled, whatever group a stray moved itself into.
            if stray.pgrp == stray.pid and stray.pgrp not in protected:
                procgroup.signal_group(stray.pgrp, signal.SIGKILL)
            else:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(stray.pid, signal.SIGKILL)
        left = {stray.pid for stray in found}
        deadline = time.monotonic() + _KILL_WAIT_SECONDS
        while left and time.monotonic() < deadline:
            left = {pid for pid in left if not procgroup.reap(pid)}
            if left:
                time.sleep(0.02)
        procgroup.reap_group_zombies({stray.pgrp for stray in found} - protected)
        log.warning("killed strays outside the job's process group job_id=%s pids=%s", job.record.job_id,
                    sorted(stray.pid for stray in found))
        return [{"pid": stray.pid, "pgid": stray.pgrp, "ended": stray.pid not in left} for stray in found]

    def _emit(
        self,
        job_id: str,
        event: str,
        nonce: str | None,
        *,
        pid: int | None,
        detail: str = "",
        evidence: dict[str, Any] | None = None,
    ) -> None:
        try:
            self._sink(RunnerEvent(job_id, event, nonce, time.time(), pid, detail, evidence))
        except Exception:
            # A broken sink must not kill a waiter or stop thread and leave a job unsupervised.
            log.exception("event sink failed job_id=%s event=%s", job_id, event)

    def _reap_loop(self, interval: float) -> None:
        while not self._closed.wait(interval):
            # Under the spawn lock: a leader that exits before it is registered must stay its waiter's to reap.
            with self._spawn_lock:
                with self._lock:
                    leaders = {job.popen.pid for job in self._jobs.values() if job.popen is not None}
                procgroup.reap_orphans(leaders)


def _adopted_alive(record: ProcessRecord) -> bool:
    # The live leader answers without a /proc scan; only once it is gone do stragglers need one.
    stat = procgroup.read_stat(record.pid)
    if stat is not None and stat.state != "Z" and stat.pgrp == record.pgid:
        return True
    return procgroup.group_alive(record.pgid)


def _touched_since(path: Path, t: float) -> bool:
    try:
        return path.stat().st_mtime >= t - evidence.MTIME_SLACK_SECONDS
    except FileNotFoundError:
        return False


def _kill_whole(job: _Job) -> bool:
    """SIGKILL everything left of the job; True once nothing of it lives (zombies of ours reaped)."""
    confinement = job.record.confinement
    if confinement.kind != "process_group":
        gone = confinement.kill(_KILL_WAIT_SECONDS)
        job.exited.wait(_KILL_WAIT_SECONDS)
        return gone
    procgroup.signal_group(job.record.pgid, signal.SIGKILL)
    job.exited.wait(_KILL_WAIT_SECONDS)
    return _await_group_gone(job.record.pgid, _KILL_WAIT_SECONDS)


def _await_group_gone(pgid: int, timeout: float) -> bool:
    """Poll until no live member of the group is left, reaping the zombies that are ours."""
    deadline = time.monotonic() + timeout
    while True:
        if not procgroup.signal_group(pgid, 0):
            return True  # the common case, and cheap: no /proc scan
        # Members remain, maybe only zombies: reap ours, then ask whether anything lives.
        procgroup.reap_group_zombies({pgid})
        if not procgroup.group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
