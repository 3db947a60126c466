"""Node health (C3, H1): nodes silent past the heartbeat timeout are lost and their jobs with them; a node that
comes back, or whose agent restarted, is reconciled (what it should run, what it must stop, which commands still
stand); and a node's report about an earlier run or an earlier stop of a job is told apart from one about this."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.notifications import alert
from gateway.decisions.pipeline import record_outcome
from gateway.jobs.records import lock_jobs
from gateway.jobs.stops import PART_DONE, escalate, ledger_transition
from gateway.native.commands import enqueue
from gateway.native.deps import Native
from gateway.store.models import Allocation, Job, Node, NodeCommand
from gateway.store.states import STOPPING_STATES
from gateway.store.stop_tables import AgentSession, CommandAck


def stale_report(session: Session, job: Job, part: Allocation, event: str, pid: int | None,
                 nonce: str | None) -> str | None:
    """Why a node's report is about an earlier run or an earlier stop of this job (so it must not touch the
    current part), or None. Reports are delivered at least once and a requeued or resumed job may run again on
    the same node, so a resent `stopped` would otherwise end the new run and release GPUs it is about to use."""
    if event == "started":
        if part.released:
            return "the part already ended; a start report cannot revive it"
        # Before this run's own report the part knows no pid, so the start command it answers tells them apart.
        latest = session.scalars(select(NodeCommand.nonce).where(
            NodeCommand.job_id == job.id, NodeCommand.node == part.node, NodeCommand.kind == "start")
            .order_by(NodeCommand.created_at.desc()).limit(1)).first()
        return "answers an earlier start of this job" if nonce and latest and nonce != latest else None
    if pid is not None and part.pid is not None and pid != part.pid:
        return f"about process {pid}; this run's process is {part.pid}"
    if event not in ("stopping", "stopped"):
        return None
    if job.state in ("starting", "running"):
        return "no stop of this run was requested"
    command = session.get(NodeCommand, nonce) if nonce else None
    asked = job.stop_request.get("at")
    if command is not None and command.kind == "stop" and command.job_id == job.id and asked \
            and command.created_at < datetime.fromisoformat(asked):
        return "answers a stop sent before the current one"
    return None


def mark_lost_nodes(gw: Native, session: Session, now: datetime) -> list[str]:
    """Nodes silent past the heartbeat timeout become `lost`; their running jobs become `lost` with GPUs
    withheld, their stopping jobs `stop_failed` (unreachable). Returns the node ids marked now."""
    cutoff = now - timedelta(seconds=gw.settings.node_heartbeat_timeout_s)
    marked = []
    for node in session.scalars(select(Node).where(Node.state == "alive")).all():
        if node.last_heartbeat is not None and node.last_heartbeat >= cutoff:
            continue
        node.state = "lost"
        marked.append(node.id)
        seen = node.last_heartbeat.isoformat() if node.last_heartbeat else None
        record_outcome(gw, "node", {"node": node.id, "state_before": "alive", "state_after": "lost",
                                    "last_heartbeat": seen, "at": now.isoformat()})
        # Locked and read again (PostgreSQL): a stop committed since jobs_on_node read them must not be undone.
        jobs = list(lock_jobs(session, [j.id for j in jobs_on_node(session, node.id)]).values())
        alert(session, now, "node_lost", {"node": node.id, "last_heartbeat": seen,
                                              "jobs": [j.id for j in jobs]})
        for job in jobs:
            if job.state in ("starting", "running"):
                ledger_transition(gw, job, "lost", now, by="system",
                                  reason=f"node {node.id} missed heartbeats; GPUs withheld until it returns "
                                         "or on-call confirms", node=node.id)
            elif job.state in STOPPING_STATES:
                escalate(gw, session, job, now, f"node {node.id} is unreachable", unreachable=True)
    return marked


def jobs_on_node(session: Session, node_id: str) -> list[Job]:
    """Jobs with a part on the node that the node has not confirmed as over."""
    ids = session.scalars(select(Allocation.job_id).where(
        Allocation.node == node_id, Allocation.state.not_in(PART_DONE))).all()
    if not ids:
        return []
    return list(session.scalars(select(Job).where(Job.id.in_(sorted(set(ids)))).order_by(Job.id)).all())


def reconcile_params(session: Session, node_id: str, now: datetime) -> dict[str, list[str]]:
    """What the node should run (`expected`) and what it must stop (`stop`): every job with an unconfirmed part
    there that the gateway no longer wants running; and the nonces of the commands still in flight to it
    (`pending`), the only ones issued before this reconcile that a restarted agent may still obey."""
    expected: list[str] = []
    stop: list[str] = []
    for job in jobs_on_node(session, node_id):
        (expected if job.state in ("starting", "running", "lost") else stop).append(job.id)
    pending = sorted(session.scalars(
        select(NodeCommand.nonce).outerjoin(CommandAck, CommandAck.nonce == NodeCommand.nonce)
        .where(NodeCommand.node == node_id, NodeCommand.expires_at > now, CommandAck.nonce.is_(None))).all())
    return {"expected": expected, "stop": stop, "pending": pending}


def send_reconcile(gw: Native, session: Session, node_id: str, now: datetime, why: str) -> str:
    params = reconcile_params(session, node_id, now)
    nonce = enqueue(gw, session, node_id, "", "reconcile", params)
    row = session.get(AgentSession, node_id)
    if row is not None:
        row.last_reconcile_nonce = nonce
    record_outcome(gw, "node", {"node": node_id, "action": "reconcile", "why": why, "nonce": nonce,
                                "at": now.isoformat(), **params})
    return nonce


def on_heartbeat(gw: Native, session: Session, node: Node, was: str, instance: str,
                 running: list[dict[str, Any]], now: datetime) -> None:
    """A heartbeat from a node that was lost, new, or whose agent restarted: fold and reconcile."""
    row = session.get(AgentSession, node.id)
    restarted = row is not None and bool(instance) and row.instance != instance
    if row is None:
        row = AgentSession(node=node.id, instance=instance, since=now)
        session.add(row)
        session.flush()
    elif restarted:
        row.instance, row.since = instance, now
    if was == "alive" and not restarted:
        return
    if was == "lost":
        record_outcome(gw, "node", {"node": node.id, "state_before": "lost", "state_after": "alive",
                                    "at": now.isoformat()})
        here = {str(r.get("job_id")) for r in running}
        alive = set(session.scalars(select(Node.id).where(Node.state == "alive")).all()) | {node.id}
        for job in jobs_on_node(session, node.id):
            if job.state == "lost" and job.id in here and {p["node"] for p in job.placement} <= alive:
                ledger_transition(gw, job, "running", now, by=f"node:{node.id}",
                                  reason=f"node {node.id} returned and the process still runs")
    why = {"lost": "node returned", "registered": "agent started"}.get(was, "agent restarted")
    if was == "alive" and restarted:
        why = "agent restarted"
    send_reconcile(gw, session, node.id, now, why)
