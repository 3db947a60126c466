"""/v1/tokens and /v1/service-accounts: scoped credentials and traceable automation identities (F1)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, status
from pydantic import BaseModel, ConfigDict, Field

from gateway import identity
from gateway.api.deps import Ctx

router = APIRouter(tags=["identity"])


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    principal: str | None = Field(None, description="Whose token; default: yours. Service accounts you answer for.")
    purpose: str = Field(min_length=3, max_length=200, description="Stated purpose, kept with the token.")
    projects: list[str] = Field(min_length=1, description="Projects the token may act in ('*' for people only).")
    actions: list[str] = Field(
        min_length=1, description="Actions it may request, e.g. job.submit, job.stop; '*' for all."
    )
    expires_in_days: float = Field(gt=0, description="Mandatory expiry; service tokens at most 90 days.")


class RevokeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=3, max_length=500)


class ServiceAccountCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Lowercase letters, digits and dashes.")
    project: str
    description: str = ""


@router.post("/v1/tokens", status_code=status.HTTP_201_CREATED, summary="Create a scoped token (shown once)")
def create_token(body: TokenCreate, ctx: Ctx) -> dict[str, Any]:
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        token, issued = identity.create_token(
            ctx.gw, session, caller, principal_id=body.principal or caller.id, purpose=body.purpose,
            projects=body.projects, actions=body.actions, expires_in_days=body.expires_in_days)
        return {**identity.token_json(token), "token": issued.secret}


@router.get("/v1/tokens", summary="Tokens you manage (yours and your service accounts')")
def list_tokens(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    with ctx.gw.transaction() as session:
        rows = identity.list_tokens(ctx.gw, session, ctx.caller(session))
        return {"tokens": [identity.token_json(t) for t in rows]}


@router.post("/v1/tokens/{token_id}/revoke", summary="Revoke a token")
def revoke_token(token_id: str, body: RevokeBody, ctx: Ctx) -> dict[str, Any]:
    with ctx.gw.transaction() as session:
        token = identity.revoke_token(ctx.gw, session, ctx.caller(session), token_id, body.reason)
        return identity.token_json(token)


@router.post("/v1/service-accounts", status_code=status.HTTP_201_CREATED,
             summary="Create a service account you answer for")
def create_service_account(body: ServiceAccountCreate, ctx: Ctx) -> dict[str, Any]:
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        acct = identity.create_service_account(ctx.gw, session, caller, body.name, body.project, body.description)
        return {"id": acct.id, "responsible": acct.responsible, "project": body.project}


@router.get("/v1/service-accounts", summary="Service accounts you answer for (admins: all)")
def list_service_accounts(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    with ctx.gw.transaction() as session:
        return {"service_accounts": identity.list_service_accounts(ctx.gw, session, ctx.caller(session))}
