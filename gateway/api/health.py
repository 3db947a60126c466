"""/healthz (the process lives) and /readyz (this replica can decide and record now, and which replica leads).

A load balancer sends traffic by /readyz: /healthz said `ok` while every mutation was refused (a full disk, a
business database gone), so the balancer kept sending requests to a replica that could change nothing."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.errors import problem
from gateway.leadership import READY_PROBE
from gateway.store.models import Meta

router = APIRouter(tags=["health"])
log = logging.getLogger("jobgate.health")



@router.get("/healthz", summary="Liveness")
def healthz(request: Request) -> dict[str, Any]:
    """No token needed. The process lives and answers; whether it can change anything is /readyz. `ledger_size` is
    the number of durable ledger entries (null when the ledger cannot be read); `policy_hash` names the policy set
    deciding now (the hash every decision entry carries); `replica` and `role` say which replica answered and
    whether it leads."""
    gw = request.app.state.gateway
    try:
        size: int | None = gw.ledger.size()
    except Exception:  # liveness must not depend on the ledger: /readyz says what is wrong
        size = None
    return {"status": "ok", "ledger_size": size, "policy_hash": gw.policy.policy_hash,
            "replica": gw.leadership.replica_id, "role": "leader" if gw.leadership.leads() else "follower"}


def _check(name: str, problems: dict[str, str], probe: Any) -> None:
    try:
        why = probe()
    except Exception as e:  # a check that cannot even be asked has failed; its why is the error's first line
        first = str(getattr(e, "orig", None) or e).strip().splitlines()
        why = f"{e.__class__.__name__}: {first[0] if first else ''}"
    if why:
        problems[name] = why


def _db_write_problem(gw: Any) -> None:
    """A real write, rolled into one small row per replica: a business database that is gone, read-only or full
    fails it, as it would fail a mutation."""
    with gw.db.transaction() as session:
        session.merge(Meta(key=READY_PROBE + gw.leadership.replica_id[:50], value=datetime.now(UTC).isoformat()))


READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Ready: the ledger and the business database take writes, a policy set is loaded and a"
                         " leader is known (`replicas` names it)."},
    503: {"description": "Not ready: `checks` names each failed check with its reason; a load balancer sends this"
                         " replica no traffic until it answers 200 again.",
          "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}},
}


@router.get("/readyz", summary="Readiness: can this replica decide and record now", responses=READY_RESPONSES)
def readyz(request: Request) -> Any:
    """No token needed. 200 when this replica can decide and record now: the ledger can be appended to (as far as
    can be told without writing: privileges, a read-only server, the latest batch's failure), the business
    database takes a write, a policy set is loaded, and a leader is known. Otherwise 503 problem+json whose
    `checks` holds each failed check's reason. Both carry `replicas`: this replica, its role, the leader and its
    epoch, and the replicas seen lately (when the business database can be read)."""
    gw = request.app.state.gateway
    problems: dict[str, str] = {}
    _check("ledger", problems, gw.ledger.write_problem)
    _check("database", problems, lambda: _db_write_problem(gw))
    _check("policy", problems, lambda: None if gw.policy.policy_hash else "no policy set is loaded")
    _check("leader", problems, gw.leadership.leader_known)
    try:
        replicas: dict[str, Any] | None = gw.leadership.status()
    except Exception:  # the database is down: the database check says so
        replicas = None
    body = {"policy_hash": gw.policy.policy_hash, "replicas": replicas}
    if not problems:
        return {"status": "ready", **body}
    log.warning("not ready: %s", "; ".join(f"{k}: {v}" for k, v in problems.items()))
    response: JSONResponse = problem(
        503, "not-ready", "Not ready: this replica cannot decide and record now",
        "; ".join(f"{k}: {v}" for k, v in problems.items()), request.url.path, checks=problems, **body)
    return response

