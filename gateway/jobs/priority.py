"""Setting a job's priority (A2 own job, A3 another's): the one place a new value is applied.

Audit fields (REQUIREMENTS A2, A3): value before and after, the queue snapshot at that moment, the operator,
the affected owner and the written reason. Used by the single-job route, batch reprioritisation and the
approval executor alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from gateway.decisions import facts
from gateway.decisions.obligations import notify_owners
from gateway.decisions.pipeline import record_outcome
from gateway.decisions.queue_snapshot import snapshot_blob
from gateway.errors import Conflict
from gateway.identity.auth import Caller
from gateway.jobs import priority_history
from gateway.jobs.deps import Jobs
from gateway.store.models import Job
from gateway.store.service_tables import Approval
from gateway.store.states import PAST_STATES


def apply_priority(gw: Jobs, session: Session, job: Job, value: float, *, by: str, request_id: str,
                   decision_seq: int, reason: str | None, approved_by: list[str],
                   obligations: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Set the job's effective priority; record before/after, basis, a queue snapshot and the owners told (the
    policy's notify_owner obligations, as for a stop). Raises Conflict."""
    if job.state in PAST_STATES:
        raise Conflict(f"job {job.id} already ended ({job.state})", state=job.state)
    notified = notify_owners(gw, session, obligations, job=job, actor=by, action="job.priority", reason=reason)
    now = gw.clock()
    row = priority_history.ensure(session, job)
    parts = dict(row.parts or {})
    before = facts.effective(row)
    row.manual = float(row.manual or 0.0) + (value - before)
    parts.update({"manual": row.manual, "total": value})
    row.parts = parts
    row.priority = value
    row.recorded_priority = value
    priority_history.record(session, job.id, now, "manual", before, parts,
                            note=f"set to {value:g} by {by}" + (f": {reason}" if reason else ""))
    session.flush()
    snapshot = snapshot_blob(session)
    seq = record_outcome(gw, "outcome", {
        "request_id": request_id, "decision_seq": decision_seq, "action": "job.priority", "job_id": job.id,
        "result": "changed", "priority_before": before, "priority_after": value, "operator": by,
        "affected_owner": job.owner, "approved_by": approved_by, "reason": reason, "owner_notified": notified,
    }, blobs={"queue_snapshot": snapshot})
    gw.execution.reprioritised(job, value)
    return {"job_id": job.id, "priority_before": before, "priority_after": value, "outcome_seq": seq}


def _priority_after_approval(gw: Jobs, session: Session, approval: Approval, targets: list[Job],
                             approver: Caller) -> dict[str, Any]:
    value = float(approval.params["priority"])
    return {"changed": [apply_priority(gw, session, job, value, by=approval.requester, request_id=approval.id,
                                       decision_seq=approval.decision_seq, reason=approval.reason,
                                       approved_by=[a["by"] for a in approval.approvals],
                                       obligations=approval.resolution.get("obligations", ())) for job in targets]}


# What this module carries out once a second person approved it (M2), bound to the running gateway at app
# start (gateway/bootstrap.py).
EXECUTORS = {"job.priority": _priority_after_approval}
