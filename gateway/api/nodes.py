"""/v1/nodes: the pool's nodes, their health and free GPUs (cluster usage, Q10)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter, status
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from gateway.access import accounts
from gateway.api.deps import Ctx
from gateway.store.models import Allocation, Node
from gateway.store.stop_tables import AgentSession

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


class NodeEnrol(BaseModel):
    """A node to add to the pool; its agent authenticates with the token the answer carries (once)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=63, description="The node's name; must match JOBGATE_NODE_NAMES.")
    gpus: int = Field(ge=0, le=1024, description="GPUs it offers (its agent reports the real count).")


@router.post("", status_code=status.HTTP_201_CREATED, summary="Enrol a node (platform admin)")
def enrol_node(body: NodeEnrol, ctx: Ctx) -> dict[str, Any]:
    """Add a node and mint its agent's token, shown once: put it in the agent's `state/token` (0600), never on a
    command line. Names are those the site keeps for nodes (`JOBGATE_NODE_NAMES`); ledgered."""
    with ctx.gw.transaction() as session:
        issued = accounts.enrol_node(ctx.gw, session, ctx.caller(session), body.id, body.gpus)
    return {"id": body.id, "gpus": body.gpus, "token": issued.secret, "token_id": issued.id,
            "expires_at": issued.expires_at.isoformat()}


@router.get("", summary="Nodes, health and GPU use")
def list_nodes(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    """Every registered node: its state (alive, lost, ...), GPUs in all and in use, GPUs withheld on a lost
    node until it returns or on-call confirms its jobs stopped, whether it is degraded (its agent reports
    fewer GPUs than its jobs hold: it takes no new work until they fit), the jobs placed there, and when its
    agent last spoke, and how it keeps jobs apart (`isolation`: uid+cgroup, uid, or none: there jobs run as the
    agent's own user and could act as the node; `unknown` until its agent said)."""
    with ctx.gw.transaction() as session:
        ctx.caller(session)
        used: dict[str, int] = defaultdict(int)
        top: dict[str, int] = defaultdict(lambda: -1)  # the highest GPU index held there
        jobs: dict[str, list[str]] = defaultdict(list)
        for node_id, gpus, job_id in session.execute(
            select(Allocation.node, Allocation.gpus, Allocation.job_id).where(Allocation.released.is_(False))
        ).all():
            used[node_id] += len(gpus)
            top[node_id] = max(top[node_id], *gpus, -1)
            jobs[node_id].append(job_id)
        agents = {a.node: a for a in session.scalars(select(AgentSession)).all()}
        nodes = session.scalars(select(Node).order_by(Node.id)).all()
        return {"nodes": [
            {"id": n.id, "state": n.state, "gpus": n.gpus, "gpus_used": used[n.id],
             # GPUs of a lost node stay held until it returns or on-call confirms its jobs stopped.
             "gpus_withheld": used[n.id] if n.state == "lost" else 0,
             # As the scheduler sees it (gateway.native.scheduler_loop._node_state).
             "degraded": top[n.id] >= n.gpus,
             "jobs": sorted(jobs[n.id]),
             "isolation": n.isolation or "unknown",
             "agent_since": agents[n.id].since.isoformat() if n.id in agents else None,
             "last_heartbeat": n.last_heartbeat.isoformat() if n.last_heartbeat else None}
            for n in nodes
        ]}
