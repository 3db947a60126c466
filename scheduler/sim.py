"""Replays a job trace through the *same* run_cycle in virtual time (no wall clock, no I/O).

1. Time advances in ticks of `tick_s`; a cycle runs in a tick only if something happened in it
   (arrival, completion, a victim's stop), so idle stretches cost nothing.
2. A job runs for min(duration, runtime limit); a job past its limit is ended at the limit.
3. Preempted jobs stop after `grace_s`, resume from their checkpoint (remaining work = duration − ran)
   and go back to the queue with their wait carried over plus compensation (P2, Q8). GPU-hours lost
   are counted as the gateway counts them: GPUs × hours the interrupted run had been going.
4. Reported: utilisation, mean and p95 wait per queue and per tenant, completion times, preemptions,
   GPU-hours lost, Jain's fairness index over tenants' GPU-hours divided by their share, and a
   per-tick series of utilisation and queue length for plotting.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from scheduler.cycle import CycleResult, run_cycle
from scheduler.errors import InvalidConfig
from scheduler.model import (
    DEFAULT_CONFIG,
    JobId,
    NodeId,
    NodeState,
    PendingJob,
    Placement,
    ProjectId,
    Quotas,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    TenantQuota,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class TraceJob:
    """One row of a trace: when (seconds after the start), who, where, how big, how long."""

    id: str
    submit_s: float
    tenant: str
    user: str
    queue: str
    gpus_per_node: int
    nodes: int
    duration_s: float
    runtime_limit_s: float | None = None


@dataclass(frozen=True)
class SimCluster:
    nodes: int = 16
    gpus_per_node: int = 8


@dataclass
class _Job:
    t: TraceJob
    remaining_s: float
    first_start: float | None = None
    queued_at: float = 0.0
    wait_credit_s: float = 0.0
    compensation: float = 0.0
    started: float | None = None
    borrowed: bool = False
    priority: float = 0.0
    placement: tuple[tuple[NodeId, tuple[int, ...]], ...] = ()
    end: float | None = None
    stop_by: float | None = None
    preempted: int = 0


@dataclass
class SimReport:
    jobs: int
    finished: int
    makespan_s: float
    utilisation: float
    wait_s: dict[str, dict[str, float]]
    completion_s: dict[str, float]
    preemptions: int
    gpu_hours_lost: float
    jain_fairness: float
    cycles: int
    series: list[tuple[float, float, int]] = field(default_factory=list)  # (t, utilisation, queue length)

    def as_dict(self) -> dict[str, object]:
        return {"jobs": self.jobs, "finished": self.finished, "makespan_h": round(self.makespan_s / 3600, 3),
                "utilisation": round(self.utilisation, 4), "wait_s": self.wait_s,
                "completion_s": self.completion_s, "preemptions": self.preemptions,
                "gpu_hours_lost": round(self.gpu_hours_lost, 3), "jain_fairness": round(self.jain_fairness, 4),
                "cycles": self.cycles}


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "mean": 0.0, "p95": 0.0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return {"n": len(ordered), "mean": round(sum(ordered) / len(ordered), 1), "p95": round(p95, 1)}


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: (Σx)² / (n·Σx²); 1 when all equal, 1/n when one has everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def simulate(trace: Sequence[TraceJob], *, cluster: SimCluster = SimCluster(),
             config: SchedulerConfig = DEFAULT_CONFIG, quotas: Quotas | None = None, tick_s: float = 60.0,
             grace_s: float = 30.0, max_series: int = 2000,
             cycle: Callable[..., CycleResult] = run_cycle) -> SimReport:
    """Run the trace to completion (or until nothing more can ever start). Raises nothing on a valid trace.

    `cycle` is run_cycle; the benchmark passes its naive twin to time the same replay."""
    nodes = [NodeId(f"n{i:05d}") for i in range(cluster.nodes)]
    free: dict[NodeId, set[int]] = {n: set(range(cluster.gpus_per_node)) for n in nodes}
    total_gpus = cluster.nodes * cluster.gpus_per_node
    arrivals = sorted(trace, key=lambda j: (j.submit_s, j.id))
    jobs = {j.id: _Job(t=j, remaining_s=j.duration_s, queued_at=j.submit_s) for j in arrivals}
    pending: dict[str, _Job] = {}
    running: dict[str, _Job] = {}
    ends: list[tuple[float, str]] = []  # completion or stop deadline, lazily invalidated
    used_by_tenant: dict[str, float] = defaultdict(float)
    preemptions = 0
    lost = 0.0
    busy_gpu_s = 0.0
    busy = 0
    cycles = 0
    series: list[tuple[float, float, int]] = []
    i = 0
    t = 0.0
    last_t = 0.0
    finished = 0
    first_submit = arrivals[0].submit_s if arrivals else 0.0

    def release(job: _Job) -> None:
        nonlocal busy
        for node, gpus in job.placement:
            free[node].update(gpus)
            busy -= len(gpus)
        job.placement = ()

    while i < len(arrivals) or pending or running:
        next_arrival = arrivals[i].submit_s if i < len(arrivals) else math.inf
        while ends and (ends[0][1] not in running or _due(running[ends[0][1]]) != ends[0][0]):
            heapq.heappop(ends)  # stale entry
        next_end = ends[0][0] if ends else math.inf
        nxt = min(next_arrival, next_end)
        if nxt == math.inf:
            break  # the rest can never start (too big for the cluster)
        # Advance to the end of the tick containing the next event.
        new_t = max(t, math.floor(nxt / tick_s) * tick_s + tick_s)
        busy_gpu_s += busy * (new_t - last_t)
        last_t = t = new_t
        changed = False
        while i < len(arrivals) and arrivals[i].submit_s <= t:
            job = jobs[arrivals[i].id]
            pending[job.t.id] = job
            i += 1
            changed = True
        while ends and ends[0][0] <= t:
            at, jid = heapq.heappop(ends)
            found = running.get(jid)
            if found is None or _due(found) != at:
                continue
            job = found
            ran = at - (job.started or at)
            gpus = job.t.gpus_per_node * job.t.nodes
            used_by_tenant[job.t.tenant] += gpus * ran / 3600.0
            release(job)
            del running[jid]
            changed = True
            if job.stop_by is not None:  # a preempted victim: back to the queue (rule 3)
                job.remaining_s = max(0.0, job.remaining_s - (job.stop_by - grace_s - (job.started or 0.0)))
                job.wait_credit_s += (job.started or at) - job.queued_at
                job.queued_at = at
                job.compensation += config.preemption_compensation
                job.stop_by = job.started = None
                pending[jid] = job
            else:
                job.end = at
                finished += 1
        if not changed:
            continue
        now = EPOCH + timedelta(seconds=t)
        snap = Snapshot(
            nodes=tuple(NodeState(n, cluster.gpus_per_node, frozenset(free[n])) for n in nodes),
            pending=tuple(PendingJob(JobId(j.t.id), ProjectId(j.t.tenant), j.t.user, j.t.queue, j.t.gpus_per_node,
                                     j.t.nodes, EPOCH + timedelta(seconds=j.queued_at),
                                     runtime_limit_s=j.t.runtime_limit_s, wait_credit_s=j.wait_credit_s,
                                     compensation=j.compensation) for j in pending.values()),
            running=tuple(RunningJob(JobId(j.t.id), ProjectId(j.t.tenant), j.t.user, j.t.queue, j.priority,
                                     EPOCH + timedelta(seconds=j.started or 0.0),
                                     tuple(_placement(j)), j.t.runtime_limit_s, borrowed=j.borrowed,
                                     stop_by=None if j.stop_by is None else EPOCH + timedelta(seconds=j.stop_by))
                          for j in running.values()),
            quotas=quotas, usage={ProjectId(k): v for k, v in used_by_tenant.items()})
        result = cycle(snap, now=now, config=config)
        cycles += 1
        for a in result.admits:
            job = pending.pop(a.job_id)
            job.placement = tuple((p.node, p.gpus) for p in a.placement)
            for node, taken in job.placement:
                free[node].difference_update(taken)
                busy += len(taken)
            job.started = t
            job.first_start = t if job.first_start is None else job.first_start
            job.borrowed, job.priority = a.borrowed, a.priority.total
            running[job.t.id] = job
            heapq.heappush(ends, (_due(job), job.t.id))
        for plan in result.preemptions:
            for v in plan.victims:
                job = running[v.job_id]
                preemptions += 1
                job.preempted += 1
                lost += v.lost_gpu_s / 3600.0
                job.stop_by = t + grace_s
                heapq.heappush(ends, (_due(job), job.t.id))
        if len(series) < max_series or cycles % max(1, cycles // max_series) == 0:
            series.append((t, busy / total_gpus if total_gpus else 0.0, len(pending)))

    waits: dict[str, list[float]] = defaultdict(list)
    completions: list[float] = []
    for job in jobs.values():
        if job.first_start is None:
            continue
        w = job.first_start - job.t.submit_s
        waits[f"queue:{job.t.queue}"].append(w)
        waits[f"tenant:{job.t.tenant}"].append(w)
        waits["all"].append(w)
        if job.end is not None:
            completions.append(job.end - job.t.submit_s)
    share: dict[str, float] = {str(ten): float(q.gpus) for ten, q in (quotas.tenants.items() if quotas else [])}
    tenants = sorted({j.tenant for j in trace})
    normalised = [used_by_tenant[ten] / (share.get(ten) or 1.0) for ten in tenants]
    makespan = t - first_submit
    return SimReport(
        jobs=len(trace), finished=finished, makespan_s=makespan,
        utilisation=busy_gpu_s / (total_gpus * makespan) if makespan > 0 and total_gpus else 0.0,
        wait_s={k: _stats(v) for k, v in sorted(waits.items())}, completion_s=_stats(completions),
        preemptions=preemptions, gpu_hours_lost=lost, jain_fairness=jain(normalised), cycles=cycles,
        series=series)


def _due(job: _Job) -> float:
    """When a running job frees its GPUs: its stop deadline, else start + min(remaining work, limit)."""
    if job.stop_by is not None:
        return job.stop_by
    run = job.remaining_s if job.t.runtime_limit_s is None else min(job.remaining_s, job.t.runtime_limit_s)
    return (job.started or 0.0) + run


def _placement(job: _Job) -> list[Placement]:
    return [Placement(node, gpus) for node, gpus in job.placement]


def quotas_from_mapping(data: Mapping[str, object] | None) -> Quotas | None:
    """{"cluster_gpus": N, "tenants": {t: {gpus, borrow_limit, lend_limit}}, "users": {u: N}} → Quotas."""
    if not data:
        return None
    if not isinstance(data, Mapping):
        raise InvalidConfig("quotas", "must be a mapping")
    tenants_in = data.get("tenants") or {}
    users_in = data.get("users") or {}
    if not isinstance(tenants_in, Mapping) or not isinstance(users_in, Mapping):
        raise InvalidConfig("quotas", "tenants and users must be mappings")
    tenants = {}
    for name, q in tenants_in.items():
        if not isinstance(q, Mapping) or not isinstance(q.get("gpus"), int):
            raise InvalidConfig(f"quotas.tenants.{name}", "needs an integer gpus")
        tenants[ProjectId(str(name))] = TenantQuota(int(q["gpus"]), borrow_limit=q.get("borrow_limit", 0),
                                                    lend_limit=q.get("lend_limit"))
    cluster = data.get("cluster_gpus")
    if cluster is not None and not isinstance(cluster, int):
        raise InvalidConfig("quotas.cluster_gpus", "must be an integer")
    return Quotas(cluster_gpus=cluster, tenants=tenants, users={str(u): int(str(v)) for u, v in users_in.items()})

