"""A waiting job placed by whatever runs the jobs (Q5, Q6, Q9): where each part of its gang runs and on whose
quota, its scheduling row at the priority it was placed with, `starting` in its history, and one allocation per
node. What then starts the processes is the executor's (gateway/execution/port.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from gateway.decisions.notifications import notify
from gateway.decisions.pipeline import record_outcome
from gateway.jobs import priority_history
from gateway.jobs.deps import Jobs
from gateway.jobs.records import transition
from gateway.store.models import Allocation, Job


def admit(gw: Jobs, session: Session, job: Job, parts: Sequence[tuple[str, Sequence[int]]], *, borrowed: bool,
          priority: Mapping[str, float], now: datetime) -> list[Allocation]:
    """Record the placement of a pending `job`: (node, GPUs) per part, owned or `borrowed` quota, at `priority`
    (its parts, `total` among them); ledgered. Returns the new allocations, one per part."""
    mode = "borrowed" if borrowed else "owned"
    placement = [{"node": node, "gpus": list(gpus), "quota": mode} for node, gpus in parts]
    record_outcome(gw, "schedule", {"job_id": job.id, "result": "admitted", "placement": placement,
                                    "priority": priority["total"], "quota": mode})
    job.placement = placement
    row = priority_history.ensure(session, job)
    row.borrowed = borrowed
    row.priority, row.parts = priority["total"], dict(priority)
    row.position, row.blocked_reason, row.estimated_start = None, "", None
    # P3: a new run starts a new occupancy period, owing no renewal yet; left set by an earlier run, the mark
    # kept the renewal-due notice of this one from ever being sent.
    row.renewal_due_at = None
    where = ", ".join(node for node, _ in parts)
    transition(job, "starting", now, by="scheduler", reason=f"placed on {where} ({mode} quota)")
    if row.restart_notice_pending:  # Q9: a requeued victim placed again before any cycle left it waiting
        row.restart_notice_pending = False
        notify(session, job.owner, "expected_restart", {
            "job_id": job.id, "placed": True, "queue": job.queue, "reason": f"placed on {where}",
            "expected_restart": now.isoformat()}, now)
    allocations = [Allocation(job_id=job.id, node=node, gpus=list(gpus), state="starting") for node, gpus in parts]
    session.add_all(allocations)
    return allocations
