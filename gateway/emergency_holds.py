"""Emergency holds in force (gateway/emergency.py): which of them a new job would fall under.

Apart from gateway/emergency.py so that submissions (gateway/jobs.py, which that module builds on) can ask.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

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
