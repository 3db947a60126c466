"""Obligations a decision attaches (A4, A5): tell the owner before their job is touched, and track the
receipt — the owner's acknowledgement, or a timeout. The ledger says which."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.deps import Decider
from gateway.decisions.notifications import notify
from gateway.decisions.pipeline import record_outcome
from gateway.errors import Conflict, Forbidden, NotFound
from gateway.identity.auth import Caller
from gateway.store.models import Job
from gateway.store.service_tables import Notification

RECEIPT_TIMEOUT = timedelta(minutes=30)


def notify_owners(gw: Decider, session: Session, obligations: Sequence[Mapping[str, Any]], *, job: Job,
                  actor: str, action: str, reason: str | None) -> list[dict[str, str]]:
    """Send the notices this job's obligations ask for; return what the outcome entry records."""
    sent = []
    for o in obligations:
        if o.get("kind") != "notify_owner" or o.get("job") != job.id or o.get("owner") in (None, actor):
            continue
        note = notify(session, str(o["owner"]), "job_action",
                      {"job_id": job.id, "job_name": job.name, "action": action, "by": actor, "reason": reason},
                      gw.clock(), receipt=True)
        sent.append({"job": job.id, "owner": str(o["owner"]), "notification_id": note.id, "receipt": "pending"})
    return sent


def receipt_state(note: Notification, now: datetime) -> str:
    if not note.receipt_required:
        return "not_required"
    if note.acknowledged_at is not None:
        return "acknowledged"
    return "timed_out" if now - note.created_at > RECEIPT_TIMEOUT else "pending"


def acknowledge(gw: Decider, session: Session, caller: Caller, notification_id: str) -> Notification:
    """The recipient confirms they saw the notice; ledgered as the receipt, with the credential used.

    Raises NotFound, Conflict, Forbidden (A4's receipt says the owner saw it: a pipeline acting for them must not
    produce it)."""
    principal = caller.real_identity
    note = session.get(Notification, notification_id)
    if note is None or note.principal != principal:
        raise NotFound(f"no notification {notification_id!r} for {principal}")
    if caller.kind != "person" or caller.breakglass:
        raise Forbidden(f"{caller.id} cannot acknowledge {principal}'s notices: only {principal}, with their own"
                        " token, can")
    now = gw.clock()
    if note.acknowledged_at is not None:
        raise Conflict(f"notification {notification_id} was already acknowledged")
    note.read_at = note.read_at or now
    note.acknowledged_at = now
    if note.receipt_required:
        record_outcome(gw, "receipt", {"notification_id": note.id, "principal": principal, "receipt": "acknowledged",
                                       "actor": caller.to_json(), "job_id": note.body.get("job_id"),
                                       "notified_at": note.created_at.isoformat()})
    return note


def sweep_timed_out_receipts(gw: Decider, session: Session) -> int:
    """Record receipts that timed out (once each); returns how many were recorded.

    Once each across replicas too: the rows are locked as they are read, and rows another sweep holds are left to
    it (PostgreSQL; SQLite has one writer), so two sweeps at once (a leader hand-over) never both ledger one."""
    now = gw.clock()
    stale = session.scalars(select(Notification).where(
        Notification.receipt_required.is_(True), Notification.acknowledged_at.is_(None),
        Notification.created_at < now - RECEIPT_TIMEOUT).with_for_update(skip_locked=True)).all()
    for note in stale:
        note.receipt_required = False  # settled: the ledger now says it timed out
        record_outcome(gw, "receipt", {"notification_id": note.id, "principal": note.principal,
                                       "receipt": "timed_out", "job_id": note.body.get("job_id"),
                                       "notified_at": note.created_at.isoformat()})
    return len(stale)


def note_json(note: Notification, now: datetime) -> dict[str, Any]:
    return {"id": note.id, "kind": note.kind, "body": note.body, "created_at": note.created_at.isoformat(),
            "read_at": note.read_at.isoformat() if note.read_at else None,
            "receipt": receipt_state(note, now)}
