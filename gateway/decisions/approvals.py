"""Two-person rule (M2): approval requests bound to a digest, checked and executed in one transaction.

A request the policy marks `needs_approval` becomes an Approval bound to the SHA-256 of (action, exact
sorted target ids, project, parameters, reason, granularity). Approving re-decides the *same* request
with the recorded approvals, inside the transaction that executes it (BEGIN IMMEDIATE on SQLite, a row
lock on PostgreSQL), so a client can neither skip the second person nor widen the target set, and the
action runs exactly once.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import rfc8785
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.decisions import approval_facts, approval_summary
from gateway.decisions.attempts import refused_at
from gateway.decisions.deps import Decider
from gateway.decisions.notifications import notify
from gateway.decisions.pipeline import Recorded, decide, ledger_batch, record, record_outcome
from gateway.errors import Conflict, Forbidden, NotFound, PolicyDenied
from gateway.identity.auth import Caller
from gateway.store.models import Job, Principal
from gateway.store.service_tables import Approval
from gateway.store.states import ENDED_STATES
from ledger.errors import LedgerError

ACTS_ON_ENDED_JOBS = frozenset({"job.delete", "job.confirm_stopped"})  # stop_failed counts as ended

DEFAULT_EXPIRY_S = 3600


def request_digest(action: str, target_ids: Sequence[str], project: str | None, params: Mapping[str, Any],
                   reason: str | None, granularity: str) -> str:
    body = {"action": action, "targets": sorted(target_ids), "project": project, "params": dict(params),
            "reason": reason, "granularity": granularity}
    return hashlib.sha256(rfc8785.dumps(body)).hexdigest()


def _expiry_seconds(gw: Decider) -> float:
    return float(gw.policy_set.data.get("approval", {}).get("expiry_seconds", DEFAULT_EXPIRY_S))


def open_request(
    gw: Decider,
    session: Session,
    caller: Caller,
    rec: Recorded,
    *,
    action: str,
    target_ids: Sequence[str],
    project: str | None,
    params: Mapping[str, Any] | None = None,
    reason: str | None,
    ticket: str | None,
    granularity: str = "job",
    blast_radius: Mapping[str, Any] | None = None,
) -> Approval:
    """Turn a needs_approval decision into a pending approval request; notify who may approve."""
    if action not in gw.executors:
        raise Conflict(f"no executor is registered for {action}; it cannot be approved")
    now = gw.clock()
    ids = sorted(target_ids)
    params = dict(params or {})
    approval = Approval(
        id="apr-" + secrets.token_hex(8),
        action=action,
        target_ids=ids,
        project=project,
        params=params,
        reason=reason,
        ticket=ticket,
        granularity=granularity,
        digest=request_digest(action, ids, project, params, reason, granularity),
        requester=caller.id,
        requester_real=caller.real_identity,
        requester_trigger=caller.trigger,
        state="pending",
        created_at=now,
        expires_at=now + timedelta(seconds=_expiry_seconds(gw)),
        decision_seq=rec.seq,
        required=dict(rec.decision.approvals_required),
        blast_radius=dict(blast_radius or {}),
        approvals=[],
    )
    session.add(approval)
    session.flush()
    record(gw, session, "outcome", {"request_id": rec.request_id, "decision_seq": rec.seq, "action": action,
                                   "result": "approval_requested", "approval_id": approval.id,
                                   "digest": approval.digest, "targets": ids,
                                   "expires_at": approval.expires_at.isoformat()})
    asked = approval_facts.capture(gw, session, approval)
    request = to_json(approval)
    for principal in sorted(_people_to_tell(session, approval)):
        # What they are asked to confirm, in words, as far as they may see it (M2, A1).
        told = approval_facts.for_notice(gw, session, approval, request, asked, principal)
        notify(session, principal, "approval_requested",
               {"approval_id": approval.id, "action": action, "targets": ids, "requester": caller.id,
                "reason": reason, "expires_at": approval.expires_at.isoformat(), "what": told["what"],
                "still_needed": told["still_needed"], "summary": approval_summary.sentence(told)}, now)
    return approval


def _people_to_tell(session: Session, approval: Approval) -> set[str]:
    """Named approvers and the owners of the targets (A4: owner consent; they are told either way)."""
    people = {p for p in approval.required.get("principals", []) if isinstance(p, str)}
    if approval.target_ids:
        people |= set(session.scalars(select(Job.owner).where(Job.id.in_(approval.target_ids))).all())
    people.discard(approval.requester)
    return people


def _tell_closed(session: Session, approval: Approval, kind: str, body: dict[str, Any], now: datetime,
                 besides: str | None = None) -> None:
    """A request closed with nothing done: the requester learns it, and so does everyone who was told of it (the
    owners waiting to hear whether their jobs stop, A4), except `besides`, who closed it."""
    for principal in sorted({approval.requester} | (_people_to_tell(session, approval) - {besides})):
        notify(session, principal, kind, {"approval_id": approval.id, "action": approval.action, **body}, now)


def _load(session: Session, approval_id: str) -> Approval:
    approval = session.scalars(select(Approval).where(Approval.id == approval_id).with_for_update()).first()
    if approval is None:
        raise NotFound(f"no approval request {approval_id!r}")
    return approval


def _requester(session: Session, approval: Approval) -> Caller:
    """The requester as the policy saw them when they asked (the approver does not become the actor)."""
    principal = session.get(Principal, approval.requester)
    if principal is None:  # principals are never deleted; a missing one means a corrupted DB
        raise Conflict(f"requester {approval.requester} no longer exists")
    if principal.disabled:  # as their token would be refused now, so is what they asked for earlier
        raise Conflict(f"requester {approval.requester} is disabled; {approval.id} can no longer be carried out")
    return Caller(id=principal.id, kind=principal.kind, token_id="approval:" + approval.id, token_projects=("*",),
                  token_actions=("*",), responsible=principal.responsible, trigger=approval.requester_trigger)


def expire_due(gw: Decider, session: Session, approval_id: str | None = None) -> list[str]:
    """Close pending requests past their expiry as `expired`, each ledgered once, in the caller's transaction:
    the one request an answer found expired (answering) or, from housekeeping, all. Returns their ids."""
    now = gw.clock()
    stmt = select(Approval).where(Approval.state == "pending", Approval.expires_at <= now)
    if approval_id is not None:
        stmt = stmt.where(Approval.id == approval_id)
    closed = []
    for approval in session.scalars(stmt.order_by(Approval.id).with_for_update()).all():
        approval.state = "expired"
        approval.resolved_at = now
        record_outcome(gw, "outcome", {"action": "approval.expire", "approval_id": approval.id, "result": "expired",
                                       "expires_at": approval.expires_at.isoformat()})
        _tell_closed(session, approval, "approval_expired", {"expired_at": approval.expires_at.isoformat()}, now)
        closed.append(approval.id)
    return closed


@contextmanager
def answering(gw: Decider, approval_id: str) -> Iterator[Session]:
    """The transaction of an approve or reject. A request it finds past its expiry is closed and ledgered as
    expired after that transaction's 409 has rolled back, in a transaction of its own: closed inside it, the
    rollback undid the closing, so the request stayed pending while the ledger said, once per attempt, that it
    had expired. An answer in time pays for no second transaction."""
    try:
        with gw.transaction() as session:
            yield session
    except Conflict as e:
        if e.extra.get("state") == "expired":
            with gw.transaction() as session:
                expire_due(gw, session, approval_id)
        raise


def _check_open(gw: Decider, approval: Approval, now: datetime) -> None:
    if approval.state in ("pending", "expired") and approval.expires_at <= now:
        # `answering` closes it once this 409 has rolled back (or housekeeping does).
        raise Conflict(f"approval {approval.id} expired at {approval.expires_at.isoformat()}", state="expired")
    if approval.state != "pending":
        raise Conflict(f"approval {approval.id} is already {approval.state}", state=approval.state)
    expected = request_digest(approval.action, approval.target_ids, approval.project, approval.params,
                              approval.reason, approval.granularity)
    if expected != approval.digest:
        raise Conflict(f"approval {approval.id} no longer matches its digest; the request was altered")


def approver_record(gw: Decider, caller: Caller, targets: Sequence[Job], now: datetime) -> dict[str, Any]:
    """What the policy needs to judge an approval: who, when, roles per project, which targets they own."""
    return {
        "by": caller.real_identity,
        "principal": caller.id,
        "at": now.isoformat(),
        "roles_by_project": gw.policy.roles_of(caller.real_identity),
        "is_owner_of": sorted(j.id for j in targets if j.owner == caller.real_identity),
    }


def _check_second_person(caller: Caller, approval: Approval) -> None:
    """The second person is a person other than the requester (or the person behind them), approving once (M2,
    F1): a pipeline's token approving as its responsible person would automate the confirmation. Raises
    Forbidden, or Conflict for a second approval by the same person."""
    if caller.id == approval.requester or caller.real_identity == approval.requester_real:
        raise Forbidden(f"{caller.id} asked for this action; a second person must approve it (M2)")
    if caller.kind != "person":
        raise Forbidden(f"{caller.id} is a {caller.kind} identity; only a person can be the second person (M2)")
    if any(a["by"] == caller.real_identity for a in approval.approvals):
        raise Conflict(f"{caller.real_identity} already approved {approval.id}")


def _check_approver_scope(caller: Caller, approval: Approval, target_projects: set[str]) -> None:
    """The credential is scoped to approve in every affected project: a token its holder narrowed (to job.view,
    to one project) must not confirm a stop elsewhere. Raises Forbidden."""
    projects = ({approval.project} if approval.project else set()) | target_projects
    caller.check_scope("approval.grant", sorted(projects) or ["*"])


def _missing(rec: Recorded) -> int:
    """Approvals a decision still waits for (none unless it is needs_approval)."""
    if rec.decision.effect != "needs_approval":
        return 0
    return int(rec.decision.approvals_required.get("count", 0))


def _missing_before(approval: Approval, judge: Callable[..., Recorded], judged: list[dict[str, Any]]) -> int:
    """Approvals the request waited for before the caller's (the last of `judged`), judged as it is judged now."""
    if not approval.approvals:
        return int(approval.required.get("count", 1))
    return _missing(judge(judged[:-1], record=False))


