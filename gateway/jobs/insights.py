"""Read-only views of the cluster for admins (Q10, Q11), shared by the console, /v1/stats/* and /metrics.

Everything is computed from the business DB at read time: quota utilisation per tenant and day (the heat
map), wait times per queue, fragmentation of free GPUs, and suggestions (idle quota, stale reservations,
starved tenants). Nothing here changes state.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.jobs.quotas import alive_capacity, usage_by_tenant
from gateway.store.models import Allocation, Job, Node, Project
from gateway.store.scheduler_tables import PastRun, QuotaRow, SchedJob
from scheduler.model import QUEUES

RUNNING_STATES = ("starting", "running", "stop_requested", "stopping")
WAIT_BUCKETS_S = (60.0, 600.0, 3600.0, 6 * 3600.0, 24 * 3600.0)
STALE_AFTER = timedelta(minutes=10)
STARVED_AFTER = timedelta(minutes=30)
IDLE_SHARE = 0.25


def _label(bound: float) -> str:
    if bound < 3600:
        return f"≤{int(bound // 60)}m"
    return f"≤{int(bound // 3600)}h"


WAIT_BUCKET_LABELS = (*(_label(b) for b in WAIT_BUCKETS_S), f">{_label(WAIT_BUCKETS_S[-1])[1:]}")


def cluster_usage(session: Session, projects: set[str] | None = None) -> dict[str, Any]:
    """GPUs in all (alive nodes), in use, free, and per tenant owned/borrowed with its quota."""
    by_tenant = usage_by_tenant(session)
    quotas = {q.project: q.gpus for q in session.scalars(select(QuotaRow)).all()}
    tenants = sorted((set(by_tenant) | set(quotas) | set(session.scalars(select(Project.id)).all())) - {"*"})
    rows = [{"tenant": t, "quota_gpus": quotas.get(t), **by_tenant.get(t, {"owned": 0, "borrowed": 0})}
            for t in tenants if projects is None or t in projects]
    return {**alive_capacity(session), "tenants": rows}


def _overlap_hours(start: datetime, end: datetime, lo: datetime, hi: datetime) -> float:
    s, e = max(start, lo), min(end, hi)
    return max(0.0, (e - s).total_seconds() / 3600.0)


def _runs(session: Session, since: datetime, projects: set[str] | None) -> list[tuple[str, int, datetime,
                                                                                 datetime | None]]:
    """(project, GPUs, started, ended or None) of every run that held GPUs at some point since `since`: jobs'
    current runs and the runs before a requeue (a preempted or resumed job's row holds only its current one)."""
    rows: list[Any] = list(session.execute(select(Job.project, Job.gpus_per_node * Job.nodes, Job.started_at,
                                                  Job.ended_at)
                                           .where(Job.started_at.is_not(None))
                                           .where((Job.ended_at.is_(None)) | (Job.ended_at >= since))).all())
    rows += session.execute(select(PastRun.project, PastRun.gpus, PastRun.started_at, PastRun.ended_at)
                            .where(PastRun.ended_at >= since)).all()
    return [(p, g, s, e) for p, g, s, e in rows if s is not None and (projects is None or p in projects)]


def heatmap(session: Session, now: datetime, days: int = 7, projects: set[str] | None = None) -> dict[str, Any]:
    """Quota utilisation per tenant and UTC day: GPU-hours used ÷ (quota GPUs × 24 h).

    A tenant without a quota is measured against the whole cluster. Today counts up to now.
    """
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    day_starts = [today - timedelta(days=i) for i in range(days - 1, -1, -1)]
    first = day_starts[0]
    total = sum(session.scalars(select(Node.gpus).where(Node.gpus > 0)).all()) or 1
    quotas = {q.project: q.gpus for q in session.scalars(select(QuotaRow)).all()}
    used: dict[str, list[float]] = defaultdict(lambda: [0.0] * days)
    for project, gpus, started, ended in _runs(session, first, projects):
        for i, lo in enumerate(day_starts):
            hi = min(lo + timedelta(days=1), now)
            used[project][i] += gpus * _overlap_hours(started, ended or now, lo, hi)
    tenants = sorted((set(used) | set(quotas) | set(session.scalars(select(Project.id)).all())) - {"*"})
    out_rows = []
    for t in tenants:
        if projects is not None and t not in projects:
            continue
        cap = quotas.get(t) or total
        cells = []
        for i, lo in enumerate(day_starts):
            hours = min(24.0, (now - lo).total_seconds() / 3600.0)
            gh = used[t][i] if t in used else 0.0
            cells.append({"day": lo.date().isoformat(), "gpu_hours": round(gh, 3),
                          "utilisation": round(gh / (cap * hours), 4) if hours > 0 else 0.0})
        out_rows.append({"tenant": t, "quota_gpus": quotas.get(t), "measured_against": cap, "cells": cells})
    return {"days": [d.date().isoformat() for d in day_starts], "rows": out_rows}


def usage_over_time(session: Session, now: datetime, hours: int = 24,
                    projects: set[str] | None = None) -> dict[str, Any]:
    """GPUs in use per tenant in each of the last `hours` UTC hours, the current one up to now: the average over
    the hour (GPU-hours used in it ÷ its length), beside the GPUs of all nodes."""
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    starts = [this_hour - timedelta(hours=i) for i in range(hours - 1, -1, -1)]
    used: dict[str, list[float]] = defaultdict(lambda: [0.0] * hours)
    for project, gpus, started, ended in _runs(session, starts[0], projects):
        for i, lo in enumerate(starts):
            hi = min(lo + timedelta(hours=1), now)
            used[project][i] += gpus * _overlap_hours(started, ended or now, lo, hi)
    lengths = [max(1e-9, (min(lo + timedelta(hours=1), now) - lo).total_seconds() / 3600.0) for lo in starts]
    total = sum(session.scalars(select(Node.gpus).where(Node.gpus > 0)).all())
    return {"hours": [lo.isoformat() for lo in starts], "gpus": total,
            "tenants": [{"tenant": t, "gpus_in_use": [round(v / lengths[i], 3) for i, v in enumerate(used[t])]}
                        for t in sorted(used)]}


def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p * (len(ordered) - 1))))
    return round(ordered[k], 3)


