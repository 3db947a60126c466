"""The thin adapter around watch.py and associations.py: one look at the cluster per reconciliation cycle.

A cycle reads Slurm (squeue, sacct of the governed jobs, slurmctld's log since the last cycle, the
associations), jobgate's record (slurm_runs and the jobs), compares them (watch.compare) and, in one business
transaction, hands every new finding to the jobs room to ledger and alert (`Oversight`, gateway/jobs/oversight.py
implements it), keeps the jobs submitted straight to Slurm for the inventory, and sets the association limits
jobgate's quotas give (associations.desired) where Slurm's differ. A limit someone changed in Slurm since
jobgate set it is found like any other act behind jobgate's back, and set back: jobgate's quota is the one in force.

This room may not ledger or alert itself (tests/test_house.py): it says what it found, the jobs room tells.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gateway.execution.slurm import associations
from gateway.execution.slurm.client import SlurmClient
from gateway.execution.slurm.errors import SlurmError
from gateway.execution.slurm.watch import LIVE, Finding, Governed, LoggedAct, Look, compare, parse_log
from gateway.store.models import Job
from gateway.store.oversight_tables import SlurmAssocLimit, SlurmFindingRow, SlurmForeignJob
from gateway.store.slurm_tables import SlurmRun
from gateway.store.states import PAST_STATES, STOPPING_STATES
from scheduler.model import Quotas

log = logging.getLogger("jobgate.slurm.watch")
# How long an ended run stays compared after slurm_runs says it ended: the executor's own poll may see the end
# first, and the act that ended it must still be found.
RECENT = timedelta(minutes=15)
# A finding without an author waits this long for Slurm to name one, or to go away (see _tell).
PATIENCE = timedelta(seconds=30)
LOG_TAIL_BYTES = 1 << 20  # at start, the acts logged in the last MiB still count
_LOG_FILE = re.compile(r"^\s*SlurmctldLogFile\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)


class Oversight(Protocol):
    """What the watch needs from the jobs room: jobgate's quotas, and the telling of what it found."""

    def quotas(self, session: Session) -> Quotas | None:
        """The quota tiers in effect now (None when none was ever set)."""

    def projects(self, session: Session) -> list[str]:
        """Every jobgate project (an account each on Slurm)."""

    def out_of_band(self, session: Session, finding: Mapping[str, Any]) -> int:
        """Ledger and alert an act jobgate did not do (F3); the ledger's seq."""

    def ungoverned(self, session: Session, job: Mapping[str, Any]) -> int:
        """Ledger the first sighting of a job submitted straight to Slurm (R5); the ledger's seq."""

    def quotas_synced(self, session: Session, entry: Mapping[str, Any]) -> int:
        """Ledger the association limits jobgate set to carry its quotas (Q4); the ledger's seq."""


@dataclass
class CycleResult:
    """What one cycle did (for tests, the bench and the log)."""

    findings: list[dict[str, Any]] = field(default_factory=list)  # ledgered now
    ungoverned: list[int] = field(default_factory=list)  # Slurm ids first seen now
    quota_changes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # finding keys waiting for Slurm to name who
    ms: dict[str, float] = field(default_factory=dict)  # where the look's time went (squeue, sacct, log, ...)


def slurmctld_log(slurm_conf: Path) -> Path | None:
    """slurmctld's log file as slurm.conf names it, if this process can read it."""
    try:
        m = _LOG_FILE.search(slurm_conf.read_text())
    except OSError:
        return None
    path = Path(m.group(1)) if m else None
    return path if path is not None and os.access(path, os.R_OK) else None


def _aware(t: datetime | None) -> datetime | None:
    return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t