def approve(gw: Decider, session: Session, caller: Caller, approval_id: str, comment: str | None) -> Approval:
    """Add the caller's approval; execute once enough approvals are recorded.

    Raises NotFound, Conflict (expired, already resolved, digest mismatch), Forbidden (self-approval,
    ineligible approver), PolicyDenied (the request is now denied), LedgerUnavailable.
    """
    now = gw.clock()
    approval = _load(session, approval_id)
    try:
        _check_open(gw, approval, now)
        _check_second_person(caller, approval)  # before any target row is locked
        all_targets = list(session.scalars(select(Job).where(Job.id.in_(approval.target_ids))
                                           .order_by(Job.id).with_for_update()).all())
        # Against the rows just read, not a query of its own.
        _check_approver_scope(caller, approval, {j.project for j in all_targets})
    except (Forbidden, Conflict) as e:
        # A confirmation refused (the request closed or altered, the caller no second person) is an attempt on
        # someone else's job like any other: in the ledger (H3).
        refused_at(e, record_outcome(gw, "outcome", {
            "action": "approval.grant", "approval_id": approval.id, "result": "refused", "operator": caller.id,
            "real_identity": caller.real_identity, "reason": e.detail}))
        raise
    # Never widen: only the approved ids, and of those only the ones still running.
    # Deleting acts on ended jobs; for every other action a job that ended meanwhile is skipped.
    ended = () if approval.action in ACTS_ON_ENDED_JOBS else ENDED_STATES
    live = [j for j in all_targets if j.state not in ended]
    skipped = [{"id": j.id, "state": j.state} for j in all_targets if j.state in ended]
    mine = {**approver_record(gw, caller, all_targets, now), "comment": comment}
    approvals = [*approval.approvals, mine]
    # Earlier approvals count with their approvers' roles of now, not of when they approved: one who has lost
    # the role since, or been disabled, is no longer an eligible second person (M2). The stored records keep
    # what they held then. The caller's own record is last (judged[:-1] below leaves it out).
    disabled = set(session.scalars(select(Principal.id).where(Principal.id.in_([a["by"] for a in approvals]),
                                                              Principal.disabled.is_(True))).all())
    judged = [{**a, "roles_by_project": gw.policy.roles_of(a["by"])} for a in approvals if a["by"] not in disabled]
    requester = _requester(session, approval)

    def judge(given: list[dict[str, Any]], **how: Any) -> Recorded:
        return decide(gw, session, requester, approval.action, targets=live, project=approval.project,
                      params=approval.params, reason=approval.reason, ticket=approval.ticket,
                      granularity=approval.granularity, approvals=given, **how)

    rec = judge(judged, context={"approval_id": approval.id, "approver": caller.to_json()}, rate_limited=False,
                durable_by_commit=True)
    effect = rec.decision.effect
    missing_now = _missing(rec)
    # Something would be carried out: live targets, or a request that names none (A7 quota change, break-glass),
    # which the executor runs once. A deny then stands; only a request whose every target ended meanwhile
    # closes below with nothing done.
    runs = bool(live) or not approval.target_ids
    if effect == "deny" and runs:
        raise PolicyDenied(" ".join(rec.decision.reasons) or "denied by policy", reasons=list(rec.decision.reasons),
                           rules=list(rec.decision.rules), ledger_seq=rec.seq)
    # A request still waiting: what was missing without the caller, judged the same way (an earlier approval may
    # count no more), so that the caller is refused only if their own approval changes nothing. Asked only here:
    # an approval that completes the request, or one refused, needs no second decision.
    if effect == "needs_approval" and missing_now >= _missing_before(approval, judge, judged):
        eligible = rec.decision.approvals_required
        raise Forbidden(
            f"{caller.real_identity} is not an eligible approver for {approval.id}: it needs"
            f" {', '.join(eligible.get('roles', [])) or 'a named person'}"
            f" in {', '.join(eligible.get('projects', [])) or 'the affected projects'}"
            + (f" or one of {', '.join(eligible.get('principals', []))}" if eligible.get("principals") else ""),
            ledger_seq=rec.seq,
        )
    approval.approvals = approvals
    approval.required = dict(rec.decision.approvals_required) if effect == "needs_approval" else {"count": 0}
    if effect == "needs_approval":
        record(gw, session, "outcome", {"request_id": rec.request_id, "decision_seq": rec.seq,
                                       "action": approval.action, "approval_id": approval.id,
                                       "result": "approval_recorded", "missing": missing_now})
        return approval
    # Project-level actions (quota.change) have no target jobs and still execute once (A7).
    # The executor carries out the final decision's obligations (e.g. notify the owner first).
    approval.resolution = {"obligations": [dict(o) for o in rec.decision.obligations]}
    # The executor's outcome entries and ours go to the ledger together: one wait, before the commit.
    with ledger_batch(gw, session):
        result = gw.executors[approval.action](session, approval, live, caller) if runs else {}
        approval.state = "executed"
        approval.resolved_at = now
        approval.resolved_by = caller.real_identity
        approval.resolution = {"result": result, "skipped": skipped, "decision_seq": rec.seq}
        record(gw, session, "outcome", {"request_id": rec.request_id, "decision_seq": rec.seq,
                                        "action": approval.action, "approval_id": approval.id, "result": "executed",
                                        "executed_on": [j.id for j in live], "skipped": skipped,
                                        "approvers": [a["by"] for a in approvals]})
    notify(session, approval.requester, "approval_executed",
           {"approval_id": approval.id, "action": approval.action, "skipped": skipped}, now)
    return approval


