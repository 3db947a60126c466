"""Prometheus metrics, all prefixed `jobgate_`, served at /metrics.

Two kinds. Counters and histograms of things as they happen live in the process-wide REGISTRY and are
incremented where they happen (decisions in the pipeline, break-glass use, ...). Gauges of state —
approvals pending, queue lengths and waits, GPUs per tenant owned/borrowed, preemptions, stop outcomes,
ledger batch sizes — are read from the business DB and the ledger at scrape time by `StateCollector`, so
they are right after a restart and on every replica.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, or_, select

REGISTRY = CollectorRegistry()

DECISIONS = Counter("jobgate_decisions_total", "Decisions by action and effect", ["action", "effect"],
                    registry=REGISTRY)
DECISION_SECONDS = Histogram("jobgate_decision_seconds", "Time to decide one request (policy evaluation)",
                             registry=REGISTRY, buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1))
LEDGER_APPEND_SECONDS = Histogram("jobgate_ledger_append_seconds", "Time until a ledger append is durable",
                                  registry=REGISTRY,
                                  buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
BREAK_GLASS_USES = Counter("jobgate_break_glass_uses_total", "Calls made with a break-glass grant (F3 alert)",
                           ["holder"], registry=REGISTRY)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STOP_OUTCOMES = {"graceful": "graceful", "forced": "forced", "cancelled": "cancelled", "confirmed": "failed"}

router = APIRouter(tags=["health"])


def _histogram(name: str, doc: str, labels: list[str], series: dict[tuple[str, ...], list[float]],
               buckets: tuple[float, ...]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for key, values in sorted(series.items()):
        cumulative = [(str(b), float(sum(1 for v in values if v <= b))) for b in buckets]
        fam.add_metric(list(key), [*cumulative, ("+Inf", float(len(values)))], sum_value=float(sum(values)))
    return fam


class StateCollector(Collector):
    """Gauges computed from the gateway's stores when Prometheus scrapes."""

    def __init__(self, gw: Any, sessions: int | None = None) -> None:
        self.gw = gw
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        # Late imports: these modules import this one (counters), and the tables import the world.
        from gateway.console import insights
        from gateway.store.models import Job
        from gateway.store.scheduler_tables import PreemptionRow
        from gateway.store.service_tables import Approval
        from scheduler.model import QUEUES

        now = self.gw.clock()
        with self.gw.transaction(immediate=False) as session:
            pending = GaugeMetricFamily("jobgate_approvals_pending", "Approval requests waiting for a second person",
                                        labels=["action"])
            for action, n in session.execute(select(Approval.action, func.count()).where(Approval.state == "pending")
                                             .group_by(Approval.action)).all():
                pending.add_metric([action], n)
            yield pending

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
                started.setdefault((queue,), []).append(max(0.0, (begun - submitted).total_seconds()))
            yield _histogram("jobgate_queue_wait_seconds", "Wait from submission to start, per queue", ["queue"],
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
                tally["failed" if state == "stop_failed" else STOP_OUTCOMES[outcome]] += 1
            stops = CounterMetricFamily("jobgate_stop_outcomes", "Stops by outcome (cancelled: was still queued)",
                                        labels=["outcome"])
            for outcome, n in sorted(tally.items()):
                stops.add_metric([outcome], n)
            yield stops

        sizes = dict(self.gw.ledger.stats.batch_sizes)  # size → number of commits of that size
        batch = HistogramMetricFamily("jobgate_ledger_batch_size", "Entries per ledger group commit")
        batch.add_metric([], [*((str(b), float(sum(n for k, n in sizes.items() if k <= b))) for b in BATCH_BUCKETS),
                              ("+Inf", float(sum(sizes.values())))],
                         sum_value=float(sum(k * n for k, n in sizes.items())))
        yield batch
        entries = GaugeMetricFamily("jobgate_ledger_entries", "Durable ledger entries")
        entries.add_metric([], self.gw.ledger.size())
        yield entries
        if self.sessions is not None:
            sess = GaugeMetricFamily("jobgate_console_sessions", "Signed-in console sessions")
            sess.add_metric([], self.sessions)
            yield sess


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    """Counters and histograms since start, and state gauges read from the stores now."""
    gw = getattr(request.app.state, "gateway", None)
    body = generate_latest(REGISTRY)
    if gw is not None:
        scrape = CollectorRegistry(auto_describe=False)
        console = getattr(request.app.state, "console_sessions", None)
        scrape.register(StateCollector(gw, len(console) if console is not None else 0))
        body += generate_latest(scrape)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
