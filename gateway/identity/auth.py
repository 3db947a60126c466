"""Authentication: bearer token → the principal behind it, with its real identity (F1)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from gateway.errors import Forbidden, Invalid, Unauthenticated
from gateway.identity.token_cache import TokenCache, TokenFacts
from gateway.identity.tokens import TOKEN_PATTERN, hash_token
from gateway.store.models import Principal, Token

TRIGGER_HEADER = "X-Jobgate-Trigger"
MAX_TRIGGER = 200  # characters; the width every table that keeps a trigger gives it

# The actions a token or break-glass grant may name ('*' stands for all): those the gateway decides on, and
# approval.grant. Any other name is a typo that grants nothing: an on-call engineer's grant for "job.stpo"
# would be approved and then stop no job. check_scope() refuses to check an action missing here.
ACTIONS = frozenset({
    "approval.grant", "breakglass.request", "emergency.lift", "emergency.stop", "job.confirm_stopped", "job.delete",
    "job.pause", "job.priority", "job.resume", "job.stop", "job.submit", "job.undelete", "job.view", "ledger.read",
    "policy.reload", "quota.change", "role.manage",
})


def refuse_unknown_actions(names: Iterable[str]) -> None:
    """Raises Invalid naming each of `names` that is no action ('*' is all of them), and the actions there are."""
    unknown = sorted(set(names) - ACTIONS - {"*"})
    if unknown:
        raise Invalid(f"unknown action(s): {', '.join(unknown)}; the actions are {', '.join(sorted(ACTIONS))}, or '*'",
                      unknown=unknown)

# Built once: composing a SQLAlchemy statement costs more than running this one (every request pays it).
_BY_HASH = (
    select(Token, Principal)
    .join(Principal, Principal.id == Token.principal_id)
    .where(Token.token_hash == bindparam("token_hash"))
)


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
    token_expires_at: datetime | None = None  # tokens it mints may not outlive it

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
        if action not in ACTIONS:  # a new action must be listed, or no token could ever name it
            raise LookupError(f"{action!r} is not in gateway.identity.auth.ACTIONS")
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

    def check_hands_on(self, what: str, projects: list[str], actions: list[str]) -> None:
        """A credential hands on only what it holds itself (F1): a token narrowed to job.view in one project, if
        leaked, must not yield `what` (a token, a break-glass grant) for every action everywhere. Raises
        Forbidden naming what is outside."""
        scopes = (("actions", actions, self.token_actions), ("projects", projects, self.token_projects))
        for kind, asked, held in scopes:
            outside = sorted(set(asked) - set(held)) if "*" not in held else []
            if outside:
                raise Forbidden(f"token {self.token_id} is scoped to {kind} {list(held)}; {what} cannot hold"
                                f" {', '.join(outside)}, which is outside it", scope={kind: list(held)})



# The gateway itself, acting on its own (R4 auto-offline, Q6 runtime limits, a gang member's failure): decided
# and ledgered like anyone's call.
SYSTEM = Caller(id="system", kind="system", token_id="", token_projects=("*",), token_actions=("*",))

def bearer_secret(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer jg_...` header; raises Unauthenticated when there is none, or
    it is not shaped like one (checked before the request's body is, so that a caller without a credential
    learns nothing else)."""
    if not authorization:
        raise Unauthenticated("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, secret = authorization.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not TOKEN_PATTERN.match(secret):
        raise Unauthenticated("malformed token; expected 'Authorization: Bearer jg_...'")
    return secret


def bearer_facts(session: Session, authorization: str | None, now: datetime, *,
                 cache: TokenCache | None = None) -> TokenFacts:
    """The facts of the usable token an `Authorization: Bearer ...` header carries. Raises Unauthenticated."""
    return token_facts(session, hash_token(bearer_secret(authorization)), now, cache=cache)


def authenticate(
    session: Session,
    authorization: str | None,
    *,
    trigger: str | None,
    source: dict[str, Any],
    now: datetime,
    cache: TokenCache | None = None,
) -> Caller:
    """Resolve an `Authorization: Bearer ...` header. Raises Unauthenticated or Invalid."""
    facts = bearer_facts(session, authorization, now, cache=cache)
    trigger = trigger.strip() if trigger else None
    if trigger and (len(trigger) > MAX_TRIGGER or not trigger.isprintable()):
        # Checked here, not where it is stored: PostgreSQL refused a longer one only once the decision was ledgered.
        got = f"{len(trigger)} characters" if trigger.isprintable() else "characters that are not printable"
        raise Invalid(f"the {TRIGGER_HEADER} header holds at most {MAX_TRIGGER} printable characters (pipeline and"
                      f" run id); this one has {got}")
    # F1: an automation identity must say which pipeline run triggered it.
    if facts.kind == "service" and not trigger:
        raise Invalid(
            f"service account {facts.principal_id} must send the {TRIGGER_HEADER} header"
            " (pipeline and run id, e.g. 'ci/train-nightly#4182'; from the CLI: --trigger or"
            " JOBGATE_TRIGGER)"
        )
    return Caller(
        id=facts.principal_id,
        kind=facts.kind,
        token_id=facts.token_id,
        token_projects=facts.projects,
        token_actions=facts.actions,
        responsible=facts.responsible,
        trigger=trigger,
        source=source,
        token_expires_at=facts.expires_at,
    )


def token_facts(session: Session, token_hash: str, now: datetime, *, cache: TokenCache | None = None) -> TokenFacts:
    """The facts of a usable token: known, not revoked, not expired, its principal not disabled.

    Shared by the API and the console. Raises Unauthenticated with the reason."""
    facts = cache.get(token_hash) if cache else None
    if facts is None:
        generation = cache.generation() if cache else 0
        facts = _load(session, token_hash)
        if cache:
            cache.put(token_hash, facts, generation)
    if facts.revoked_at is not None:
        raise Unauthenticated(f"token {facts.token_id} was revoked at {facts.revoked_at.isoformat()}")
    if facts.expires_at <= now.astimezone(UTC):
        raise Unauthenticated(f"token {facts.token_id} expired at {facts.expires_at.isoformat()}")
    if facts.disabled:
        raise Unauthenticated(f"principal {facts.principal_id} is disabled")
    return facts


def _load(session: Session, token_hash: str) -> TokenFacts:
    row = session.execute(_BY_HASH, {"token_hash": token_hash}).first()
    if row is None:
        raise Unauthenticated("unknown token")
    token, principal = row
    return TokenFacts(
        token_id=token.id,
        projects=tuple(token.projects),
        actions=tuple(token.actions),
        expires_at=token.expires_at,
        revoked_at=token.revoked_at,
        principal_id=principal.id,
        kind=principal.kind,
        responsible=principal.responsible,
        disabled=principal.disabled,
    )