def reject(gw: Decider, session: Session, caller: Caller, approval_id: str, reason: str) -> Approval:
    """Refuse (or, for the requester, withdraw) a pending request. Raises NotFound, Conflict, Forbidden."""
    now = gw.clock()
    approval = _load(session, approval_id)
    # The requester withdraws, or the person behind the service account that asked; never the other way round.
    withdrawn = caller.id in (approval.requester, approval.requester_real)
    try:
        _check_open(gw, approval, now)
        if not withdrawn:
            _check_refuser(gw, session, caller, approval)
    except (Forbidden, Conflict) as e:
        refused_at(e, record_outcome(gw, "outcome", {
            "action": "approval.reject", "approval_id": approval.id, "result": "refused", "operator": caller.id,
            "real_identity": caller.real_identity, "reason": e.detail}))
        raise
    approval.state = "rejected"
    approval.resolved_at = now
    approval.resolved_by = caller.real_identity
    approval.resolution = {"reason": reason, "withdrawn": withdrawn}
    record_outcome(gw, "outcome", {"action": approval.action, "approval_id": approval.id, "result": "rejected",
                                   "by": caller.to_json(), "reason": reason})
    _tell_closed(session, approval, "approval_rejected", {"by": caller.real_identity, "reason": reason}, now,
                 besides=caller.real_identity)
    return approval