def waits(session: Session, now: datetime, projects: set[str] | None = None) -> dict[str, Any]:
    """Per queue: the wait before every start (from entering the queue, or re-entering it after a preemption or a
    resume, to starting), as bucket counts and percentiles, and the jobs waiting now with the oldest wait (in
    the queue since they last entered it)."""
    started: dict[str, list[float]] = defaultdict(list)
    waiting: dict[str, list[float]] = defaultdict(list)
    for queue, project, submitted, entered, begun, state in session.execute(
            select(Job.queue, Job.project, Job.submitted_at, SchedJob.queued_at, Job.started_at, Job.state)
            .outerjoin(SchedJob, SchedJob.job_id == Job.id)).all():
        if projects is not None and project not in projects:
            continue
        entered = entered or submitted
        if begun is not None:
            started[queue].append(max(0.0, (begun - entered).total_seconds()))
        elif state == "pending":
            waiting[queue].append(max(0.0, (now - entered).total_seconds()))
    for queue, project, waited in session.execute(select(PastRun.queue, PastRun.project, PastRun.waited_s)).all():
        if projects is None or project in projects:
            started[queue].append(max(0.0, waited))
    out = {}
    for q in QUEUES:
        values = started[q]
        buckets = [0] * (len(WAIT_BUCKETS_S) + 1)
        for v in values:
            buckets[next((i for i, b in enumerate(WAIT_BUCKETS_S) if v <= b), len(WAIT_BUCKETS_S))] += 1
        out[q] = {"started": len(values), "p50_s": _percentile(values, 0.5), "p90_s": _percentile(values, 0.9),
                  "max_s": round(max(values), 3) if values else None,
                  "buckets": dict(zip(WAIT_BUCKET_LABELS, buckets, strict=True)),
                  "waiting_now": len(waiting[q]),
                  "oldest_wait_s": round(max(waiting[q]), 3) if waiting[q] else None}
    return {"queues": out, "bucket_labels": list(WAIT_BUCKET_LABELS)}


