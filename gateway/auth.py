"""Authentication: bearer token → the principal behind it, with its real identity (F1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.errors import Forbidden, Invalid, Unauthenticated
from gateway.models import Principal, Token
from gateway.tokens import TOKEN_PATTERN, hash_token

TRIGGER_HEADER = "X-Jobgate-Trigger"


@dataclass(frozen=True)
class Caller:
    """Who is calling, as the ledger records it. `real_identity` is a person, never a shared account."""

    id: str
    kind: str  # person | service | node
    token_id: str
    token_projects: tuple[str, ...]
    token_actions: tuple[str, ...]
    responsible: str | None = None
    trigger: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    breakglass: str | None = None  # the grant id when the call uses a break-glass credential (F2)

    @property
    def real_identity(self) -> str:
        return self.responsible if self.kind == "service" and self.responsible else self.id

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "real_identity": self.real_identity,
            "responsible": self.responsible,
            "trigger": self.trigger,
            "token_id": self.token_id,
            "bypass": self.breakglass is not None,
        }

    def check_scope(self, action: str, projects: list[str]) -> None:
        """A token is usable only for its stated actions and projects (F1). Raises Forbidden naming the scope."""
        if "*" not in self.token_actions and action not in self.token_actions:
            raise Forbidden(
                f"token {self.token_id} is scoped to actions {list(self.token_actions)}; {action} is outside it",
                scope={"actions": list(self.token_actions)},
            )
        if "*" not in self.token_projects:
            outside = sorted({p for p in projects if p not in self.token_projects})
            if outside:
                raise Forbidden(
                    f"token {self.token_id} is scoped to projects {list(self.token_projects)};"
                    f" {', '.join(outside)} is outside it",
                    scope={"projects": list(self.token_projects)},
                )


def authenticate(
    session: Session, authorization: str | None, *, trigger: str | None, source: dict[str, Any], now: datetime
) -> Caller:
    """Resolve an `Authorization: Bearer ...` header. Raises Unauthenticated or Invalid."""
    if not authorization:
        raise Unauthenticated("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, secret = authorization.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not TOKEN_PATTERN.match(secret):
        raise Unauthenticated("malformed token; expected 'Authorization: Bearer jg_...'")
    row = session.execute(
        select(Token, Principal)
        .join(Principal, Principal.id == Token.principal_id)
        .where(Token.token_hash == hash_token(secret))
    ).first()
    if row is None:
        raise Unauthenticated("unknown token")
    token, principal = row
    if token.revoked_at is not None:
        raise Unauthenticated(f"token {token.id} was revoked at {token.revoked_at.isoformat()}")
    if token.expires_at <= now.astimezone(UTC):
        raise Unauthenticated(f"token {token.id} expired at {token.expires_at.isoformat()}")
    if principal.disabled:
        raise Unauthenticated(f"principal {principal.id} is disabled")
    # F1: an automation identity must say which pipeline run triggered it.
    if principal.kind == "service" and not (trigger and trigger.strip()):
        raise Invalid(
            f"service account {principal.id} must send the {TRIGGER_HEADER} header"
            " (pipeline and run id, e.g. 'ci/train-nightly#4182')"
        )
    return Caller(
        id=principal.id,
        kind=principal.kind,
        token_id=token.id,
        token_projects=tuple(token.projects),
        token_actions=tuple(token.actions),
        responsible=principal.responsible,
        trigger=trigger.strip() if trigger else None,
        source=source,
    )
