"""Notices to people (owners, requesters, on-call): an outbox table (gateway/store/service_tables.py)
the console, CLI and webhooks read.

A notice may ask for a receipt (A4: the owner was notified before their job was stopped); the receipt is
the recipient's acknowledgement, or a timeout — the ledger says which. An alert escalates to on-call: a log line
and a notice to each of them (a stop that failed, a node lost or misbehaving, F3).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.store.models import RoleBinding
from gateway.store.service_tables import Notification


def notify(
    session: Session, principal: str, kind: str, body: dict[str, Any], now: datetime, *, receipt: bool = False
) -> Notification:
    """Queue a notice for one principal in the caller's transaction."""
    note = Notification(
        id="ntf-" + secrets.token_hex(8),
        principal=principal,
        kind=kind,
        body=body,
        created_at=now,
        receipt_required=receipt,
    )
    session.add(note)
    return note


log = logging.getLogger("jobgate.stops")
ONCALL_ROLE = "oncall"


def oncall_people(session: Session) -> list[str]:
    return sorted(set(session.scalars(select(RoleBinding.principal_id).where(RoleBinding.role == ONCALL_ROLE))))


def alert(session: Session, now: datetime, kind: str, body: dict[str, Any], *, also: Iterable[str] = ()) -> None:
    """Escalate to people: one structured log line, a notification per on-call engineer (and `also`)."""
    log.warning(json.dumps({"alert": kind, "at": now.isoformat(), **body}, sort_keys=True, default=str))
    for who in sorted(set(oncall_people(session)) | set(also)):
        notify(session, who, kind, body, now)
