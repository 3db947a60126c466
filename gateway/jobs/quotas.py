"""Quota tiers (Q4, Q5) and the mount/data-set registry (Q1) as the gateway stores and changes them.

Quota changes are A7: decided by policy (a platform admin plus a second one), ledgered with before and
after and the effective period, and executed by the `quota.change` executor exactly once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from gateway.decisions.approvals import open_request
from gateway.decisions.pipeline import Recorded, decide, record_outcome
from gateway.decisions.verdict import refuse_if_denied, refuse_unless_allowed
from gateway.errors import Invalid
from gateway.identity.auth import Caller
from gateway.jobs.deps import Jobs
from gateway.store.models import Allocation, Job, Node, Project
from gateway.store.scheduler_tables import CLUSTER, MountRow, QuotaChange, QuotaRow, SchedJob, quota_json
from gateway.store.service_tables import Approval
from gateway.store.states import ACTIVE_STATES, WITHHELD_STATES
from scheduler.model import ProjectId, Quotas, TenantQuota
from scheduler.quota import hard_limit_problems


def _in_effect(row: QuotaRow | Row[Any], now: datetime) -> bool:
    return (row.effective_from is None or row.effective_from <= now) and (
        row.effective_until is None or now < row.effective_until)


# Read on every submission: Core rows (the columns by name), without the ORM's objects and identity map.
_QUOTAS = select(*QuotaRow.__table__.c)


def load_quotas(session: Session, now: datetime) -> Quotas | None:
    """The quota tiers in effect now; None when no quota was ever set (capacity is then the only limit)."""
    rows = [r for r in session.connection().execute(_QUOTAS) if _in_effect(r, now)]
    if not rows:
        return None
    cluster = next((r for r in rows if r.project == CLUSTER), None)
    # A tenant's user limits bind within that tenant only ("per-user GPU limits within this tenant"); the
    # cluster row's bind a user across every tenant.
    tenants = {ProjectId(r.project): TenantQuota(gpus=r.gpus, borrow_limit=r.borrow_limit, lend_limit=r.lend_limit,
                                                 users={u: int(v) for u, v in (r.users or {}).items()})
               for r in rows if r.project != CLUSTER}
    users = {u: int(v) for u, v in ((cluster.users or {}) if cluster else {}).items()}
    return Quotas(cluster_gpus=cluster.gpus if cluster else None, tenants=tenants, users=users)


def usage_by_tenant(session: Session) -> dict[str, dict[str, int]]:
    """GPUs held now per tenant, split owned / borrowed (Q5 marking of every allocation)."""
    out: dict[str, dict[str, int]] = {}
    rows = session.execute(
        select(Job.project, Job.gpus_per_node, Job.nodes, SchedJob.borrowed)
        .join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
        .where(Job.state.in_((*ACTIVE_STATES, *WITHHELD_STATES)))).all()
    for project, g, n, borrowed in rows:
        slot = out.setdefault(project, {"owned": 0, "borrowed": 0})
        slot["borrowed" if borrowed else "owned"] += g * n
    return out


def alive_capacity(session: Session) -> dict[str, int]:
    """GPUs of the alive nodes, how many of them are held (unreleased allocations) and how many are free.

    GPUs withheld on a lost node are neither: they still count against their tenant's quota (usage_by_tenant),
    but subtracting them from the alive nodes' capacity showed idle nodes as full.
    """
    alive = dict(session.execute(select(Node.id, Node.gpus).where(Node.state == "alive")).all())
    held = sum(len(gpus) for node, gpus in session.execute(
        select(Allocation.node, Allocation.gpus).where(Allocation.released.is_(False))).all() if node in alive)
    total = sum(alive.values())
    return {"gpus": total, "in_use": held, "free": max(0, total - held)}


def list_quotas(session: Session) -> list[dict[str, Any]]:
    usage = usage_by_tenant(session)
    out = []
    for row in session.scalars(select(QuotaRow).order_by(QuotaRow.project)).all():
        item = quota_json(row) or {}
        item["in_use"] = usage.get(row.project, {"owned": 0, "borrowed": 0})
        out.append(item)
    return out


def request_change(gw: Jobs, session: Session, caller: Caller, project: str, params: dict[str, Any],
                   reason: str, ticket: str | None) -> tuple[Recorded, Approval | None, dict[str, Any] | None]:
    """A7: decide a quota change; open an approval when a second person is needed, else apply it.

    Raises Invalid (unknown project), PolicyDenied, LedgerUnavailable.
    """
    if project != CLUSTER and session.get(Project, project) is None:
        raise Invalid(f"unknown project {project!r}")
    before = quota_json(session.get(QuotaRow, project))
    rec = decide(gw, session, caller, "quota.change", project=project, params={**params, "before": before},
                 reason=reason, ticket=ticket)
    refuse_if_denied(rec)
    if rec.decision.effect == "needs_approval":
        approval = open_request(gw, session, caller, rec, action="quota.change", target_ids=[], project=project,
                                params={**params, "before": before}, reason=reason, ticket=ticket)
        return rec, approval, None
    result = apply_change(gw, session, project, params, by=caller.real_identity, approved_by=[], reason=reason,
                          decision_seq=rec.seq)
    return rec, None, result


def _change_after_approval(gw: Jobs, session: Session, approval: Approval, targets: list[Job],
                           approver: Caller) -> dict[str, Any]:
    params = {k: v for k, v in approval.params.items() if k != "before"}
    return apply_change(gw, session, approval.project or "", params, by=approval.requester,
                        approved_by=[a["by"] for a in [*approval.approvals]] or [approver.real_identity],
                        reason=approval.reason or "", decision_seq=approval.decision_seq)


def apply_change(gw: Jobs, session: Session, project: str, params: dict[str, Any], *, by: str,
                 approved_by: list[str], reason: str, decision_seq: int) -> dict[str, Any]:
    """Write the new quota, keep before/after in quota_changes and the ledger. Raises LedgerUnavailable."""
    now = gw.clock()
    row = session.get(QuotaRow, project)
    before = quota_json(row)
    if row is None:
        row = QuotaRow(project=project, gpus=0, updated_at=now, updated_by=by)
        session.add(row)
    row.gpus = int(params["gpus"])
    row.borrow_limit = params.get("borrow_limit")
    row.lend_limit = params.get("lend_limit")
    row.users = dict(params.get("users") or {})
    row.effective_from = _parse_time(params.get("effective_from"))
    row.effective_until = _parse_time(params.get("effective_until"))
    row.updated_at, row.updated_by = now, by
    after = quota_json(row)
    session.add(QuotaChange(project=project, before=before or {}, after=after or {}, requested_by=by,
                            approved_by=approved_by, reason=reason, at=now))
    record_outcome(gw, "outcome", {"action": "quota.change", "result": "applied", "project": project,
                                   "decision_seq": decision_seq, "before": before, "after": after,
                                   "effective_from": params.get("effective_from"),
                                   "effective_until": params.get("effective_until"),
                                   "requested_by": by, "approved_by": approved_by})
    gw.execution.changed()
    return {"project": project, "before": before, "after": after}


def _parse_time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def contribution_of(gw: Jobs, user: str) -> float:
    """Q3: the user's historical contribution score from policy data (`contribution` in data.json)."""
    scores = gw.policy_set.data.get("contribution", {})
    value = scores.get(user, scores.get("*", 0)) if isinstance(scores, dict) else 0
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def add_mount(gw: Jobs, session: Session, caller: Caller, name: str, kind: str, path: str,
              projects: list[str], available: bool) -> MountRow:
    """Register or update a mount / data set. Decided by policy as `role.manage` on the whole cluster (platform
    admins hold it; the policy set has no capability of its own for the registry yet) and ledgered.
    Raises PolicyDenied, LedgerUnavailable."""
    rec = decide(gw, session, caller, "role.manage", project=CLUSTER,
                 params={"mount": {"name": name, "kind": kind, "path": path, "projects": projects}})
    refuse_unless_allowed(rec)
    now = gw.clock()
    row = session.get(MountRow, name)
    if row is None:
        row = MountRow(name=name, kind=kind, created_by=caller.real_identity, created_at=now)
        session.add(row)
    row.kind, row.path, row.projects, row.available = kind, path, list(projects), available
    record_outcome(gw, "outcome", {"action": "mount.register", "result": "registered", "decision_seq": rec.seq,
                                   "mount": {"name": name, "kind": kind, "path": path, "projects": projects,
                                             "available": available}})
    return row


