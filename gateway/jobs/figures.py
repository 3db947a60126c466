"""/metrics gauges of jobs (Q9, Q11): queue lengths and waits, GPUs per tenant owned or borrowed, preemptions and
stop outcomes, read from the business DB at scrape time (registered at app start, gateway/bootstrap.py)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gateway.jobs import insights
from gateway.metrics import histogram
from gateway.store.models import Job
from gateway.store.scheduler_tables import PreemptionRow
from scheduler.model import QUEUES

STOP_OUTCOMES = {"graceful": "graceful", "forced": "forced", "cancelled": "cancelled", "confirmed": "failed"}


def figures(session: Session, now: datetime) -> Iterator[Metric]:
    """Gauges of the queues, GPUs, preemptions and stops."""
    waits = insights.waits(session, now)
    length = GaugeMetricFamily("jobgate_queue_length", "Jobs waiting per queue", labels=["queue"])
    oldest = GaugeMetricFamily("jobgate_queue_oldest_wait_seconds", "Longest current wait per queue",
                               labels=["queue"])
    for q in QUEUES:
        length.add_metric([q], waits["queues"][q]["waiting_now"])
        oldest.add_metric([q], waits["queues"][q]["oldest_wait_s"] or 0.0)
    yield length
    yield oldest
    started: dict[tuple[str, ...], list[float]] = {(q,): [] for q in QUEUES}
    for queue, submitted, begun in session.execute(select(Job.queue, Job.submitted_at, Job.started_at)
                                                   .where(Job.started_at.is_not(None))).all():
        if begun is not None:  # (the query leaves out jobs that never started)
            started.setdefault((queue,), []).append(max(0.0, (begun - submitted).total_seconds()))
    yield histogram("jobgate_queue_wait_seconds", "Wait from submission to start, per queue", ["queue"],
                    started, insights.WAIT_BUCKETS_S)

    usage = insights.cluster_usage(session)
    gpus = GaugeMetricFamily("jobgate_gpus", "GPUs on alive nodes by use", labels=["state"])
    for state in ("gpus", "in_use", "free"):
        gpus.add_metric(["total" if state == "gpus" else state], usage[state])
    yield gpus
    held = GaugeMetricFamily("jobgate_gpus_in_use", "GPUs held per tenant, owned or borrowed quota",
                             labels=["tenant", "quota"])
    ratio = GaugeMetricFamily("jobgate_gpu_utilisation_ratio",
                              "Share of the cluster's GPUs held per tenant, owned or borrowed",
                              labels=["tenant", "quota"])
    for t in usage["tenants"]:
        for kind in ("owned", "borrowed"):
            held.add_metric([t["tenant"], kind], t[kind])
            ratio.add_metric([t["tenant"], kind], t[kind] / usage["gpus"] if usage["gpus"] else 0.0)
    yield held
    yield ratio

    pre = CounterMetricFamily("jobgate_preemptions", "Preemptions per tenant and kind",
                              labels=["tenant", "kind"])
    lost = CounterMetricFamily("jobgate_preemption_gpu_hours_lost", "GPU-hours lost to preemption",
                               labels=["tenant"])
    lost_by: dict[str, float] = {}
    for project, kind, n, hours in session.execute(
            select(PreemptionRow.project, PreemptionRow.kind, func.count(),
                   func.coalesce(func.sum(PreemptionRow.gpu_hours_lost), 0.0))
            .group_by(PreemptionRow.project, PreemptionRow.kind)).all():
        pre.add_metric([project, kind], n)
        lost_by[project] = lost_by.get(project, 0.0) + float(hours)
    for project, hours in sorted(lost_by.items()):
        lost.add_metric([project], hours)
    yield pre
    yield lost

    tally: Tally[str] = Tally(dict.fromkeys(("graceful", "forced", "failed", "cancelled"), 0))
    for outcome, state in session.execute(
            select(Job.outcome, Job.state).where(or_(Job.outcome.in_(tuple(STOP_OUTCOMES)),
                                                     Job.state == "stop_failed"))).all():
        # A stop that failed and was later confirmed by a person still counts as failed.
        tally["failed" if state == "stop_failed" else STOP_OUTCOMES[str(outcome)]] += 1
    stops = CounterMetricFamily("jobgate_stop_outcomes", "Stops by outcome (cancelled: was still queued)",
                                labels=["outcome"])
    for outcome, n in sorted(tally.items()):
        stops.add_metric([outcome], n)
    yield stops

