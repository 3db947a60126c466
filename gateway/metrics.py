"""Prometheus metrics, all prefixed `jobgate_`, served at /metrics.

Two kinds. Counters and histograms of things as they happen live in the process-wide REGISTRY and are
incremented where they happen (decisions in the pipeline, break-glass use, ...). Gauges of state —
approvals pending, queue lengths and waits, GPUs per tenant owned/borrowed, preemptions, stop outcomes,
ledger batch sizes — are read from the business DB and the ledger at scrape time by `StateCollector`, so
they are right after a restart and on every replica. The rooms that own those figures register them at app
start (gateway/bootstrap.py): this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from ledger.service import Ledger

REGISTRY = CollectorRegistry()

DECISIONS = Counter("jobgate_decisions_total", "Decisions by action and effect", ["action", "effect"],
                    registry=REGISTRY)
DECISION_SECONDS = Histogram("jobgate_decision_seconds", "Time to decide one request (policy evaluation)",
                             registry=REGISTRY, buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1))
LEDGER_APPEND_SECONDS = Histogram("jobgate_ledger_append_seconds", "Time until a ledger append is durable",
                                  registry=REGISTRY,
                                  buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
SCHEDULER_CYCLE_SECONDS = Histogram(
    "jobgate_scheduler_cycle_seconds", "Time one scheduling cycle took (the leader's; it grows with the queue)",
    registry=REGISTRY, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
SCHEDULER_PLANS = Counter(
    "jobgate_scheduler_plans_total", "SQLite scheduling cycles' plans by where they were made: process (the planner"
    " process) or gateway (its planner process had died, hung or could not start)", ["made_in"], registry=REGISTRY)
BREAK_GLASS_USES = Counter("jobgate_break_glass_uses_total", "Calls made with a break-glass grant (F3 alert)",
                           ["holder"], registry=REGISTRY)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

router = APIRouter(tags=["health"])


def histogram(name: str, doc: str, labels: list[str], series: dict[tuple[str, ...], list[float]],
               buckets: tuple[float, ...]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for key, values in sorted(series.items()):
        cumulative = [(str(b), float(sum(1 for v in values if v <= b))) for b in buckets]
        fam.add_metric(list(key), [*cumulative, ("+Inf", float(len(values)))], sum_value=float(sum(values)))
    return fam


Figures = Callable[[Session, datetime], Iterable[Metric]]  # one room's gauges, read from the business DB


class Scraped(Protocol):
    """What a scrape reads: the figures registered at app start, the ledger, the clock and a transaction."""

    ledger: Ledger
    figures: list[Figures]

    @property
    def clock(self) -> Callable[[], datetime]: ...

    def transaction(self, *, immediate: bool = True) -> AbstractContextManager[Session]: ...


class StateCollector(Collector):
    """Gauges computed from the gateway's stores when Prometheus scrapes: the figures each room registered at app
    start (gateway/bootstrap.py), read in one transaction, then the ledger's own."""

    def __init__(self, gw: Scraped, sessions: int | None = None) -> None:
        self.gw = gw
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        now = self.gw.clock()
        with self.gw.transaction(immediate=False) as session:
            for figures in self.gw.figures:
                yield from figures(session, now)

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
