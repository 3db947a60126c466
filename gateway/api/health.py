"""/healthz: liveness plus the facts an operator checks first."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness and readiness")
def healthz(request: Request) -> dict[str, Any]:
    """No token needed. `ledger_size` is the number of durable ledger entries; `policy_hash` names the policy
    set deciding now (the hash every decision entry carries)."""
    gw = request.app.state.gateway
    return {"status": "ok", "ledger_size": gw.ledger.size(), "policy_hash": gw.policy.policy_hash}
