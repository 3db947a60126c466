"""The facts an approval request's summary is made of: as they stood when it was asked, and as they stand now.

"Before" must be the value the requester saw and the policy decided on, not whatever it has become by the time a
second person looks: a priority that has aged since, a quota someone changed meanwhile, a recovery window a
policy reload moved. So `capture` keeps them beside the request (table approval_snapshots, written in the
request's own transaction), `current` reads them again, and gateway/decisions/approval_summary.py puts both side
by side.
A request made before this table existed has no row: its summary says that no before values were kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions import approval_summary
from gateway.decisions.deps import Decider
from gateway.decisions.facts import priority_standing, recovery_window
from gateway.decisions.pipeline import visible_projects
from gateway.identity.auth import Caller
from gateway.store.models import Job, Principal
from gateway.store.scheduler_tables import QuotaRow
from gateway.store.service_tables import Approval, ApprovalSnapshot
from gateway.store.stop_tables import JobDeletion


def _checkpoints(job: Job) -> list[str]:
    """Checkpoint files the job's stop evidence lists, `path (node)`, in node order."""
    out = []
    for node, ev in sorted((job.evidence.get("nodes") or {}).items()):
        for c in (ev or {}).get("checkpoints") or []:
            if isinstance(c, dict) and c.get("path"):
                out.append(f"{c['path']} ({node})")
    return out


def _target_facts(gw: Decider, session: Session, action: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    jobs = list(session.scalars(select(Job).where(Job.id.in_(list(ids)))).all()) if ids else []
    standing = priority_standing(session, [j.id for j in jobs]) if action == "job.priority" else {}
    out: dict[str, dict[str, Any]] = {}
    for job in jobs:
        facts: dict[str, Any] = {"name": job.name, "project": job.project, "owner": job.owner, "state": job.state,
                                 "gpus": job.gpus_per_node * job.nodes, "grace_seconds": job.grace_seconds,
                                 "stop_signal": job.stop_signal}
        if job.id in standing:
            facts["priority"] = standing[job.id][0]
        if action == "job.delete":
            facts["checkpoints"] = _checkpoints(job)
            facts["file_nodes"] = gw.execution.holders(session, job)
        out[job.id] = facts
    return out


def _deletions(session: Session, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    rows = session.scalars(select(JobDeletion).where(JobDeletion.job_id.in_(list(ids)))).all()
    return {r.job_id: {"state_before": r.state_before, "purge_after": r.purge_after.isoformat(), "state": r.state}
            for r in rows}


def _quota(session: Session, project: str | None) -> dict[str, Any] | None:
    row = session.get(QuotaRow, project) if project else None
    if row is None:
        return None
    return {"gpus": row.gpus, "borrow_limit": row.borrow_limit, "lend_limit": row.lend_limit,
            "users": dict(row.users or {}),
            "effective_from": row.effective_from.isoformat() if row.effective_from else None,
            "effective_until": row.effective_until.isoformat() if row.effective_until else None}


def current(gw: Decider, session: Session, approval: Approval) -> dict[str, Any]:
    """The facts a summary compares against now: each target's state (and priority for a priority change), a
    deleted job's recovery window, the quota row a quota change would replace. Raises nothing of its own."""
    facts: dict[str, Any] = {"targets": _target_facts(gw, session, approval.action, approval.target_ids)}
    if approval.action == "job.delete":
        facts["recovery_window_days"] = recovery_window(gw).days
    if approval.action == "job.undelete":
        facts["deletions"] = _deletions(session, approval.target_ids)
    if approval.action == "quota.change":
        facts["quota"] = _quota(session, approval.project)
    return facts


def capture(gw: Decider, session: Session, approval: Approval) -> dict[str, Any]:
    """Keep the facts as they stand now, in the caller's transaction, beside a request just opened. Returns them."""
    facts = current(gw, session, approval)
    session.add(ApprovalSnapshot(approval_id=approval.id, taken_at=gw.clock(), facts=facts))
    return facts


def as_asked(session: Session, approval_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The kept facts of these requests, by id (those made before snapshots were kept have none)."""
    if not approval_ids:
        return {}
    rows = session.scalars(select(ApprovalSnapshot).where(ApprovalSnapshot.approval_id.in_(list(approval_ids))))
    return {r.approval_id: dict(r.facts) for r in rows}


def _person(session: Session, principal: str) -> Caller | None:
    """Whom a notice goes to, as a caller, to ask the policy what they may see. None if unknown."""
    p = session.get(Principal, principal)
    if p is None:
        return None
    return Caller(id=p.id, kind=p.kind, token_id="notice", token_projects=("*",), token_actions=("*",),
                  responsible=p.responsible)


class Summaries:
    """Summaries of requests for one viewer, reusing what the policy said they may see across the requests of
    one answer (a list of 500 asks it once per project, not once per request)."""

    def __init__(self, gw: Decider, session: Session, viewer: Caller | None) -> None:
        self.gw, self.session, self.viewer = gw, session, viewer
        self._seen: dict[str, bool] = {}

    def visible(self, projects: set[str]) -> set[str] | None:
        if self.viewer is None:
            return set()
        unknown = sorted(p for p in projects if p not in self._seen)
        allowed = visible_projects(self.gw, self.session, self.viewer, unknown) if unknown else set()
        self._seen.update({p: p in allowed for p in unknown})
        return {p for p in projects if self._seen[p]}

    def of(self, approval: Approval, request: dict[str, Any], asked: dict[str, Any] | None) -> dict[str, Any]:
        """One request's summary (approval_summary.summarize) for this viewer. Raises nothing of its own."""
        now = current(self.gw, self.session, approval)
        facts = asked or {}
        projects = {str(t.get("project")) for t in [*(facts.get("targets") or {}).values(),
                                                   *(now.get("targets") or {}).values()] if t.get("project")}
        return approval_summary.summarize(request, facts, now, clock=self.gw.clock(), visible=self.visible(projects))


def summaries(gw: Decider, session: Session, viewer: Caller | None, items: Sequence[Approval],
              requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary of each request in `items` (with its to_json in `requests`) for `viewer`."""
    kept = as_asked(session, [a.id for a in items])
    s = Summaries(gw, session, viewer)
    return [s.of(a, r, kept.get(a.id)) for a, r in zip(items, requests, strict=True)]


def for_notice(gw: Decider, session: Session, approval: Approval, request: dict[str, Any], asked: dict[str, Any],
               principal: str) -> dict[str, Any]:
    """The summary a notice to `principal` carries: what they may see of it, decided for them."""
    return Summaries(gw, session, _person(session, principal)).of(approval, request, asked)