class LogReader:
    """Reads slurmctld's log from where the last read stopped (from its last MiB the first time)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.offset: int | None = None

    def acts(self) -> list[LoggedAct]:
        if self.path is None:
            return []
        try:
            with self.path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                if self.offset is None or self.offset > size:  # first read, or the log was rotated
                    self.offset = max(0, size - LOG_TAIL_BYTES)
                f.seek(self.offset)
                data = f.read(size - self.offset)
        except OSError as e:
            log.warning("cannot read slurmctld's log %s: %s", self.path, e)
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        return parse_log(data[:end].decode("utf-8", "replace").splitlines())


class SlurmWatch:
    """One cluster's watch. `cycle()` is one look; nothing runs between calls."""

    def __init__(self, client: SlurmClient, cluster: str, oversight: Oversight,
                 transaction: Callable[[], AbstractContextManager[Session]], *, clock: Callable[[], datetime],
                 log_path: Path | None = None, sync_quotas: bool = True) -> None:
        self.client, self.cluster, self.oversight = client, cluster, oversight
        self.transaction, self.clock = transaction, clock
        self.service_user = client.user
        self.log = LogReader(log_path if log_path is not None else slurmctld_log(client.conn.slurm_conf))
        self.sync_quotas = sync_quotas
        self._acts: list[LoggedAct] = []  # acts of the last hour: a finding may come a cycle after its log line
        self._waiting: dict[str, datetime] = {}
        self._managed: bool | None = None  # whether jobgate's quotas were on Slurm at the last sync (None: unknown)

    def cycle(self) -> CycleResult:
        """Look once: read Slurm, compare, tell. Raises SlurmError when Slurm cannot be read (nothing is told
        from half a look; the next cycle tries again)."""
        now = self.clock()
        ms: dict[str, float] = {}
        t = time.perf_counter()
        queued = self.client.jobs()
        ms["squeue"] = time.perf_counter() - t
        with self.transaction() as session:
            governed = self._governed(session, now)
        # Accounting only where squeue cannot tell it all: a job it no longer shows or shows ended, or one requeued
        # (an attempt's end state says by whom: jobgate's preemption, Slurm's, or a person's requeue). Not for a run
        # whose end jobgate's executor already read from accounting (slurm_runs keeps its state and canceller).
        queued_by_id = {int(q.job_id): q for q in queued}
        ask = [sid for sid, g in governed.items() if g.ended is None and (
            (q := queued_by_id.get(sid)) is None or q.state not in LIVE or q.restarts > g.requeues)]
        t = time.perf_counter()
        accounted = self.client.accounting(ask) if ask else []
        ms["sacct"] = time.perf_counter() - t
        t = time.perf_counter()
        self._acts = [a for a in self._acts if a.at > now - timedelta(hours=1)] + self.log.acts()
        ms["log"] = time.perf_counter() - t
        look = compare(queued, accounted, governed, self._acts, service_user=self.service_user,
                       names=_names(self._acts))
        result = CycleResult()
        with self.transaction() as session:
            t = time.perf_counter()
            self._tell(session, look, governed, now, result)
            ms["tell"] = time.perf_counter() - t
            if self.sync_quotas:
                t = time.perf_counter()
                self._sync(session, now, result)
                ms["quotas"] = time.perf_counter() - t
        result.ms = {k: round(v * 1000, 1) for k, v in ms.items()}
        return result

    # ----------------------------------------------------------------------------------------------- reads

    def _governed(self, session: Session, now: datetime) -> dict[int, Governed]:
        rows = session.execute(
            select(SlurmRun, Job).join(Job, Job.id == SlurmRun.job_id)
            .where(SlurmRun.cluster == self.cluster)
            .where(or_(SlurmRun.live.is_(True), SlurmRun.updated_at >= now - RECENT))
            .order_by(SlurmRun.id)).all()
        out: dict[int, Governed] = {}
        for run, job in rows:
            stop_asked = (run.stop_reference is not None or bool(job.stop_request) or job.state in STOPPING_STATES
                          or job.state in PAST_STATES or job.state == "paused")
            # Later rows win: a Slurm id reused after a reset names the newer run.
            out[run.slurm_job_id] = Governed(
                job_id=job.id, slurm_job_id=run.slurm_job_id, state=job.state, stop_asked=stop_asked,
                paused=bool(run.held) or job.state == "paused", priority=run.priority_set,
                requeues=requeues_asked(run), owner=job.owner,
                project=job.project, submitted_at=_aware(run.submitted_at),
                ended=None if run.live else run.state, cancelled_by=None if run.live else run.cancelled_by)
        return out

    # ----------------------------------------------------------------------------------------------- telling

    def _tell(self, session: Session, look: Look, governed: Mapping[int, Governed], now: datetime,
              result: CycleResult) -> None:
        by_job = {g.job_id: g for g in governed.values()}
        current = {f.key for f in look.findings}
        for key in [k for k in self._waiting if k not in current]:
            del self._waiting[key]  # resolved before it was told: a race with jobgate's own ask, not an act
        for f in look.findings:
            if session.get(SlurmFindingRow, self._key(f.key)) is not None:
                self._waiting.pop(f.key, None)
                continue
            # Slurm names no author yet (accounting lags), or jobgate's own ask has not reached Slurm yet (the
            # executor's loop tells Slurm after the asking transaction commits): wait; a race then resolves
            # itself, an act that lasts is told. A requeue never has an author, and jobgate's own are counted
            # before they are made: told at once.
            if f.by is None and f.act != "requeue":
                first = self._waiting.setdefault(f.key, now)
                if now - first < PATIENCE:
                    result.waiting.append(f.key)
                    continue
            self._waiting.pop(f.key, None)
            g = by_job[f.job_id]
            entry = {**f.as_json(), "cluster": self.cluster, "owner": g.owner, "project": g.project,
                     "jobgate_state": g.state, "service_user": self.service_user, "seen_at": now.isoformat()}
            self._found(session, entry, f, now)
            result.findings.append(entry)
        self._keep_ungoverned(session, look, now, result)

    def _key(self, key: str) -> str:
        return f"{self.cluster}:{key}"

    def _found(self, session: Session, entry: Mapping[str, Any], f: Finding | None, now: datetime) -> None:
        row = SlurmFindingRow(key=self._key(str(entry["key"])), cluster=self.cluster, act=str(entry["act"]),
                              job_id=f.job_id if f else None, slurm_job_id=f.slurm_job_id if f else None,
                              by=entry.get("by"), detail=str(entry.get("detail", ""))[:2000], at=now)
        session.add(row)
        session.flush()  # the key is taken before anything is told: a second look in parallel fails here
        row.ledger_seq = self.oversight.out_of_band(session, entry)

    def _keep_ungoverned(self, session: Session, look: Look, now: datetime, result: CycleResult) -> None:
        live = {r.slurm_job_id: r for r in session.scalars(
            select(SlurmForeignJob).where(SlurmForeignJob.cluster == self.cluster, SlurmForeignJob.live.is_(True)))}
        seen = set()
        for u in look.ungoverned:
            seen.add(u.slurm_job_id)
            row = live.get(u.slurm_job_id)
            if row is None:
                row = SlurmForeignJob(cluster=self.cluster, slurm_job_id=u.slurm_job_id, user=u.user,
                                      account=u.account, partition=u.partition, state=u.state, name=u.name[:500],
                                      nodes=u.nodes, gpus=u.gpus, claims=u.claims,
                                      submitted_at=u.submit_time, first_seen=now, last_seen=now, live=True)
                session.add(row)
                session.flush()
                row.ledger_seq = self.oversight.ungoverned(session, {**u.as_json(), "cluster": self.cluster,
                                                                     "seen_at": now.isoformat()})
                result.ungoverned.append(u.slurm_job_id)
            else:
                row.state, row.last_seen, row.gpus, row.nodes = u.state, now, u.gpus, u.nodes
        for sid, row in live.items():
            if sid not in seen:
                row.live, row.last_seen = False, now

    # ----------------------------------------------------------------------------------------------- quotas

    def _sync(self, session: Session, now: datetime, result: CycleResult) -> None:
        """Set the association limits jobgate's quotas give; an association someone else changed since is an
        act behind jobgate's back, told as one, and set back."""
        quotas = self.oversight.quotas(session)
        if quotas is None and self._managed is False:
            return  # no quota in jobgate, none ever set on Slurm by it: nothing to read (one command less a cycle)
        have = associations.parse_associations(self.client.runner.check(
            ["sacctmgr", "-n", "-P", "show", "assoc", f"cluster={self.cluster}",
             "format=account,user,partition,grptres"]).stdout)
        want, notes = associations.desired(quotas, have, service_user=self.service_user,
                                           projects=self.oversight.projects(session))
        self._managed = bool(want)
        result.notes = notes
        if not want:
            return
        applied = {associations.Assoc(r.account, r.user): r for r in session.scalars(
            select(SlurmAssocLimit).where(SlurmAssocLimit.cluster == self.cluster))}
        todo = associations.changes(want, have)
        for change in todo:
            last = applied.get(change.assoc)
            if last is not None and last.gpus != change.before:
                key = f"association:{change.assoc.label()}:{last.applied_at.isoformat()}:{change.before}"
                if session.get(SlurmFindingRow, self._key(key)) is None:
                    entry = {"key": key, "act": "association", "association": change.assoc.label(),
                             "by": None, "by_source": "sacctmgr show transactions names the actor",
                             "detail": f"GPU limit {change.before} in Slurm; jobgate set {last.gpus} (set back to "
                                       f"{change.after})", "cluster": self.cluster, "seen_at": now.isoformat(),
                             "service_user": self.service_user}
                    self._found(session, entry, None, now)
                    result.findings.append(entry)
        for change in todo:
            try:
                self.client.runner.check(associations.modify_argv(self.cluster, change))
            except SlurmError as e:  # what was set stays set and is ledgered; the rest is tried next cycle
                notes.append(f"could not set {change.assoc.label()}: {e}")
                todo = todo[:todo.index(change)]
                break
        # What already holds counts as set by jobgate too: a later change of it is then seen as one.
        for assoc, gpus in want.items():
            if assoc in have and assoc not in applied and have[assoc] == gpus:
                session.add(SlurmAssocLimit(cluster=self.cluster, account=assoc.account, user=assoc.user,
                                            gpus=gpus, applied_at=now))
        for change in todo:
            row = applied.get(change.assoc)
            if row is None:
                session.add(SlurmAssocLimit(cluster=self.cluster, account=change.assoc.account,
                                            user=change.assoc.user, gpus=change.after, applied_at=now))
            else:
                row.gpus, row.applied_at = change.after, now
        if todo:
            result.quota_changes = [c.as_json() for c in todo]
            self.oversight.quotas_synced(session, {"cluster": self.cluster, "changes": result.quota_changes,
                                                   "notes": notes, "by": self.service_user})


