"""Role bindings as data (M1): grant, revoke and list, by a holder of `role.manage` (platform admin).

A binding is (principal, role, project); project "*" binds a global role such as on-call. Roles are the
capability bundles of policies/matrix.csv, never departments. Each change is decided and recorded in
the ledger (decision, then outcome) and applied to the role_bindings table and to the live policy
engine together: the engine change is undone if the transaction does not commit, and both happen under
gw.policy_lock so a concurrent policy reload cannot read the table half-way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.access.deps import Access
from gateway.decisions.pipeline import decide, record_outcome
from gateway.decisions.policy.engine import RoleBinding
from gateway.decisions.verdict import refuse_unless_allowed
from gateway.errors import Conflict, Invalid, NotFound
from gateway.identity.auth import Caller
from gateway.store.models import Principal, Project
from gateway.store.models import RoleBinding as RoleBindingRow

GLOBAL = "*"


@dataclass(frozen=True)
class BindingChange:
    """What a grant or revoke did, for the response."""

    binding: RoleBinding
    result: str  # granted | revoked
    decision_seq: int
    outcome_seq: int
    request_id: str

    def to_json(self) -> dict[str, Any]:
        b = self.binding
        return {"principal": b.principal, "role": b.role, "project": b.project, "result": self.result,
                "decision_seq": self.decision_seq, "outcome_seq": self.outcome_seq, "request_id": self.request_id}


def known_roles(gw: Access) -> set[str]:
    """Roles the active matrix defines."""
    return {row.role for row in gw.policy_set.matrix}


def validate(gw: Access, session: Session, b: RoleBinding) -> None:
    """Raises Invalid naming the unknown principal, role or project."""
    problems = []
    principal = session.get(Principal, b.principal)
    if principal is None:
        problems.append(f"unknown principal {b.principal!r}")
    elif principal.kind == "node":
        problems.append(f"{b.principal!r} is a node identity; nodes hold no roles")
    roles = known_roles(gw)
    if b.role not in roles:
        problems.append(f"unknown role {b.role!r} (the matrix defines {', '.join(sorted(roles))})")
    if b.project != GLOBAL and session.get(Project, b.project) is None:
        problems.append(f"unknown project {b.project!r}")
    if problems:
        raise Invalid("; ".join(problems), problems=problems)


def _decide(gw: Access, session: Session, caller: Caller, verb: str, b: RoleBinding, reason: str | None) -> Any:
    rec = decide(gw, session, caller, "role.manage", project=b.project,
                 params={"change": verb, "principal": b.principal, "role": b.role, "project": b.project},
                 reason=reason)
    refuse_unless_allowed(rec)
    return rec


def _find(session: Session, b: RoleBinding) -> RoleBindingRow | None:
    return session.scalars(select(RoleBindingRow).where(
        RoleBindingRow.principal_id == b.principal, RoleBindingRow.role == b.role,
        RoleBindingRow.project == b.project)).first()


def change(gw: Access, authenticate: Callable[[Session], Caller], verb: str, b: RoleBinding,
           reason: str | None) -> BindingChange:
    """Grant (verb "grant") or revoke a binding in one transaction with the engine.

    Raises Invalid (unknown principal/role/project), PolicyDenied, Conflict (already bound),
    NotFound (no such binding to revoke), LedgerUnavailable. The caller is authenticated inside the transaction.
    """
    applied = False
    with gw.policy_lock:
        engine = gw.policy
        try:
            with gw.transaction() as session:
                caller = authenticate(session)
                validate(gw, session, b)
                rec = _decide(gw, session, caller, verb, b, reason)
                row = _find(session, b)
                if verb == "grant":
                    if row is not None:
                        raise Conflict(f"{b.principal} already holds {b.role} in {b.project}")
                    session.add(RoleBindingRow(principal_id=b.principal, role=b.role, project=b.project,
                                               created_at=gw.clock()))
                else:
                    if row is None:
                        raise NotFound(f"{b.principal} holds no {b.role} binding in {b.project}")
                    session.delete(row)
                session.flush()
                gw.policy_sync.bindings_changed(session)  # every other replica reads them before it decides
                result = "granted" if verb == "grant" else "revoked"
                outcome = record_outcome(gw, "outcome", {
                    "request_id": rec.request_id, "decision_seq": rec.seq, "action": f"role.{verb}",
                    "result": result, "binding": {"principal": b.principal, "role": b.role, "project": b.project},
                    "by": caller.id, "reason": reason})
                (engine.grant if verb == "grant" else engine.revoke)(b)
                applied = True
        except BaseException:
            if applied:  # the commit failed after the engine changed: put the engine back
                (engine.revoke if verb == "grant" else engine.grant)(b)
            raise
    return BindingChange(b, result, rec.seq, outcome, rec.request_id)


def list_bindings(gw: Access, authenticate: Callable[[Session], Caller], principal: str | None,
                  project: str | None) -> list[dict[str, Any]]:
    """Bindings, filtered. Needs role.manage (read decisions are not recorded). Raises PolicyDenied."""
    with gw.transaction() as session:
        caller = authenticate(session)
        refuse_unless_allowed(decide(gw, session, caller, "role.manage", project=project or GLOBAL, record=False))
        stmt = select(RoleBindingRow).order_by(RoleBindingRow.principal_id, RoleBindingRow.project,
                                               RoleBindingRow.role)
        if principal:
            stmt = stmt.where(RoleBindingRow.principal_id == principal)
        if project:
            stmt = stmt.where(RoleBindingRow.project == project)
        return [{"principal": r.principal_id, "role": r.role, "project": r.project,
                 "created_at": r.created_at.isoformat()} for r in session.scalars(stmt).all()]
