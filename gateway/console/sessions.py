"""Console sessions: an opaque id in an httpOnly, SameSite=Strict cookie, mapped server-side to the token hash.

The raw token never leaves the sign-in request: the server keeps only its SHA-256 (the same hash the token
table holds), so a stolen session store cannot be replayed against the API. Each session carries its own
CSRF token, checked on every POST. Sessions live in the business database (table `console_sessions`, the
cookie's secret as its SHA-256 only), so every replica knows who signed in through any of them, a sign-out
through one ends the session on all, and a restart keeps people signed in.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from gateway.errors import Unauthenticated
from gateway.identity.auth import Caller, token_facts
from gateway.identity.tokens import TOKEN_PATTERN, hash_token
from gateway.store.replica_tables import ConsoleSessionRow as Row

COOKIE = "jg_session"
LOGIN_COOKIE = "jg_login"  # pre-session CSRF value for the sign-in form (double submit)
IDLE = timedelta(hours=8)
# Sessions one token may hold at once (a person's browsers and tabs signed in anew). Without a cap, a token signing
# in over and over grew the store for as long as IDLE, since only a session's own cookie removed it.
PER_TOKEN = 16
# How stale a session's last_seen may be before a request writes it again: a write on every page view would
# cost each console request a write transaction, for an idle limit of hours. A session may so live up to this
# much past IDLE.
TOUCH = timedelta(minutes=1)

Transaction = Callable[..., AbstractContextManager[Session]]


@dataclass
class ConsoleSession:
    id: str  # the cookie's secret; only its hash is stored
    token_hash: str
    principal: str
    csrf: str
    created_at: datetime
    last_seen: datetime


class SessionStore:
    """Session id → ConsoleSession, in the business database; `transaction` is the gateway's."""

    def __init__(self, transaction: Transaction) -> None:
        self._transaction = transaction

    def create(self, token_hash: str, principal: str, now: datetime) -> ConsoleSession:
        """A new session; idle ones go, and the token's least recently used ones beyond PER_TOKEN - 1."""
        s = ConsoleSession(secrets.token_urlsafe(32), token_hash, principal, secrets.token_urlsafe(32), now, now)
        with self._transaction() as session:
            session.execute(delete(Row).where(Row.last_seen < now - IDLE))
            surplus = session.scalars(select(Row.id_hash).where(Row.token_hash == token_hash)
                                      .order_by(Row.last_seen.desc(), Row.created_at.desc())
                                      .offset(PER_TOKEN - 1)).all()
            if surplus:
                session.execute(delete(Row).where(Row.id_hash.in_(surplus)))
            session.add(Row(id_hash=hash_token(s.id), token_hash=token_hash, principal=principal, csrf=s.csrf,
                            created_at=now, last_seen=now))
        return s

    def get(self, session_id: str | None, now: datetime) -> ConsoleSession | None:
        if not session_id:
            return None
        digest = hash_token(session_id)
        with self._transaction(immediate=False) as session:
            row = session.get(Row, digest)
            if row is None:
                return None
            found = ConsoleSession(session_id, row.token_hash, row.principal, row.csrf, row.created_at,
                                   row.last_seen)
        if now - found.last_seen > IDLE:
            self.drop(session_id)
            return None
        if now - found.last_seen > TOUCH:
            with self._transaction() as session:
                session.execute(update(Row).where(Row.id_hash == digest).values(last_seen=now))
            found.last_seen = now
        return found

    def drop(self, session_id: str | None) -> None:
        if not session_id:
            return
        with self._transaction() as session:
            session.execute(delete(Row).where(Row.id_hash == hash_token(session_id)))

    def __len__(self) -> int:
        with self._transaction(immediate=False) as session:
            return int(session.scalar(select(func.count()).select_from(Row)) or 0)


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())


def check_token(session: Session, secret: str, now: datetime) -> tuple[str, str]:
    """Validate a pasted token for console use; return (token hash, principal id).

    Only people sign in to the console: service accounts act for a pipeline run and node agents are not
    users. Raises Unauthenticated with the reason.
    """
    secret = secret.strip()
    if not TOKEN_PATTERN.match(secret):
        raise Unauthenticated("that is not a jobgate token (they start with 'jg_')")
    digest = hash_token(secret)
    facts = token_facts(session, digest, now)
    if facts.kind != "person":
        raise Unauthenticated(f"{facts.principal_id} is a {facts.kind} identity; only people sign in to the console")
    return digest, facts.principal_id


def caller_for(session: Session, cs: ConsoleSession, now: datetime, source: dict[str, Any]) -> Caller:
    """The Caller behind a console session, re-checked on every request exactly as `auth.authenticate`
    checks a bearer token (revoked, expired, disabled). Raises Unauthenticated."""
    facts = token_facts(session, cs.token_hash, now)
    return Caller(id=facts.principal_id, kind=facts.kind, token_id=facts.token_id, token_projects=facts.projects,
                  token_actions=facts.actions, responsible=facts.responsible, trigger=None, source=source,
                  token_expires_at=facts.expires_at)
