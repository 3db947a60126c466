"""/healthz (the process lives) and /readyz (this replica can decide and record now, and which replica leads).

A load balancer sends traffic by /readyz: /healthz said `ok` while every mutation was refused (a full disk, a
business database gone), so the balancer kept sending requests to a replica that could change nothing.

Both answer without a token, since a load balancer or a liveness probe has none, but only a caller with a valid
token is told the why and the where: a failed check's reason (a database error names its server's address and
port), the replicas' ids (host, port and process) and addresses. Anyone else learns whether the replica is ready,
which checks failed, and its role."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.api.openapi_doc import BEARER
from gateway.errors import problem
from gateway.identity.auth import bearer_facts
from gateway.leadership import READY_PROBE
from gateway.store.models import Meta

router = APIRouter(tags=["health"])
log = logging.getLogger("jobgate.health")


def _told_where(gw: Any, authorization: str | None) -> bool:
    """Whether the caller presents a usable token (then it is told reasons and addresses). A token that cannot be
    checked now (the business database gone, the token not cached) counts as none: the probe still answers."""
    if not authorization:
        return False
    try:
        with gw.db.transaction(immediate=False) as session:
            bearer_facts(session, authorization, gw.clock(), cache=gw.token_cache)
        return True
    except Exception:  # Unauthenticated, or the database unreachable
        return False


# A token is optional here (OpenAPI's `{}` alternative): read from the request rather than declared as a header
# parameter, which the document marks as an operation that requires one.
OPTIONAL_TOKEN: dict[str, Any] = {"security": [{}, {BEARER: []}]}


@router.get("/healthz", summary="Liveness", openapi_extra=OPTIONAL_TOKEN)
def healthz(request: Request) -> dict[str, Any]:
    """No token needed. The process lives and answers; whether it can change anything is /readyz. `ledger_size` is
    the number of durable ledger entries (null when the ledger cannot be read); `policy_hash` names the policy set
    deciding now (the hash every decision entry carries); `role` says whether this replica leads, and, to a
    caller with a valid token, `replica` which replica answered."""
    gw = request.app.state.gateway
    try:
        size: int | None = gw.ledger.size()
    except Exception:  # liveness must not depend on the ledger: /readyz says what is wrong
        size = None
    body = {"status": "ok", "ledger_size": size, "policy_hash": gw.policy.policy_hash,
            "role": "leader" if gw.leadership.leads() else "follower"}
    if _told_where(gw, request.headers.get("authorization")):
        body["replica"] = gw.leadership.replica_id
    return body


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


@router.get("/readyz", summary="Readiness: can this replica decide and record now", responses=READY_RESPONSES,
            openapi_extra=OPTIONAL_TOKEN)
def readyz(request: Request) -> Any:
    """No token needed. 200 when this replica can decide and record now: the ledger can be appended to (as far as
    can be told without writing: privileges, a read-only server, the latest batch's failure), the business
    database takes a write, a policy set is loaded, and a leader is known. Otherwise 503 problem+json whose
    `checks` names each failed check. Both carry `replicas` with this replica's `role`.

    To a caller with a valid token, `checks` gives each failed check's reason, and `replicas` this replica's id,
    the leader and its epoch, when it was elected and first ran its cycle, and the replicas seen lately (when the
    business database can be read). Without one these are left out: a database error names its server's address,
    and a replica id its host, port and process."""
    gw = request.app.state.gateway
    problems: dict[str, str] = {}
    _check("ledger", problems, gw.ledger.write_problem)
    _check("database", problems, lambda: _db_write_problem(gw))
    _check("policy", problems, lambda: None if gw.policy.policy_hash else "no policy set is loaded")
    _check("leader", problems, gw.leadership.leader_known)
    if problems:
        log.warning("not ready: %s", "; ".join(f"{k}: {v}" for k, v in problems.items()))
    replicas: dict[str, Any] | None
    if _told_where(gw, request.headers.get("authorization")):
        try:
            replicas = gw.leadership.status()
        except Exception:  # the database is down: the database check says so
            replicas = None
        detail = "; ".join(f"{k}: {v}" for k, v in problems.items())
    else:  # a load balancer's probe, every second: no read of the replicas' table for it
        replicas = {"role": "leader" if gw.leadership.leads() else "follower"}
        problems = {name: "failed (a caller with a valid token is told why)" for name in problems}
        detail = "failed: " + ", ".join(problems) + " (a caller with a valid token is told why)"
    body = {"policy_hash": gw.policy.policy_hash, "replicas": replicas}
    if not problems:
        return {"status": "ready", **body}
    response: JSONResponse = problem(503, "not-ready", "Not ready: this replica cannot decide and record now", detail,
                                     request.url.path, checks=problems, **body)
    return response

