"""What the policy and the ledger are told about a decision's targets: each job's four ownerships and flags (R2,
R3), and the facts only some actions need: priorities for a priority change (A2), failed gang members for the
system's stop (Q6), the emergency holds a job falls under (C2), and the recovery window a deletion is given (A6).

Every read here is of the store: the rooms above decide with these facts, and jobs/ reuses the priority standing
and the holds for its own answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.deps import Decider
from gateway.schemas import MAX_RUNTIME_LIMIT_S
from gateway.store.models import Allocation, Job
from gateway.store.scheduler_tables import SchedJob
from gateway.store.stop_tables import EmergencyHold

_ANY_IN_FORCE = "SELECT 1 FROM emergency_holds WHERE lifted_at IS NULL LIMIT 1"


def in_scope(kind: str, value: Any, *, workload: str | None, environment: str, labels: dict[str, str]) -> bool:
    """Whether a job with these fields falls in a workload, environment or label-selector scope."""
    if kind == "workload":
        return bool(workload == value)
    if kind == "environment":
        return bool(environment == value)
    return kind == "selector" and isinstance(value, dict) and all(labels.get(k) == v for k, v in value.items())


def holds_on(session: Session, *, workload: str | None, environment: str, labels: dict[str, str]
             ) -> list[dict[str, Any]]:
    """The holds in force that a new job with these fields falls under, as the policy input shows them."""
    # Asked for every submission, and there is almost never a hold: the plain query first, the ORM only then.
    if session.connection().exec_driver_sql(_ANY_IN_FORCE).first() is None:
        return []
    found = []
    for hold in session.scalars(select(EmergencyHold).where(EmergencyHold.lifted_at.is_(None))
                                .order_by(EmergencyHold.since, EmergencyHold.emergency_id)).all():
        value = hold.scope_value.get("value")
        if in_scope(hold.scope_kind, value, workload=workload, environment=environment, labels=labels):
            found.append({"emergency_id": hold.emergency_id, "scope": {"kind": hold.scope_kind, "value": value},
                          "trigger": hold.trigger, "since": hold.since.isoformat()})
    return found


def effective(row: SchedJob | None) -> float:
    """The job's effective priority as a manual change reads it: the total of its last computed parts (the row's
    priority before any, 0 for a job without a row). apply_priority takes its `before` from here too."""
    if row is None:
        return 0.0
    return float((row.parts or {}).get("total", row.priority or 0.0))


def priority_standing(session: Session, job_ids: Sequence[str]) -> dict[str, tuple[float, float]]:
    """job id -> (effective priority now, unadjusted): what the policy needs to judge an owner's own change (A2).

    Unadjusted is the effective priority without its `manual` part, i.e. what the scheduler alone gives the job.
    One query for all the jobs; the rows stay in the session for apply_priority.
    """
    rows = {r.job_id: r for r in session.scalars(select(SchedJob).where(SchedJob.job_id.in_(list(job_ids))))}
    out: dict[str, tuple[float, float]] = {}
    for job_id in job_ids:
        row = rows.get(job_id)
        now = effective(row)
        out[job_id] = (now, now - float(row.manual or 0.0) if row is not None else now)
    return out


def over_runtime_limit(job: Job, now: datetime) -> bool:
    """Q6: the job has run as long as it declared it would (its run counted from its start, as backfill counts).
    The bound keeps a limit stored before submissions were bounded from overflowing a datetime."""
    limit = job.runtime_limit_s
    return bool(limit and job.started_at and job.started_at + timedelta(seconds=min(limit, MAX_RUNTIME_LIMIT_S)) <= now)


def target_facts(job: Job, now: datetime) -> dict[str, Any]:
    """What the policy and the ledger need to know about a target: its four ownerships and flags (R2, R3)."""
    return {
        "id": job.id,
        "name": job.name,
        "project": job.project,
        "creator": job.creator,
        "creator_kind": job.creator_kind,
        "owner": job.owner,
        "beneficiary_project": job.beneficiary_project,
        "rights_holder": job.rights_holder,
        "external_rights": job.external_rights,
        "state": job.state,
        "environment": job.environment,
        "workload": job.workload,
        "valid_until": job.valid_until.isoformat() if job.valid_until else None,
        "expired": bool(job.valid_until and job.valid_until <= now),
        "over_runtime_limit": over_runtime_limit(job, now),
        "gpus": job.gpus_per_node * job.nodes,
        # A8: for a job a service account started, the pipeline run (trigger) and the person behind it.
        "submitted_via": dict(job.submitted_via),
    }


def add_priority_facts(session: Session, facts: Sequence[dict[str, Any]]) -> None:
    """A2: each target's effective priority now and its unadjusted priority (without the manual part), so the
    policy can tell an owner giving way from one jumping the queue, job by job. Only decisions that set a
    value load them (a renewal, P3, decides job.priority with none)."""
    standing = priority_standing(session, [f["id"] for f in facts])
    for f in facts:
        f["priority"], f["unadjusted_priority"] = standing[f["id"]]


def add_gang_facts(session: Session, facts: Sequence[dict[str, Any]]) -> None:
    """Q6: the nodes where a part of each target's gang failed, so the policy can let the system stop the
    rest of a gang that cannot go on without it. Only the system's stops load them."""
    session.flush()  # the failed part is usually this transaction's own change (agent reports do not autoflush)
    failed = session.execute(select(Allocation.job_id, Allocation.node).where(
        Allocation.job_id.in_([f["id"] for f in facts]), Allocation.state == "failed")).all()
    for f in facts:
        f["failed_members"] = sorted(node for job_id, node in failed if job_id == f["id"])


def add_hold_facts(session: Session, facts: Sequence[dict[str, Any]], targets: Sequence[Job]) -> None:
    """C2: the emergency holds each target (a paused job asked to resume) falls under, only where there are
    some, so the policy can keep a held scope closed to jobs coming back as well as to new ones."""
    for f, job in zip(facts, targets, strict=True):
        if holds := holds_on(session, workload=job.workload, environment=job.environment, labels=job.labels):
            f["emergency_holds"] = holds


DEFAULT_RECOVERY_WINDOW_DAYS = 7


def recovery_window(gw: Decider) -> timedelta:
    """How long a deleted job can be undeleted before its files are purged (A6), from the active policy set
    (`deletion.recovery_window_days`, checked at load by gateway/decisions/policy/loader.py). A deletion keeps the
    window it was given: a reload changes only the deletions after it."""
    days = gw.policy_set.data.get("deletion", {}).get("recovery_window_days", DEFAULT_RECOVERY_WINDOW_DAYS)
    return timedelta(days=int(days))
