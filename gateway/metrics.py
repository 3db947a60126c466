"""Prometheus metrics, all prefixed `jobgate_`, served at /metrics.

One registry per process; counters are incremented where things happen (decisions in the pipeline,
break-glass use in auth, ...).
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

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

router = APIRouter(tags=["health"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
