"""Q10 estimated start times: simulate the queue forward with declared runtime limits (Slurm's `--start`).

1. Running jobs free their GPUs at their stop deadline, or started_at + runtime limit, or — without a
   limit — started_at + config.default_runtime_s (never before now).
2. Waiting jobs are taken in the cycle's order (effective priority) and each starts at the first
   simulated time its gang fits, no earlier than the job before it (no backfill in the estimate, so it
   errs late rather than early); it then holds its GPUs for its limit (or the default).
3. A job that can never fit the alive nodes gets None.
4. A job whose start the cycle already knows (Blocked.expected_start: a preemption made for it, or one that
   becomes possible once its victims pass their minimum runtime) starts at the earlier of that and rule 2's
   time; when the preemption is earlier it takes its victims' GPUs, which rule 2 does not model, so it takes
   none of the simulated ones.
5. Quotas are not modelled by rules 1-4, so a caller leaves out of `order` the jobs a quota holds back this
   cycle (Blocked.quota_tier) and asks `quota_starts` for them: each starts no earlier than the first time
   running jobs' ends bring its quota tiers back within their limits (as run_cycle's rule 5 checks them),
   nor before its gang fits the GPUs then free. That errs early: the jobs ahead of it are not counted.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from scheduler.cycle import Admit
from scheduler.model import (
    DEFAULT_CONFIG,
    JobId,
    NodeState,
    PendingJob,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)
from scheduler.occupancy import frees_at
from scheduler.quota import QuotaTimeline, Steps, usage_of


def after_admits(snapshot: Snapshot, admits: Sequence[Admit], *, now: datetime) -> Snapshot:
    """The snapshot as a cycle leaves it: each admitted job holds its GPUs from `now` for its runtime limit.

    Estimates made after a cycle must start from this, not from the snapshot the cycle decided on: there the
    GPUs it just gave away are still free, and a job waiting behind them would be told it starts now.
    Raises nothing (admits come from run_cycle on this snapshot).
    """
    if not admits:
        return snapshot
    pending = {j.id: j for j in snapshot.pending}
    taken: dict[str, set[int]] = defaultdict(set)
    started: list[RunningJob] = []
    for a in admits:
        job = pending.pop(a.job_id)
        for p in a.placement:
            taken[p.node].update(p.gpus)
        started.append(RunningJob(id=job.id, project=job.project, user=job.user, queue=job.queue,
                                  priority=a.priority.total, started_at=now, placement=a.placement,
                                  runtime_limit_s=job.runtime_limit_s, borrowed=a.borrowed))
    nodes = tuple(replace(n, free=n.free - taken[n.id]) if n.id in taken else n for n in snapshot.nodes)
    return replace(snapshot, nodes=nodes, pending=tuple(pending.values()), running=(*snapshot.running, *started))


def estimate_starts(snapshot: Snapshot, order: Sequence[PendingJob], *, now: datetime,
                    config: SchedulerConfig = DEFAULT_CONFIG,
                    known: Mapping[JobId, datetime] | None = None) -> dict[JobId, datetime | None]:
    """Expected start of every job in `order` (the cycle's priority order); `known`: rule 4's starts the cycle
    knows. Raises nothing."""
    known = known or {}
    # A degraded node takes no work (model.NodeState.degraded): no start is estimated on it.
    alive = sorted((n for n in snapshot.nodes if n.schedulable), key=lambda n: n.id)
    rank = {n.id: r for r, n in enumerate(alive)}
    top = max((n.gpus for n in alive), default=0)
    free = [len(n.free) for n in alive]
    buckets: list[list[int]] = [[] for _ in range(top + 1)]
    for r, f in enumerate(free):
        buckets[f].append(r)
    size_count = [0] * (top + 2)
    for node in alive:
        size_count[node.gpus] += 1
    heap: list[tuple[float, int, int]] = []  # (seconds from now, rank, gpus)
    for held in snapshot.running:
        at = max(0.0, (frees_at(held, config).at - now).total_seconds())
        for p in held.placement:
            node_rank = rank.get(p.node)
            if node_rank is not None:
                heap.append((at, node_rank, len(p.gpus)))
    heapq.heapify(heap)

    def move(r: int, delta: int) -> None:
        bucket = buckets[free[r]]
        bucket.remove(r)
        free[r] += delta
        insort(buckets[free[r]], r)

    def fitting(g: int) -> int:
        return sum(len(b) for b in buckets[g:])

    out: dict[JobId, datetime | None] = {}
    t = 0.0
    for job in order:
        g, need = job.gpus_per_node, job.nodes
        sure = known.get(job.id)
        if sure is not None and sure <= now + timedelta(seconds=t):
            out[job.id] = max(now, sure)  # rule 4: its victims' GPUs, none of the simulated ones
            continue
        if g > top or sum(size_count[g:]) < need:
            out[job.id] = sure
            continue
        while fitting(g) < need and heap:
            at, r, gpus = heapq.heappop(heap)
            t = max(t, at)
            move(r, gpus)
            # Everything released at the same instant counts together.
            while heap and heap[0][0] <= t:
                _, r2, gpus2 = heapq.heappop(heap)
                move(r2, gpus2)
        if fitting(g) < need:
            out[job.id] = sure
            continue
        if sure is not None and sure < now + timedelta(seconds=t):
            out[job.id] = max(now, sure)
            continue
        out[job.id] = now + timedelta(seconds=t)
        chosen: list[int] = []
        for k in range(g, top + 1):
            for r in buckets[k]:
                chosen.append(r)
                if len(chosen) == need:
                    break
            if len(chosen) == need:
                break
        ends = t + (job.runtime_limit_s or config.default_runtime_s)
        for r in chosen:
            move(r, -g)
            heapq.heappush(heap, (ends, r, g))
    return out


@dataclass(frozen=True)
class QuotaWait:
    """Rule 5 of the estimate for a job a quota holds back: when its tiers allow it as running jobs end (None:
    no end of a running job does), the jobs whose end at that instant does it, and when its gang then fits the
    GPUs free (None: never on the schedulable nodes)."""

    allowed_at: datetime | None
    ending: tuple[JobId, ...] = ()  # the first few, in id order
    start: datetime | None = None
    ending_count: int = 0  # how many end then in all


NAMED = 3  # ending jobs a QuotaWait names


def quota_starts(snapshot: Snapshot, jobs: Sequence[PendingJob], *, now: datetime,
                 config: SchedulerConfig = DEFAULT_CONFIG) -> dict[JobId, QuotaWait]:
    """Rule 5 for each of `jobs` (waiting jobs a quota holds back) on `snapshot` (as after_admits leaves it).
    The running jobs' ends are replayed once (QuotaTimeline, and the free GPUs per node); each job is then a few
    bisections. Raises nothing."""
    nodes = sorted((n for n in snapshot.nodes if n.schedulable), key=lambda n: n.id)
    sizes = sorted(n.gpus for n in nodes)
    usage = usage_of(snapshot, lambda j: bisect_right(sizes, j.gpus_per_node - 1) <= len(sizes) - j.nodes)
    if usage is None:
        return {job.id: QuotaWait(None) for job in jobs}
    grouped: dict[datetime, list[RunningJob]] = defaultdict(list)
    for r in snapshot.running:
        grouped[max(now, frees_at(r, config).at)].append(r)
    times = sorted(grouped)
    ends = [sorted(grouped[t], key=lambda r: r.id) for t in times]
    timeline = QuotaTimeline(usage, ends)
    fits = _FitTimeline(nodes, ends)
    out: dict[JobId, QuotaWait] = {}
    for job in jobs:
        step = timeline.first_step(job.project, job.user, job.gpus, may_borrow=job.stoppable)
        if step is None:
            out[job.id] = QuotaWait(None)
            continue
        allowed = now if step == 0 else times[step - 1]
        ending = () if step == 0 else tuple(r.id for r in ends[step - 1][:NAMED])
        fit = fits.first_step(job.gpus_per_node, job.nodes, step)
        out[job.id] = QuotaWait(allowed, ending, None if fit is None else now if fit == 0 else times[fit - 1],
                                0 if step == 0 else len(ends[step - 1]))
    return out


class _FitTimeline:
    """Per GPU count g, how many schedulable nodes have at least g free, step by step as running jobs end (the
    steps of QuotaTimeline)."""

    def __init__(self, nodes: Sequence[NodeState], ends: Sequence[Sequence[RunningJob]]) -> None:
        free = {n.id: len(n.free) for n in nodes}
        self.top = max((n.gpus for n in nodes), default=0)
        self.fitting = [Steps(sum(1 for f in free.values() if f >= g)) for g in range(self.top + 1)]
        counts = [s.values[0] for s in self.fitting]
        for step, jobs in enumerate(ends, start=1):
            for job in jobs:
                for p in job.placement:
                    before = free.get(p.node)
                    if before is None:  # a degraded or lost node frees nothing usable
                        continue
                    free[p.node] = before + len(p.gpus)
                    for g in range(before + 1, min(free[p.node], self.top) + 1):
                        counts[g] += 1
            for g in range(self.top + 1):
                self.fitting[g].set(step, counts[g])

    def first_step(self, gpus: int, nodes: int, since: int) -> int | None:
        if gpus > self.top:
            return None
        first = self.fitting[gpus].first_at_least(nodes)
        return None if first is None else max(first, since)