def fragmentation(session: Session) -> dict[str, Any]:
    """Free GPUs per alive node and how scattered they are: 1 − largest free block ÷ all free GPUs
    (0: all free GPUs on one node; near 1: one GPU here and there, no gang fits)."""
    used: dict[str, int] = defaultdict(int)
    for node, gpus in session.execute(select(Allocation.node, Allocation.gpus)
                                      .where(Allocation.released.is_(False))).all():
        used[node] += len(gpus)
    nodes: list[dict[str, Any]] = [{"node": n.id, "state": n.state, "gpus": n.gpus, "used": used[n.id],
              "free": max(0, n.gpus - used[n.id]) if n.state == "alive" else 0}
             for n in session.scalars(select(Node).order_by(Node.id)).all()]
    free: list[int] = [n["free"] for n in nodes]
    total_free = sum(free)
    largest = max(free, default=0)
    return {"nodes": nodes, "free_gpus": total_free, "largest_free_block": largest,
            "nodes_with_free_gpus": sum(1 for f in free if f),
            "fragmentation": round(1 - largest / total_free, 4) if total_free else 0.0}


def suggestions(session: Session, now: datetime, projects: set[str] | None = None) -> list[dict[str, Any]]:
    """Adjustments worth a look (Q11): idle quota, stale reservations (estimated start long past),
    starved tenants (waiting work, nothing running)."""
    out: list[dict[str, Any]] = []
    usage = usage_by_tenant(session)
    # Plain columns only: whole job rows would decode every JSON column of every waiting job.
    waiting = session.execute(select(Job.id, Job.project, Job.submitted_at, SchedJob.estimated_start,
                                     SchedJob.blocked_reason)
                              .join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
                              .where(Job.state == "pending")).all()
    pending: dict[str, list[datetime]] = defaultdict(list)
    for _, project, submitted, _, _ in waiting:
        pending[project].append(submitted)
    for q in session.scalars(select(QuotaRow).order_by(QuotaRow.project)).all():
        if q.project == "*" or q.gpus <= 0 or (projects is not None and q.project not in projects):
            continue
        owned = usage.get(q.project, {}).get("owned", 0)
        if owned < IDLE_SHARE * q.gpus and not pending.get(q.project):
            out.append({"kind": "idle_quota", "tenant": q.project,
                        "text": f"{q.project} uses {owned} of the {q.gpus} GPUs it owns and has nothing waiting:"
                                " lend more of it (lend_limit) or lower its quota"})
    for job_id, project, _, estimated, blocked in sorted(waiting, key=lambda r: r[0]):
        if projects is not None and project not in projects:
            continue
        if estimated is not None and estimated < now - STALE_AFTER:
            out.append({"kind": "stale_reservation", "tenant": project, "job_id": job_id,
                        "text": f"{job_id} was expected to start at {estimated.isoformat()} and still waits"
                                f" ({blocked or 'no reason recorded'}): check the jobs it waits behind and"
                                " their runtime limits"})
    for tenant, times in sorted(pending.items()):
        if projects is not None and tenant not in projects:
            continue
        running = usage.get(tenant, {"owned": 0, "borrowed": 0})
        oldest = min(times)
        if running["owned"] + running["borrowed"] == 0 and now - oldest > STARVED_AFTER:
            out.append({"kind": "starved_tenant", "tenant": tenant,
                        "text": f"{tenant} has {len(times)} job(s) waiting, the oldest for"
                                f" {int((now - oldest).total_seconds() // 60)} min, and nothing running:"
                                " raise its quota or check what blocks its head job"})
    return out
