"""Console sessions: an opaque id in an httpOnly, SameSite=Strict cookie, mapped server-side to the token hash.

The raw token never leaves the sign-in request: the server keeps only its SHA-256 (the same hash the token
table holds), so a stolen session store cannot be replayed against the API. Each session carries its own
CSRF token, checked on every POST. Sessions live in memory: a gateway restart signs everyone out, which
fails closed.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from gateway.errors import Unauthenticated
from gateway.identity.auth import Caller, token_facts
from gateway.identity.tokens import TOKEN_PATTERN, hash_token

COOKIE = "jg_session"
LOGIN_COOKIE = "jg_login"  # pre-session CSRF value for the sign-in form (double submit)
IDLE = timedelta(hours=8)
# Sessions one token may hold at once (a person's browsers and tabs signed in anew). Without a cap, a token signing
# in over and over grew the gateway's memory for as long as IDLE, since only a session's own cookie removed it.
PER_TOKEN = 16


@dataclass
class ConsoleSession:
    id: str
    token_hash: str
    principal: str
    csrf: str
    created_at: datetime
    last_seen: datetime


class SessionStore:
    """Thread-safe map session id → ConsoleSession."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, ConsoleSession] = {}

    def create(self, token_hash: str, principal: str, now: datetime) -> ConsoleSession:
        """A new session; idle ones go, and the token's least recently used ones beyond PER_TOKEN - 1."""
        s = ConsoleSession(secrets.token_urlsafe(32), token_hash, principal, secrets.token_urlsafe(32), now, now)
        with self._lock:
            for old in [o for o in self._sessions.values() if now - o.last_seen > IDLE]:
                del self._sessions[old.id]
            same = sorted((o for o in self._sessions.values() if o.token_hash == token_hash), key=lambda o: o.last_seen)
            for old in same[: max(0, len(same) - (PER_TOKEN - 1))]:
                del self._sessions[old.id]
            self._sessions[s.id] = s
        return s

    def get(self, session_id: str | None, now: datetime) -> ConsoleSession | None:
        if not session_id:
            return None
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            if now - s.last_seen > IDLE:
                del self._sessions[session_id]
                return None
            s.last_seen = now
            return s

    def drop(self, session_id: str | None) -> None:
        with self._lock:
            self._sessions.pop(session_id or "", None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


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