def _names(acts: list[LoggedAct]) -> dict[int, str]:
    out = {}
    for uid in {a.uid for a in acts}:
        try:
            out[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            out[uid] = f"uid {uid}"
    return out


class SlurmWatchLoop(threading.Thread):
    """Runs the watch's cycle every `interval_s` (JOBGATE_SLURM_WATCH_INTERVAL_S): a reconciliation cycle."""

    def __init__(self, watch: SlurmWatch, interval_s: float, *, leads: Callable[[], bool] = lambda: True) -> None:
        super().__init__(name="jobgate-slurm-watch", daemon=True)
        self.watch, self.interval_s = watch, interval_s
        self.leads = leads  # the leader's work (gateway/leadership.py): one replica ledgers each finding
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            if not self.leads():
                continue
            try:
                result = self.watch.cycle()
            except SlurmError as e:  # Slurm down: nothing is told from half a look; the next cycle looks again
                log.warning("Slurm watch: cannot look: %s", e)
                continue
            except Exception:  # the loop must outlive one bad cycle; the error is logged with its trace
                log.exception("Slurm watch cycle failed")
                continue
            for f in result.findings:
                log.warning("out of band on Slurm: %s", f.get("detail"))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)


def requeues_asked(run: SlurmRun) -> int:
    """The `scontrol requeue`s jobgate made of this Slurm job, and one it asked and has not made yet: the loop
    makes it and counts it in one transaction, and the asking committed first, so a look between the two still
    counts it. Not the preemptions jobgate recorded: Slurm's own partition preemption ends an attempt PREEMPTED,
    never REQUEUED, and counting it hid a person's requeue that came after one."""
    pending = 1 if run.stop_requeue and run.forced_at is None else 0
    return (run.requeues_made or 0) + pending