def admission_problems(session: Session, now: datetime, *, project: str, owner: str, gpus: int,
                       mounts: list[str], datasets: list[str], submitter: str | None = None,
                       stoppable: bool = True) -> list[str]:
    """Q1: hard quota tiers and declared mounts / data sets that are unknown, unavailable or not allowed. The
    user tier binds the owner and, when someone else submits for them, the submitter too: naming another owner
    must not lift the submitter's own limit. A job that cannot be stopped must fit its tenant's owned quota."""
    problems: list[str] = []
    quotas = load_quotas(session, now)
    if quotas is not None:
        capacity = sum(session.scalars(select(Node.gpus)).all())
        problems += hard_limit_problems(quotas, ProjectId(project), owner, gpus, capacity, stoppable=stoppable)
        if submitter is not None and submitter != owner:
            problems += [p for p in hard_limit_problems(quotas, ProjectId(project), submitter, gpus, capacity,
                                                        stoppable=stoppable)
                         if p not in problems]
    for kind, names in (("mount", mounts), ("dataset", datasets)):
        for name in names:
            row = session.get(MountRow, name)
            if row is None or row.kind != kind:
                problems.append(f"declares {kind} {name!r}, which is not in the registry")
            elif not row.available:
                problems.append(f"{kind} {name!r} is registered but not available")
            elif "*" not in row.projects and project not in row.projects:
                problems.append(f"{kind} {name!r} is not open to project {project}")
    return problems


# What this module carries out once a second person approved it (M2), bound to the running gateway at app
# start (gateway/bootstrap.py).
EXECUTORS = {"quota.change": _change_after_approval}