def _check_refuser(gw: Decider, session: Session, caller: Caller, approval: Approval) -> None:
    """Refusing someone else's request is the second person's other answer, held to the same bar: a person
    (a pipeline must not veto as its responsible person), eligible to approve it, with a credential covering
    approval.grant in every affected project. Raises Forbidden."""
    if caller.kind != "person":
        raise Forbidden(f"{caller.id} is a {caller.kind} identity; only a person can refuse a request (M2)")
    if not may_approve(gw, session, caller, approval):
        raise Forbidden(f"{caller.id} may neither approve nor withdraw {approval.id}")
    projects = set(session.scalars(select(Job.project).where(Job.id.in_(approval.target_ids))).all())
    _check_approver_scope(caller, approval, projects)


def withdraw_made_with(gw: Decider, session: Session, token_id: str, principal: str, by: str) -> list[str]:
    """Close the pending requests a token made, now that it is revoked: a token revoked because it leaked must not
    leave behind requests that a second person, unaware, then carries out. Which token made a request is in its
    decision's ledger entry. Returns the ids closed."""
    now = gw.clock()
    closed = []
    pending = select(Approval).where(Approval.state == "pending", Approval.requester == principal)
    for approval in session.scalars(pending.order_by(Approval.id).with_for_update()).all():
        try:
            actor = gw.ledger.entry(approval.decision_seq).value["body"]["actor"]
        except (LedgerError, KeyError, TypeError):
            continue  # not a decision this gateway recorded (a request from before tokens were named): left open
        if not isinstance(actor, dict) or actor.get("token_id") != token_id:
            continue
        reason = f"the requester's token {token_id} was revoked"
        approval.state, approval.resolved_at, approval.resolved_by = "rejected", now, by
        approval.resolution = {"reason": reason, "withdrawn": True, "token_revoked": token_id}
        record_outcome(gw, "outcome", {"action": approval.action, "approval_id": approval.id, "result": "rejected",
                                       "by": by, "reason": reason})
        _tell_closed(session, approval, "approval_rejected", {"by": by, "reason": reason}, now)
        closed.append(approval.id)
    return closed


