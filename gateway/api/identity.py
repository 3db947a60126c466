"""/v1/tokens and /v1/service-accounts: scoped credentials and traceable automation identities (F1)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, status
from pydantic import BaseModel, ConfigDict, Field

from gateway.access import accounts
from gateway.api.deps import Ctx, path_id
from gateway.schemas import Name

router = APIRouter(tags=["identity"])


class TokenCreate(BaseModel):
    """A scoped token: whose, for what, where, and until when."""

    model_config = ConfigDict(extra="forbid")
    principal: Name | None = Field(None, description="Whose token; default: yours. Service accounts you answer for.")
    purpose: str = Field(min_length=3, max_length=200, description="Stated purpose, kept with the token.")
    projects: list[Name] = Field(min_length=1, max_length=100,
                                 description="Projects the token may act in ('*' for people only).")
    actions: list[Name] = Field(
        min_length=1, max_length=100, description="Actions it may request, e.g. job.submit, job.stop; '*' for all."
    )
    expires_in_days: float = Field(gt=0, description="Mandatory expiry; service tokens at most 90 days. A token"
                                   " ends no later than the one it is made with; the answer's `lifetime_capped`"
                                   " says when that cut it short.")


class RevokeBody(BaseModel):
    """Why the token is revoked."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=3, max_length=500, description="Kept in the ledger.")


class ServiceAccountCreate(BaseModel):
    """An automation identity; the caller becomes the person responsible for it (F1)."""

    model_config = ConfigDict(extra="forbid")
    name: Name = Field(description="Lowercase letters, digits and dashes.")
    project: Name = Field(description="Project it works in; it gets the `service` role there.")
    description: str = Field("", max_length=128,
                             description="What it automates, for the people who find it in the ledger.")


@router.post("/v1/tokens", status_code=status.HTTP_201_CREATED, summary="Create a scoped token (shown once)")
def create_token(body: TokenCreate, ctx: Ctx) -> dict[str, Any]:
    """For yourself, or for a service account you answer for. The secret (`token`) is in this answer only;
    the gateway keeps its hash. Service tokens expire within 90 days (configurable); service accounts never
    mint tokens. A token mints only within its own actions and projects (403 otherwise), and only for projects
    where its holder holds a role (422 otherwise); it ends no later than the token that made it (then
    `lifetime_capped` names that token and the expiry asked for; otherwise it is null), and a break-glass
    credential mints none."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        made = accounts.create_token(
            ctx.gw, session, caller, principal_id=body.principal or caller.id, purpose=body.purpose,
            projects=body.projects, actions=body.actions, expires_in_days=body.expires_in_days)
        capped = None
        if made.capped_by is not None and made.asked_expires_at is not None:
            capped = {"by_token": made.capped_by, "asked_expires_at": made.asked_expires_at.isoformat(),
                      "reason": f"a token ends no later than the token that made it; {made.capped_by} expires then"}
        return {**accounts.token_json(made.token), "token": made.issued.secret, "lifetime_capped": capped}


@router.get("/v1/tokens", summary="Tokens you manage (yours and your service accounts')")
def list_tokens(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    """Newest first: principal, purpose, scope, expiry and revocation of each (never a secret). Platform
    admins see all."""
    with ctx.gw.transaction() as session:
        rows = accounts.list_tokens(ctx.gw, session, ctx.caller(session))
        return {"tokens": [accounts.token_json(t) for t in rows]}


@router.post("/v1/tokens/{token_id}/revoke", summary="Revoke a token")
def revoke_token(
    token_id: Annotated[str, path_id("The token's id (not its secret), as listed.")],
    body: RevokeBody,
    ctx: Ctx,
) -> dict[str, Any]:
    """The token stops working at once; the revocation and its reason are ledgered. Approval requests it made
    that are still pending are closed with it (rejected, the requester and the owners told): revoked because
    it leaked, it must not leave behind a stop that an unaware second person then approves."""
    with ctx.gw.transaction() as session:
        token = accounts.revoke_token(ctx.gw, session, ctx.caller(session), token_id, body.reason)
        return accounts.token_json(token)


@router.post("/v1/service-accounts", status_code=status.HTTP_201_CREATED,
             summary="Create a service account you answer for")
def create_service_account(body: ServiceAccountCreate, ctx: Ctx) -> dict[str, Any]:
    """Only a person may create one, in a project where they may submit jobs. Its calls must carry
    `X-Jobgate-Trigger` (pipeline and run id); the ledger records it, its responsible person and the trigger."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        acct = accounts.create_service_account(ctx.gw, session, caller, body.name, body.project, body.description)
        return {"id": acct.id, "responsible": acct.responsible, "project": body.project}


@router.get("/v1/service-accounts", summary="Service accounts you answer for (admins: all)")
def list_service_accounts(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    """Each with its responsible person, description and roles."""
    with ctx.gw.transaction() as session:
        return {"service_accounts": accounts.list_service_accounts(ctx.gw, session, ctx.caller(session))}
