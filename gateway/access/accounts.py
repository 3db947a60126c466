"""Service accounts and tokens (F1): every automation identity has a responsible person; tokens are
scoped to projects, actions and a purpose, expire, are shown once and can be revoked. Every change is
ledgered."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.access.deps import Access
from gateway.decisions.approvals import withdraw_made_with
from gateway.decisions.pipeline import record_outcome
from gateway.decisions.policy.engine import RoleBinding as EngineBinding
from gateway.errors import Conflict, Forbidden, Invalid, NotFound
from gateway.identity.auth import Caller, refuse_unknown_actions
from gateway.identity.tokens import IssuedToken, issue_token
from gateway.store.models import Node, Principal, Project, RoleBinding, Token

PERSON_TOKEN_MAX_DAYS = 365
NODE_TOKEN_DAYS = 365
SERVICE_NAME = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
NODE_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")


def is_node_name(gw: Access, name: str) -> bool:
    """Whether `name` is of the kind kept for nodes (JOBGATE_NODE_NAMES)."""
    patterns = [p.strip() for p in gw.settings.node_names.split(",") if p.strip()]
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _is_platform_admin(gw: Access, caller: Caller) -> bool:
    return "role.manage" in gw.policy.capabilities(caller.real_identity, "*")


def _ledger(gw: Access, caller: Caller, action: str, **body: Any) -> None:
    record_outcome(gw, "identity", {"action": action, "actor": caller.to_json(), **body})


def may_manage(gw: Access, caller: Caller, principal: Principal) -> bool:
    """People manage their own tokens and those of service accounts they answer for; admins manage all."""
    if caller.kind == "service":
        return False  # an automation identity never mints or revokes credentials
    if principal.id == caller.id or (principal.kind == "service" and principal.responsible == caller.id):
        return True
    return _is_platform_admin(gw, caller)


def create_service_account(gw: Access, session: Session, caller: Caller, name: str, project: str,
                           description: str) -> Principal:
    """Create a service account answered for by the caller. Raises Invalid, Forbidden, Conflict."""
    if caller.kind != "person":
        raise Forbidden("only a person can be responsible for a service account (F1)")
    if not SERVICE_NAME.match(name):
        raise Invalid(f"service account name {name!r} must be lowercase letters, digits and dashes")
    if is_node_name(gw, name):
        # A principal named like a node reads in the ledger as that node, and would take the name from the node.
        raise Invalid(f"{name!r} is a name kept for nodes ({gw.settings.node_names}); choose another")
    if session.get(Project, project) is None:
        raise Invalid(f"unknown project {project!r}")
    if "job.submit" not in gw.policy.capabilities(caller.id, project) and not _is_platform_admin(gw, caller):
        raise Forbidden(f"{caller.id} holds no role in project {project} that may submit jobs")
    if caller.breakglass:
        raise Forbidden(f"break-glass grant {caller.breakglass} cannot create service accounts; they would outlive it")
    # The account submits jobs there: a credential narrowed to another project or to viewing must not make one.
    caller.check_scope("job.submit", [project])
    if session.get(Principal, name) is not None:
        raise Conflict(f"a principal named {name!r} already exists")
    now = gw.clock()
    account = Principal(id=name, kind="service", display_name=description or name, responsible=caller.id,
                        created_at=now)
    session.add(account)
    session.flush()
    session.add(RoleBinding(principal_id=name, role="service", project=project, created_at=now))
    gw.policy_sync.bindings_changed(session)  # the other replicas read the bindings before they decide again
    _ledger(gw, caller, "service_account.create", service_account=name, responsible=caller.id, project=project)
    # Into the policy engine once committed: granted before, a commit that failed left the role in memory.
    gw.after_commit(session, lambda: _grant_live(gw, EngineBinding(principal=name, role="service", project=project)))
    return account


def _grant_live(gw: Access, binding: EngineBinding) -> None:
    """Bind in the engine that decides, under the policy lock: a reload holds it from reading the bindings to
    swapping its engine in, so a binding committed in between waits and lands in the new engine, instead of in
    the old one the swap then drops."""
    with gw.policy_lock:
        gw.policy.grant(binding)


def enrol_node(gw: Access, session: Session, caller: Caller, name: str, gpus: int) -> IssuedToken:
    """A node and its agent's token (shown once), by a platform admin; ledgered. Raises Forbidden, Invalid,
    Conflict."""
    if caller.kind != "person" or not _is_platform_admin(gw, caller) or caller.breakglass:
        raise Forbidden("only a platform admin (a person, without break-glass) may enrol nodes")
    if not NODE_NAME.match(name) or not is_node_name(gw, name):
        raise Invalid(f"node name {name!r} must be lowercase letters, digits, dots and dashes and match the node "
                      f"names of this site ({gw.settings.node_names})", node_names=gw.settings.node_names)
    if session.get(Principal, name) is not None:
        raise Conflict(f"a principal named {name!r} already exists")
    now = gw.clock()
    session.add(Principal(id=name, kind="node", display_name=f"agent of {name}", created_at=now))
    session.add(Node(id=name, gpus=gpus, state="registered", last_heartbeat=None, running=[]))
    session.flush()
    issued = issue_token(session, name, purpose="node agent", now=now, lifetime=timedelta(days=NODE_TOKEN_DAYS),
                         actions=["agent"])
    _ledger(gw, caller, "node.enrol", node=name, gpus=gpus, token_id=issued.id,
            expires_at=issued.expires_at.isoformat())
    return issued


def list_service_accounts(gw: Access, session: Session, caller: Caller) -> list[dict[str, Any]]:
    stmt = select(Principal).where(Principal.kind == "service").order_by(Principal.id)
    accounts = session.scalars(stmt).all()
    if not _is_platform_admin(gw, caller):
        accounts = [a for a in accounts if a.responsible == caller.real_identity]
    return [{"id": a.id, "responsible": a.responsible, "description": a.display_name,
             "roles": gw.policy.roles_of(a.id), "created_at": a.created_at.isoformat()} for a in accounts]


@dataclass(frozen=True)
class Minted:
    """A token just made: its row, its secret (shown once), and, when its lifetime was cut to the end of the
    token that made it, that token's id and the expiry asked for."""

    token: Token
    issued: IssuedToken
    capped_by: str | None = None
    asked_expires_at: datetime | None = None