def may_approve(gw: Decider, session: Session, caller: Caller, approval: Approval) -> bool:
    """Could the caller be a second person here: named, an owner of a target, or holding approval.grant?"""
    who = caller.real_identity
    if who in approval.required.get("principals", []):
        return True
    # A role the policy named as eligible, held where it asked for it ("*" = a global binding).
    wanted = set(approval.required.get("roles", []))
    held = gw.policy.roles_of(who)
    if any(wanted & set(held.get(p, [])) for p in approval.required.get("projects", [])):
        return True
    projects = set(approval.required.get("projects", [])) | ({approval.project} if approval.project else set())
    targets = list(session.scalars(select(Job).where(Job.id.in_(approval.target_ids))).all())
    if any(j.owner == who for j in targets):
        return True
    projects |= {j.project for j in targets}
    return any("approval.grant" in gw.policy.capabilities(who, p) for p in projects or {"*"})


def visible_to(gw: Decider, session: Session, caller: Caller, state: str | None) -> list[Approval]:
    """Requests the caller made or could approve; auditors (ledger.read) see all."""
    stmt = select(Approval).order_by(Approval.created_at.desc())
    if state:
        stmt = stmt.where(Approval.state == state)
    rows = list(session.scalars(stmt.limit(500)).all())
    if "ledger.read" in gw.policy.capabilities(caller.real_identity, "*"):
        return rows
    return [a for a in rows if a.requester_real == caller.real_identity or may_approve(gw, session, caller, a)]


