"""Break-glass grants (F2, F3, H1): a temporary, one-time credential for on-call troubleshooting.

An on-call engineer asks for a grant (projects, actions, at most 4 hours, a reason and a ticket); the
policy decides whether a second on-call must approve. The credential (`jgb_...`) is shown once, is usable
for its stated number of calls or until it expires, whichever comes first, and then stops working by
itself — the expiry is written to the ledger as a revocation. Every call made with it still goes through
the decision pipeline: the grant only stands in for the second person (one: a request that needs more people
waits for all of them), it is ledgered with
`bypass: true`, and it raises an alert (log line, Prometheus counter, optional webhook).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.access.deps import Access
from gateway.decisions.approvals import open_request
from gateway.decisions.pipeline import decide, record_outcome
from gateway.decisions.verdict import refuse_if_denied
from gateway.errors import Conflict, Forbidden, Invalid, NotFound, Unauthenticated
from gateway.identity.auth import Caller, refuse_unknown_actions
from gateway.identity.tokens import hash_token
from gateway.metrics import BREAK_GLASS_USES
from gateway.store.models import Job, Principal, Project
from gateway.store.service_tables import Approval, BreakGlassGrant

log = logging.getLogger("jobgate.alert")

PREFIX = "jgb_"
PATTERN = re.compile(r"^jgb_[A-Za-z0-9_-]{32,64}$")
MAX_DURATION = timedelta(hours=4)


def grant_json(g: BreakGlassGrant) -> dict[str, Any]:
    return {"id": g.id, "holder": g.holder, "projects": g.projects, "actions": g.actions, "reason": g.reason,
            "ticket": g.ticket, "duration_seconds": g.duration_s, "max_uses": g.max_uses, "uses": g.uses,
            "state": g.state, "created_at": g.created_at.isoformat(),
            "activated_at": g.activated_at.isoformat() if g.activated_at else None,
            "expires_at": g.expires_at.isoformat() if g.expires_at else None,
            "revoked_at": g.revoked_at.isoformat() if g.revoked_at else None,
            "revoked_because": g.revoked_because, "approval_id": g.approval_id}


def request_grant(gw: Access, session: Session, caller: Caller, *, projects: list[str], actions: list[str],
                  duration: timedelta, max_uses: int, reason: str, ticket: str) -> tuple[BreakGlassGrant, str]:
    """Ask for a grant; returns it with its one-time credential (shown once). Raises Invalid, PolicyDenied."""
    if caller.kind != "person" or caller.token_id.startswith("bg-"):
        raise Forbidden("break-glass grants are requested by a person with their own token")
    # The grant acts without the policy's confirmations: a token narrowed to one project must not ask for one
    # that reaches every project and action.
    caller.check_hands_on("a break-glass grant it asks for", projects, actions)
    if duration > MAX_DURATION or duration <= timedelta(0):
        raise Invalid(f"a break-glass grant lasts more than 0 and at most {MAX_DURATION}; asked for {duration}")
    unknown = sorted(p for p in projects if p != "*" and session.get(Project, p) is None)
    if unknown:
        raise Invalid(f"unknown project(s): {', '.join(unknown)}")
    refuse_unknown_actions(actions)
    params = {"projects": sorted(projects), "actions": sorted(actions), "duration_seconds": duration.total_seconds(),
              "max_uses": max_uses}
    rec = decide(gw, session, caller, "breakglass.request", project=None, params=params, reason=reason,
                 ticket=ticket)
    refuse_if_denied(rec)
    secret = PREFIX + secrets.token_urlsafe(32)
    grant = BreakGlassGrant(id="bg-" + secrets.token_hex(8), holder=caller.id, credential_hash=hash_token(secret),
                            projects=sorted(projects), actions=sorted(actions), reason=reason, ticket=ticket,
                            duration_s=duration.total_seconds(), max_uses=max_uses, state="pending",
                            created_at=gw.clock())
    session.add(grant)
    session.flush()
    if rec.decision.effect == "needs_approval":
        approval = open_request(gw, session, caller, rec, action="breakglass.request", target_ids=[],
                                project=None, params={**params, "grant_id": grant.id}, reason=reason, ticket=ticket)
        grant.approval_id = approval.id
    else:
        _activate(gw, grant)
    record_outcome(gw, "break_glass", {"grant_id": grant.id, "holder": caller.id, "result": grant.state,
                                       "decision_seq": rec.seq, **params})
    return grant, secret


def _activate(gw: Access, grant: BreakGlassGrant) -> None:
    now = gw.clock()
    grant.state = "active"
    grant.activated_at = now
    grant.expires_at = now + timedelta(seconds=grant.duration_s)


def _activate_after_approval(gw: Access, session: Session, approval: Approval, targets: list[Job],
                             approver: Caller) -> dict[str, Any]:
    grant = session.get(BreakGlassGrant, approval.params["grant_id"])
    if grant is None or grant.state != "pending":
        raise Conflict(f"break-glass grant {approval.params['grant_id']} is not waiting for approval")
    _activate(gw, grant)
    record_outcome(gw, "break_glass", {"grant_id": grant.id, "result": "active", "approved_by": approver.real_identity,
                                       "expires_at": grant.expires_at.isoformat() if grant.expires_at else None})
    return {"grant_id": grant.id, "expires_at": grant.expires_at.isoformat() if grant.expires_at else None}


def _revoke(gw: Access, grant: BreakGlassGrant, because: str, by: str) -> None:
    """Close a grant and record the revocation (expiry included) in the ledger."""
    grant.state = "revoked"
    grant.revoked_at = gw.clock()
    grant.revoked_because = because
    record_outcome(gw, "break_glass", {"grant_id": grant.id, "holder": grant.holder, "result": "revoked",
                                       "because": because, "by": by, "uses": grant.uses})


def _spent(grant: BreakGlassGrant, now: datetime) -> str | None:
    if grant.state == "active" and grant.expires_at is not None and grant.expires_at <= now:
        return "expired"
    if grant.state == "active" and grant.uses >= grant.max_uses:
        return "uses_exhausted"
    return None


def settle_credential(gw: Access, secret: str, *, source: dict[str, Any]) -> str:
    """Before a break-glass call: count it as one use of its grant, ledger the use and raise the alert (F3);
    or, if the grant has run out, record the revocation and refuse (401).

    Runs in a transaction of its own, which commits whatever the call then does: every call made with the
    credential is a use, in the ledger, even one refused later, a read, or one that fails, so the uses the
    grant shows are the calls the ledger lists. The grant's row is locked (the write lock on SQLite, FOR
    UPDATE on PostgreSQL), so concurrent calls never spend more than max_uses. Returns the grant's id.
    Raises Unauthenticated.
    """
    if not PATTERN.match(secret):
        raise Unauthenticated("malformed break-glass credential")
    with gw.transaction() as session:
        grant = session.scalars(select(BreakGlassGrant).where(BreakGlassGrant.credential_hash == hash_token(secret))
                                .with_for_update()).first()
        if grant is None:
            raise Unauthenticated("unknown break-glass credential")
        because = _spent(grant, gw.clock())
        if because:
            _revoke(gw, grant, because, by="system")
        elif grant.state == "active":
            holder = session.get(Principal, grant.holder)
            if holder is None or holder.disabled:
                raise Unauthenticated(f"holder {grant.holder} of {grant.id} is disabled")
            grant.uses += 1
            event = {"grant_id": grant.id, "holder": grant.holder, "use": grant.uses, "max_uses": grant.max_uses,
                     "source": source}
            record_outcome(gw, "break_glass", {**event, "result": "used", "bypass": True})
            alert(gw, {"alert": "break_glass_use", **event})
    if grant.state == "pending":
        raise Unauthenticated(f"break-glass grant {grant.id} is waiting for a second on-call's approval")
    if grant.state != "active":
        raise Unauthenticated(f"break-glass grant {grant.id} is revoked ({grant.revoked_because})")
    return grant.id


def caller_for(gw: Access, session: Session, grant_id: str, *, source: dict[str, Any]) -> Caller:
    """The caller of a break-glass call whose use settle_credential counted. Raises Unauthenticated."""
    grant = session.get(BreakGlassGrant, grant_id)
    # Only a revocation by a person since then refuses the call: its use was counted while the grant was good,
    # and may have been the last one (a concurrent call then revokes the grant as spent).
    if grant is None or grant.revoked_because == "revoked":
        raise Unauthenticated("break-glass credential is not usable")
    holder = session.get(Principal, grant.holder)
    if holder is None or holder.disabled:
        raise Unauthenticated(f"holder {grant.holder} of {grant.id} is disabled")
    return Caller(id=holder.id, kind=holder.kind, token_id=grant.id, token_projects=tuple(grant.projects),
                  token_actions=tuple(grant.actions), source=source, breakglass=grant.id)


def alert(gw: Access, event: dict[str, Any]) -> None:
    """F3: a bypass is never silent — structured log line, counter, and the webhook if configured."""
    log.warning(json.dumps(event, sort_keys=True))
    BREAK_GLASS_USES.labels(event.get("holder", "?")).inc()
    url = gw.settings.alert_webhook_url
    if url:
        def post() -> None:
            try:
                httpx.post(url, json=event, timeout=5)
            except httpx.HTTPError as e:  # the alert is also in the log and the counter; note the miss
                log.error(json.dumps({"alert": "webhook_failed", "url": url, "error": str(e)}))

        threading.Thread(target=post, name="jobgate-alert", daemon=True).start()


def revoke(gw: Access, session: Session, caller: Caller, grant_id: str) -> BreakGlassGrant:
    """The holder or a security reviewer ends a grant early. Raises NotFound, Conflict."""
    grant = session.get(BreakGlassGrant, grant_id)
    reviewer = "policy.reload" in gw.policy.capabilities(caller.real_identity, "*")
    if grant is None or (grant.holder != caller.real_identity and not reviewer):
        raise NotFound(f"no break-glass grant {grant_id!r} visible to {caller.id}")
    if grant.state == "revoked":
        raise Conflict(f"grant {grant_id} was already revoked ({grant.revoked_because})")
    _revoke(gw, grant, "revoked", by=caller.real_identity)
    return grant


def sweep_expired(gw: Access, session: Session) -> int:
    """Housekeeping: grants that ran out are revoked and the revocation ledgered, even if never used again."""
    now = gw.clock()
    spent = [(g, b) for g in session.scalars(select(BreakGlassGrant).where(BreakGlassGrant.state == "active")).all()
             if (b := _spent(g, now))]
    for grant, because in spent:
        _revoke(gw, grant, because, by="system")
    return len(spent)


def visible(gw: Access, session: Session, caller: Caller) -> list[BreakGlassGrant]:
    rows = list(session.scalars(select(BreakGlassGrant).order_by(BreakGlassGrant.created_at.desc())).all())
    if "ledger.read" in gw.policy.capabilities(caller.real_identity, "*"):
        return rows
    return [g for g in rows if g.holder == caller.real_identity]


# What this module carries out once a second person approved it (M2), bound to the running gateway at app
# start (gateway/bootstrap.py).
EXECUTORS = {"breakglass.request": _activate_after_approval}
