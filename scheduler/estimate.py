"""Q10 estimated start times: simulate the queue forward with declared runtime limits (Slurm's `--start`).

1. Running jobs free their GPUs at their stop deadline, or started_at + runtime limit, or — without a
   limit — started_at + config.default_runtime_s (never before now).
2. Waiting jobs are taken in the cycle's order (effective priority) and each starts at the first
   simulated time its gang fits, no earlier than the job before it (no backfill in the estimate, so it
   errs late rather than early); it then holds its GPUs for its limit (or the default).
3. A job that can never fit the alive nodes gets None. Quotas are not modelled: the estimate says when
   GPUs are there, not when the tenant's quota allows it, so a caller leaves out of `order` the jobs a quota
   holds back this cycle (Blocked.quota_tier): they hold no GPUs, and their start is unknown.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from scheduler.cycle import Admit
from scheduler.model import DEFAULT_CONFIG, JobId, PendingJob, RunningJob, SchedulerConfig, Snapshot


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
                    config: SchedulerConfig = DEFAULT_CONFIG) -> dict[JobId, datetime | None]:
    """Expected start of every job in `order` (the cycle's priority order). Raises nothing."""
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
        if held.stop_by is not None:
            end = held.stop_by
        else:
            end = held.started_at + timedelta(seconds=held.runtime_limit_s or config.default_runtime_s)
        at = max(0.0, (end - now).total_seconds())
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
        if g > top or sum(size_count[g:]) < need:
            out[job.id] = None
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
            out[job.id] = None
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
