"""/v1/agents/{node}: the only channel node agents use. Agents pull; the gateway never connects to them."""

from __future__ import annotations

import time
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Query, Request
from pydantic import Field

from gateway.api.deps import Ctx, NodeId, RequestContext
from gateway.native import agents
from gateway.schemas import AgentReports, Heartbeat

router = APIRouter(prefix="/v1/agents", tags=["node agents"])


class AgentHeartbeat(Heartbeat):
    """A heartbeat; `instance` changes whenever the agent process restarts (the gateway then reconciles)."""

    instance: str = Field("", max_length=64, description="Changes whenever the agent process restarts.")


@router.post("/{node_id}/heartbeat", summary="Agent heartbeat")
def heartbeat(node_id: NodeId, beat: AgentHeartbeat, ctx: Ctx) -> dict[str, bool]:
    """Liveness and the jobs running there. A node back from `lost`, or a restarted agent, gets a signed
    `reconcile` command listing the jobs the gateway expects there and the ones to stop."""
    with ctx.gw.transaction() as session:
        agents.require_node(ctx.caller(session), node_id)
        agents.heartbeat(ctx.gw, session, node_id, beat, beat.instance)
    return {"ok": True}


@router.get("/{node_id}/commands", summary="Long-poll for signed commands")
async def commands(
    request: Request,
    node_id: NodeId,
    ctx: Ctx,
    wait: Annotated[float, Query(ge=0, le=60, description="Seconds to wait")] = 20,
) -> dict[str, list[dict[str, Any]]]:
    """Commands for this node, each an envelope signed with the gateway's command key (the agent checks the
    signature and refuses replayed nonces). Returns as soon as there is one, or empty after `wait` seconds.
    An envelope is handed out again until a report carrying its nonce comes back."""
    # A long poll blocks its thread while it waits: it runs in the long-poll pool, not the API's.
    found = await anyio.to_thread.run_sync(_long_poll, ctx, node_id, wait,
                                           limiter=request.app.state.long_poll_limiter)
    return {"commands": found}


def _long_poll(ctx: RequestContext, node_id: str, wait: float) -> list[dict[str, Any]]:
    gw = ctx.gw
    with gw.transaction() as session:
        agents.require_node(ctx.caller(session), node_id)
    deadline = min(wait, gw.settings.max_long_poll_s)
    end = time.monotonic() + deadline
    while True:
        seen = gw.bus.version(node_id)
        with gw.transaction() as session:
            found = agents.take_commands(gw, session, node_id)
            unacked = not found and agents.has_unacked(gw, session, node_id)
        remaining = end - time.monotonic()
        if found or remaining <= 0 or gw.bus.closed:
            return found
        # Unacknowledged envelopes come due again; wake in time to hand them out.
        gw.bus.wait(node_id, seen, min(remaining, agents.RESEND_AFTER_S) if unacked else remaining)


@router.post("/{node_id}/reports", summary="Report process events and evidence")
def reports(node_id: NodeId, body: AgentReports, ctx: Ctx) -> dict[str, int]:
    """Starts, stops, exits and refused commands, with their evidence. Each moves its job's state machine and
    is ledgered; a report carrying a command's nonce acknowledges that command's delivery."""
    with ctx.gw.transaction() as session:
        agents.require_node(ctx.caller(session), node_id)
        agents.node_or_404(session, node_id)
        # One query per table for the batch; its ledger entries are appended together (group commit).
        agents.apply_reports(ctx.gw, session, node_id, list(body.reports))
    return {"accepted": len(body.reports)}
