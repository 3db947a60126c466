"""/v1/agents/{node}: the only channel node agents use. Agents pull; the gateway never connects to them."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from gateway import agents
from gateway.api.deps import Ctx
from gateway.schemas import AgentReports, Heartbeat

router = APIRouter(prefix="/v1/agents", tags=["node agents"])


@router.post("/{node_id}/heartbeat", summary="Agent heartbeat")
def heartbeat(node_id: str, beat: Heartbeat, ctx: Ctx) -> dict[str, bool]:
    with ctx.gw.transaction() as session:
        agents.require_node(ctx.caller(session), node_id)
        agents.heartbeat(ctx.gw, session, node_id, beat)
    return {"ok": True}


@router.get("/{node_id}/commands", summary="Long-poll for signed commands")
def commands(
    node_id: str, ctx: Ctx, wait: Annotated[float, Query(ge=0, le=60, description="Seconds to wait")] = 20
) -> dict[str, list[dict[str, Any]]]:
    gw = ctx.gw
    with gw.transaction() as session:
        agents.require_node(ctx.caller(session), node_id)
    deadline = min(wait, gw.settings.max_long_poll_s)
    end = time.monotonic() + deadline
    while True:
        seen = gw.bus.version(node_id)
        with gw.transaction() as session:
            found = agents.take_commands(gw, session, node_id)
        remaining = end - time.monotonic()
        if found or remaining <= 0:
            return {"commands": found}
        gw.bus.wait(node_id, seen, remaining)


@router.post("/{node_id}/reports", summary="Report process events and evidence")
def reports(node_id: str, body: AgentReports, ctx: Ctx) -> dict[str, int]:
    with ctx.gw.transaction() as session:
        agents.require_node(ctx.caller(session), node_id)
        agents.node_or_404(session, node_id)
        for report in body.reports:
            agents.apply_report(ctx.gw, session, node_id, report)
    return {"accepted": len(body.reports)}
