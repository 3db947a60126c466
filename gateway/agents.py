"""The gateway side of the node-agent channel: heartbeats, command delivery, reports of process events."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import rfc8785
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.auth import Caller
from gateway.context import Gateway
from gateway.errors import Forbidden, NotFound
from gateway.jobs import transition
from gateway.models import Allocation, Job, Node, NodeCommand
from gateway.pipeline import record_outcome
from gateway.schemas import AgentReport, Heartbeat
from gateway.states import ENDED_STATES


def require_node(caller: Caller, node_id: str) -> None:
    """Only the node's own agent token may speak for it."""
    if caller.kind != "node" or caller.id != node_id:
        raise Forbidden(f"only the agent of node {node_id!r} may use this endpoint")


def heartbeat(gw: Gateway, session: Session, node_id: str, beat: Heartbeat) -> None:
    now = gw.clock()
    node = session.get(Node, node_id)
    if node is None:
        node = Node(id=node_id, gpus=beat.gpus, state="alive", last_heartbeat=now, running=beat.running)
        session.add(node)
        gw.scheduler_kick.set()
        return
    if node.state != "alive" or node.gpus != beat.gpus:
        gw.scheduler_kick.set()
    node.gpus = beat.gpus
    node.state = "alive"
    node.last_heartbeat = now
    node.running = beat.running


def take_commands(gw: Gateway, session: Session, node_id: str) -> list[dict[str, Any]]:
    """Hand out the node's undelivered, unexpired commands in the order they were issued."""
    now = gw.clock()
    rows = session.scalars(
        select(NodeCommand)
        .where(NodeCommand.node == node_id, NodeCommand.delivered_at.is_(None), NodeCommand.expires_at > now)
        .order_by(NodeCommand.created_at, NodeCommand.nonce)
    ).all()
    for row in rows:
        row.delivered_at = now
    return [row.envelope for row in rows]


def _job_state_from_parts(parts: list[Allocation]) -> str | None:
    states = {p.state for p in parts}
    if states <= {"running"}:
        return "running"
    if states <= {"stopped"}:
        return "stopped"
    if states <= {"stopped", "exited", "failed"} and "stopped" in states:
        return "stopped"
    if states <= {"exited"}:
        return "exited"
    if states <= {"exited", "failed"}:
        return "failed"
    return None


def apply_report(gw: Gateway, session: Session, node_id: str, report: AgentReport) -> None:
    """Fold one agent report into the job's state; ledger every transition it causes (C3)."""
    now = gw.clock()
    job = session.get(Job, report.job_id)
    if job is None:
        record_outcome(gw, "agent_report", {"node": node_id, "job_id": report.job_id, "event": report.event,
                                            "detail": report.detail, "known_job": False})
        return
    part = session.scalars(
        select(Allocation).where(Allocation.job_id == job.id, Allocation.node == node_id)
    ).first()
    if report.event == "rejected" or part is None:
        record_outcome(gw, "agent_report", {"node": node_id, "job_id": job.id, "event": report.event,
                                            "detail": report.detail, "nonce": report.nonce})
        return
    before = job.state
    if report.event == "started":
        part.state, part.pid = "running", report.pid
    elif report.event == "stopping":
        part.state = "stopping"
    elif report.event in ("stopped", "exited"):
        ev = report.evidence or {}
        part.evidence = ev
        part.exit_code = ev.get("exit_code")
        part.released = True
        if report.event == "stopped":
            part.state = "stopped"
        else:
            part.state = "exited" if ev.get("exit_code") == 0 else "failed"
    parts = list(session.scalars(select(Allocation).where(Allocation.job_id == job.id)).all())
    if job.state in ENDED_STATES:
        return
    if report.event == "stopping" and job.state == "stop_requested":
        transition(job, "stopping", now, by=f"node:{node_id}", reason="prepare signal delivered")
    target = _job_state_from_parts(parts)
    if target == "running" and job.state == "starting":
        job.started_at = datetime.fromtimestamp(report.at, UTC)
        transition(job, "running", now, by=f"node:{node_id}", reason="all gang members started")
    elif target in ("stopped", "exited", "failed") and job.state != target:
        _finish(gw, job, parts, target, now, node_id)
    if job.state != before:
        record_outcome(gw, "transition", {"job_id": job.id, "state_before": before, "state_after": job.state,
                                          "node": node_id, "event": report.event})
    if part.released:
        gw.scheduler_kick.set()


def _finish(gw: Gateway, job: Job, parts: list[Allocation], target: str, now: datetime, node_id: str) -> None:
    if job.stop_request.get("preemption"):  # P2: a preempted job goes back to the queue (gateway/preemption.py)
        from gateway.preemption import requeue

        requeue(gw, job, parts, now, node_id)
        return
    evidence = {p.node: p.evidence for p in parts}
    outcomes = {str(p.evidence.get("outcome")) for p in parts if p.evidence.get("outcome")}
    if target == "stopped":
        job.outcome = "forced" if "forced" in outcomes else "graceful"
        state = "stopped"
    else:
        job.outcome = None
        state = "succeeded" if target == "exited" else "failed"
    codes = [p.exit_code for p in parts if p.exit_code is not None]
    job.exit_code = max(codes, key=abs) if codes else None
    job.ended_at = now
    job.evidence = {"nodes": evidence, "gpus_released": all(p.released for p in parts)}
    transition(job, state, now, by=f"node:{node_id}", reason=job.outcome or f"exit code {job.exit_code}")
    blob = rfc8785.dumps(job.evidence)
    record_outcome(gw, "outcome", {"action": "job.stop" if state == "stopped" else "job.exit", "job_id": job.id,
                                   "result": state, "outcome": job.outcome, "exit_code": job.exit_code,
                                   "stop_request": job.stop_request},
                   blobs={"evidence": blob})


def node_or_404(session: Session, node_id: str) -> Node:
    node = session.get(Node, node_id)
    if node is None:
        raise NotFound(f"no node {node_id!r}")
    return node