def visible_one(gw: Decider, session: Session, caller: Caller, approval_id: str) -> Approval:
    """One request, however old, to the same people `visible_to` shows it to. Raises NotFound."""
    approval = session.get(Approval, approval_id)
    if approval is None or not (approval.requester_real == caller.real_identity
                                or "ledger.read" in gw.policy.capabilities(caller.real_identity, "*")
                                or may_approve(gw, session, caller, approval)):
        raise NotFound(f"no approval request {approval_id!r} visible to {caller.id}")
    return approval


def to_json(approval: Approval) -> dict[str, Any]:
    return {
        "id": approval.id,
        "action": approval.action,
        "state": approval.state,
        "targets": approval.target_ids,
        "project": approval.project,
        "params": approval.params,
        "reason": approval.reason,
        "ticket": approval.ticket,
        "granularity": approval.granularity,
        "digest": approval.digest,
        "requester": approval.requester,
        "requester_real": approval.requester_real,
        "created_at": approval.created_at.isoformat(),
        "expires_at": approval.expires_at.isoformat(),
        "decision_seq": approval.decision_seq,
        "required": approval.required,
        "blast_radius": approval.blast_radius,
        "approvals": approval.approvals,
        "resolved_at": approval.resolved_at.isoformat() if approval.resolved_at else None,
        "resolved_by": approval.resolved_by,
        "resolution": approval.resolution,
    }


def with_summaries(gw: Decider, session: Session, viewer: Caller, items: Sequence[Approval]) -> list[dict[str, Any]]:
    """to_json of each request with its `summary` for this viewer (gateway/decisions/approval_summary.py): the action,
    every parameter before → after, targets, blast radius and who must still approve, in words."""
    requests = [to_json(a) for a in items]
    return [{**r, "summary": s} for r, s in zip(requests, approval_facts.summaries(gw, session, viewer, items,
                                                                                  requests), strict=True)]


def figures(session: Session, now: datetime) -> Iterator[Metric]:
    """/metrics: approval requests waiting for a second person, per action."""
    pending = GaugeMetricFamily("jobgate_approvals_pending", "Approval requests waiting for a second person",
                                labels=["action"])
    for action, n in session.execute(select(Approval.action, func.count()).where(Approval.state == "pending")
                                     .group_by(Approval.action)).all():
        pending.add_metric([action], n)
    yield pending
