"""Bearer tokens: random secrets shown once; the DB keeps only their SHA-256 (F1)."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from gateway.store.models import Token

TOKEN_PREFIX = "jg_"
TOKEN_PATTERN = re.compile(r"^jg_[A-Za-z0-9_-]{32,64}$")


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    id: str
    secret: str  # shown to the caller once, never stored
    expires_at: datetime


def issue_token(
    session: Session,
    principal_id: str,
    *,
    purpose: str,
    now: datetime,
    lifetime: timedelta,
    projects: list[str] | None = None,
    actions: list[str] | None = None,
) -> IssuedToken:
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = Token(
        id="tok-" + secrets.token_hex(8),
        principal_id=principal_id,
        token_hash=hash_token(secret),
        projects=projects or ["*"],
        actions=actions or ["*"],
        purpose=purpose,
        created_at=now,
        expires_at=now + lifetime,
    )
    session.add(token)
    return IssuedToken(token.id, secret, token.expires_at)
