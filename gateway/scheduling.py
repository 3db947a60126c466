"""Runs the pure scheduler core against the business DB: snapshot → run_cycle → placements + start commands."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.commands import enqueue
from gateway.context import Gateway
from gateway.jobs import transition
from gateway.models import Allocation, Job, Node
from gateway.pipeline import record_outcome
from scheduler.cycle import run_cycle
from scheduler.model import JobId, NodeId, NodeState, PendingJob, Placement, ProjectId, RunningJob, Snapshot

log = logging.getLogger("jobgate.scheduler")

# A stop that is not confirmed within the job's grace window plus this margin is escalated (C3).
STOP_CONFIRM_MARGIN_S = 30.0


def _mark_lost_nodes(gw: Gateway, session: Session, now: datetime) -> None:
    cutoff = now - timedelta(seconds=gw.settings.node_heartbeat_timeout_s)
    for node in session.scalars(select(Node).where(Node.state == "alive")).all():
        if node.last_heartbeat is None or node.last_heartbeat < cutoff:
            node.state = "lost"
            seen = node.last_heartbeat.isoformat() if node.last_heartbeat else None
            record_outcome(gw, "node", {"node": node.id, "state_after": "lost", "last_heartbeat": seen})


def _escalate_unconfirmed_stops(gw: Gateway, session: Session, now: datetime) -> None:
    for job in session.scalars(select(Job).where(Job.state.in_(("stop_requested", "stopping")))).all():
        asked = datetime.fromisoformat(job.stop_request["at"]) if job.stop_request.get("at") else job.submitted_at
        if now - asked > timedelta(seconds=job.grace_seconds + STOP_CONFIRM_MARGIN_S):
            before = job.state
            transition(job, "stop_failed", now, by="system",
                       reason="stop not confirmed by the node within the grace window; needs a person")
            log.warning("stop_failed job=%s: escalated for a person to confirm", job.id)
            record_outcome(gw, "transition", {"job_id": job.id, "state_before": before, "state_after": "stop_failed",
                                              "alert": "stop not confirmed; escalated"})


def build_snapshot(session: Session) -> Snapshot:
    used: dict[str, set[int]] = defaultdict(set)
    for node_id, gpus in session.execute(
        select(Allocation.node, Allocation.gpus).where(Allocation.released.is_(False))
    ).all():
        used[node_id].update(gpus)
    nodes = tuple(
        NodeState(id=NodeId(n.id), gpus=n.gpus, free=frozenset(set(range(n.gpus)) - used[n.id]),
                  alive=n.state == "alive")
        for n in session.scalars(select(Node).order_by(Node.id)).all()
    )
    pending = tuple(
        PendingJob(id=JobId(j.id), project=ProjectId(j.project), user=j.owner, queue=j.queue,
                   gpus_per_node=j.gpus_per_node, nodes=j.nodes, submitted_at=j.submitted_at,
                   base_priority=j.base_priority, runtime_limit_s=j.runtime_limit_s)
        for j in session.scalars(select(Job).where(Job.state == "pending")).all()
    )
    running = tuple(
        RunningJob(id=JobId(j.id), project=ProjectId(j.project), user=j.owner, queue=j.queue, priority=j.base_priority,
                   started_at=j.started_at or j.submitted_at,
                   placement=tuple(Placement(node=NodeId(p["node"]), gpus=tuple(p["gpus"])) for p in j.placement),
                   runtime_limit_s=j.runtime_limit_s)
        for j in session.scalars(select(Job).where(Job.state.in_(("starting", "running")))).all()
    )
    return Snapshot(nodes=nodes, pending=pending, running=running)


def run_once(gw: Gateway) -> int:
    """One scheduling cycle in one transaction. Returns the number of jobs admitted."""
    with gw.transaction() as session:
        now = gw.clock()
        _mark_lost_nodes(gw, session, now)
        _escalate_unconfirmed_stops(gw, session, now)
        result = run_cycle(build_snapshot(session), now=now)
        for admit in result.admits:
            job = session.get(Job, admit.job_id)
            if job is None or job.state != "pending":
                continue
            placement = [{"node": p.node, "gpus": list(p.gpus)} for p in admit.placement]
            record_outcome(gw, "schedule", {"job_id": job.id, "result": "admitted", "placement": placement,
                                            "priority": admit.priority.total})
            job.placement = placement
            where = ", ".join(p.node for p in admit.placement)
            transition(job, "starting", now, by="scheduler", reason=f"placed on {where}")
            for p in admit.placement:
                session.add(Allocation(job_id=job.id, node=p.node, gpus=list(p.gpus), state="starting"))
                enqueue(gw, session, p.node, job.id, "start", {
                    "argv": list(job.command), "gpus": list(p.gpus), "grace_seconds": job.grace_seconds,
                    "stop_signal": job.stop_signal, "env": dict(job.env)})
        blocked = {b.job_id: b for b in result.blocked}
        for job in session.scalars(select(Job).where(Job.state == "pending")).all():
            b = blocked.get(JobId(job.id))
            if b is not None and job.state_reason != b.reason:
                job.state_reason = b.reason
        return len(result.admits)


class SchedulerLoop(threading.Thread):
    """Runs a cycle every interval, or sooner when something changed (submit, release, new node)."""

    def __init__(self, gw: Gateway) -> None:
        super().__init__(name="jobgate-scheduler", daemon=True)
        self.gw = gw
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.gw.scheduler_kick.wait(self.gw.settings.scheduler_interval_s)
            self.gw.scheduler_kick.clear()
            if self._stop_event.is_set():
                break
            try:
                run_once(self.gw)
            except Exception:  # the loop must outlive one bad cycle; the error is logged with its trace
                log.exception("scheduler cycle failed")

    def stop(self) -> None:
        self._stop_event.set()
        self.gw.scheduler_kick.set()
        self.join(timeout=10)