def create_token(gw: Access, session: Session, caller: Caller, *, principal_id: str, purpose: str,
                 projects: list[str], actions: list[str], expires_in_days: float) -> Minted:
    """Mint a token; the secret is returned once. Raises Invalid, Forbidden, NotFound."""
    principal = session.get(Principal, principal_id)
    if principal is None:
        raise NotFound(f"no principal {principal_id!r}")
    if not may_manage(gw, caller, principal):
        raise Forbidden(f"{caller.id} may not create tokens for {principal_id}")
    _check_within_caller_scope(caller, projects, actions)
    limit = gw.settings.service_token_max_days if principal.kind == "service" else PERSON_TOKEN_MAX_DAYS
    if expires_in_days > limit:
        raise Invalid(f"{principal.kind} tokens live at most {limit} days; asked for {expires_in_days:g}",
                      limit=limit)
    if "*" in projects and principal.kind == "service":
        raise Invalid("a service token must name its projects; '*' is not allowed (F1)")
    unknown = sorted(p for p in projects if p != "*" and session.get(Project, p) is None)
    if unknown:
        raise Invalid(f"unknown project(s): {', '.join(unknown)}")
    # Refused rather than minted with a warning: such a token grants nothing today, yet it would start to act
    # there, unseen, the day its holder is given a role in that project, a reach nobody decided to hand out.
    roleless = sorted(p for p in projects if p != "*" and not gw.policy.capabilities(principal_id, p))
    if roleless:
        raise Invalid(f"{principal_id} holds no role in project(s) {', '.join(roleless)}: a token there would"
                      " grant nothing now, and would start to act there unseen once a role were granted; ask for"
                      " the role first (`jobgate role list` shows the bindings)", projects=roleless)
    refuse_unknown_actions(actions)
    now = gw.clock()
    lifetime = timedelta(days=expires_in_days)
    capped_by = None
    if caller.token_expires_at is not None and caller.token_expires_at - now < lifetime:
        # Like its scope (above), a token's end binds what it mints: renewing itself, or handing a service account
        # a 90-day token, a leaked token about to expire would last for ever. Said in the answer and the ledger,
        # so nobody takes the shorter life for the one asked.
        lifetime = caller.token_expires_at - now
        capped_by = caller.token_id
    issued = issue_token(session, principal_id, purpose=purpose, now=now, lifetime=lifetime, projects=projects,
                         actions=actions)
    token = session.get(Token, issued.id)
    assert token is not None
    asked = now + timedelta(days=expires_in_days)
    capped = {"lifetime_capped_by": capped_by, "asked_expires_at": asked.isoformat()} if capped_by else {}
    _ledger(gw, caller, "token.create", token_id=issued.id, principal=principal_id, purpose=purpose,
            projects=projects, actions=actions, expires_at=issued.expires_at.isoformat(), **capped)
    return Minted(token, issued, capped_by, asked if capped_by else None)


def _check_within_caller_scope(caller: Caller, projects: list[str], actions: list[str]) -> None:
    if caller.breakglass:
        raise Forbidden(f"break-glass grant {caller.breakglass} cannot mint tokens; they would outlive it (F2)")
    caller.check_hands_on("a token it creates", projects, actions)


def list_tokens(gw: Access, session: Session, caller: Caller) -> list[Token]:
    rows = session.execute(select(Token, Principal).join(Principal, Principal.id == Token.principal_id)
                           .order_by(Token.created_at.desc())).all()
    return [t for t, p in rows if may_manage(gw, caller, p)]


def revoke_token(gw: Access, session: Session, caller: Caller, token_id: str, reason: str) -> Token:
    token = session.get(Token, token_id)
    principal = session.get(Principal, token.principal_id) if token else None
    if token is None or principal is None or not may_manage(gw, caller, principal):
        raise NotFound(f"no token {token_id!r} that {caller.id} manages")
    if token.revoked_at is not None:
        raise Conflict(f"token {token_id} was already revoked at {token.revoked_at.isoformat()}")
    token.revoked_at = gw.clock()
    gw.after_commit(session, lambda: gw.token_cache.forget(token.token_hash))
    gw.signals.publish(session, "token_revoked", token.token_hash)  # the other replicas' caches, at the commit
    withdrawn = withdraw_made_with(gw, session, token_id, token.principal_id, caller.real_identity)
    _ledger(gw, caller, "token.revoke", token_id=token_id, principal=token.principal_id, reason=reason,
            withdrawn_requests=withdrawn)
    return token


def token_json(token: Token) -> dict[str, Any]:
    return {"id": token.id, "principal": token.principal_id, "purpose": token.purpose,
            "projects": token.projects, "actions": token.actions, "created_at": token.created_at.isoformat(),
            "expires_at": token.expires_at.isoformat(),
            "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None}
