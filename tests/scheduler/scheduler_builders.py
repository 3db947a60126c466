"""Builders for scheduler snapshots: `job("a").gpus(8).nodes(2).queue("urgent")`, `node("n1", busy=(0, 1))`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from scheduler.cycle import CycleResult
from scheduler.model import (
    JobId,
    NodeId,
    NodeState,
    PendingJob,
    Placement,
    ProjectId,
    Quotas,
    RunningJob,
    Snapshot,
)

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
HOUR = 3600.0


def at(hours: float = 0.0, minutes: float = 0.0) -> datetime:
    """A time relative to NOW: at(-2) is two hours ago."""
    return NOW + timedelta(hours=hours, minutes=minutes)


class JobBuilder:
    def __init__(self, job_id: str, project: str = "vision", user: str = "ada") -> None:
        self._id = JobId(job_id)
        self._project = ProjectId(project)
        self._user = user
        self._queue = "normal"
        self._gpus = 1
        self._nodes = 1
        self._submitted = NOW
        self._priority = 0.0
        self._limit: float | None = None
        self._credit = 0.0
        self._compensation = 0.0
        self._stoppable = True
        self._needs_isolation = False

    def gpus(self, n: int) -> JobBuilder:
        self._gpus = n
        return self

    def nodes(self, n: int) -> JobBuilder:
        self._nodes = n
        return self

    def queue(self, q: str) -> JobBuilder:
        self._queue = q
        return self

    def waited(self, hours: float) -> JobBuilder:
        self._submitted = NOW - timedelta(hours=hours)
        return self

    def submitted(self, t: datetime) -> JobBuilder:
        self._submitted = t
        return self

    def priority(self, p: float) -> JobBuilder:
        self._priority = p
        return self

    def limit(self, hours: float) -> JobBuilder:
        self._limit = hours * HOUR
        return self

    def not_stoppable(self) -> JobBuilder:
        """Declared not stoppable from here (R5)."""
        self._stoppable = False
        return self

    def isolated_only(self) -> JobBuilder:
        """May run only on nodes that isolate jobs (H1; e.g. an external-rights job)."""
        self._needs_isolation = True
        return self

    def requeued(self, waited_before_h: float, compensation: float) -> JobBuilder:
        """A job back in the queue after a preemption: earlier wait carried over, plus compensation."""
        self._credit = waited_before_h * HOUR
        self._compensation = compensation
        return self

    def build(self) -> PendingJob:
        return PendingJob(id=self._id, project=self._project, user=self._user, queue=self._queue,
                          gpus_per_node=self._gpus, nodes=self._nodes, submitted_at=self._submitted,
                          base_priority=self._priority, runtime_limit_s=self._limit,
                          wait_credit_s=self._credit, compensation=self._compensation, stoppable=self._stoppable,
                          needs_isolation=self._needs_isolation)


def job(job_id: str, project: str = "vision", user: str = "ada") -> JobBuilder:
    return JobBuilder(job_id, project, user)


def node(node_id: str, gpus: int = 8, *, busy: Iterable[int] = (), alive: bool = True,
         degraded: bool = False, isolated: bool = True) -> NodeState:
    """A node with every GPU free except `busy` (snap() also removes GPUs of running jobs)."""
    return NodeState(id=NodeId(node_id), gpus=gpus, free=frozenset(range(gpus)) - frozenset(busy), alive=alive,
                     degraded=degraded, isolated=isolated)


def running(job_id: str, on: dict[str, Iterable[int]], *, started: datetime = NOW,
            limit_h: float | None = None, queue: str = "normal", project: str = "vision", user: str = "ada",
            priority: float = 0.0, borrowed: bool = False, stop_by: datetime | None = None,
            stoppable: bool = True, grace_s: float = 0.0) -> RunningJob:
    return RunningJob(id=JobId(job_id), project=ProjectId(project), user=user, queue=queue, priority=priority,
                      started_at=started,
                      placement=tuple(Placement(NodeId(n), tuple(g)) for n, g in on.items()),
                      runtime_limit_s=None if limit_h is None else limit_h * HOUR, borrowed=borrowed,
                      stop_by=stop_by, stoppable=stoppable, grace_s=grace_s)


def snap(nodes: Iterable[NodeState], pending: Iterable[JobBuilder | PendingJob] = (),
         run: Iterable[RunningJob] = (), quotas: Quotas | None = None) -> Snapshot:
    """A consistent snapshot: GPUs of running jobs are taken out of their nodes' free sets."""
    run = tuple(run)
    used: dict[str, set[int]] = defaultdict(set)
    for r in run:
        for p in r.placement:
            used[p.node].update(p.gpus)
    return Snapshot(
        nodes=tuple(replace(n, free=n.free - used[n.id]) for n in nodes),
        pending=tuple(j.build() if isinstance(j, JobBuilder) else j for j in pending),
        running=run,
        quotas=quotas,
    )


def admitted(result: CycleResult) -> dict[str, dict[str, tuple[int, ...]]]:
    """{job: {node: gpus}} of a cycle's admits, for compact assertions."""
    return {a.job_id: {p.node: p.gpus for p in a.placement} for a in result.admits}


def reasons(result: CycleResult) -> dict[str, str]:
    return {b.job_id: b.reason for b in result.blocked}
