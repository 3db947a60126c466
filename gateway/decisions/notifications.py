"""Notices to people (owners, requesters, on-call): an outbox table (gateway/store/service_tables.py)
the console, CLI and webhooks read.

A notice may ask for a receipt (A4: the owner was notified before their job was stopped); the receipt is
the recipient's acknowledgement, or a timeout — the ledger says which.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

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
