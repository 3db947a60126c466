"""/v1/roles: role bindings as data (M1), changed only by holders of `role.manage`, each change ledgered."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, ConfigDict, Field

from gateway.access import roles
from gateway.api.deps import Ctx
from gateway.decisions.policy.engine import RoleBinding

router = APIRouter(prefix="/v1", tags=["roles"])

_NAME = r"^[A-Za-z0-9_.\-]+$"


class BindingIn(BaseModel):
    """One role binding: a principal holds a role in a project."""

    model_config = ConfigDict(extra="forbid")
    principal: str = Field(pattern=_NAME, max_length=64, description="Person or service account id.")
    role: str = Field(pattern=_NAME, max_length=32, description="A role of policies/matrix.csv, e.g. queue_admin.")
    project: str = Field(pattern=r"^(\*|[A-Za-z0-9_.\-]+)$", max_length=64,
                         description="Project the role is bound in; '*' for a global role (on-call).")
    reason: str | None = Field(None, max_length=500, description="Why; kept in the ledger.")

    def binding(self) -> RoleBinding:
        return RoleBinding(self.principal, self.role, self.project)


@router.post("/roles", status_code=status.HTTP_201_CREATED, summary="Grant a role in a project")
def grant(body: BindingIn, ctx: Ctx) -> dict[str, Any]:
    """Needs `role.manage` (platform admin). Decided and recorded in the ledger, written to the role
    bindings table and applied to the live policy engine in one transaction. Unknown principal, role
    (not in the matrix) or project → 422; an existing binding → 409."""
    return roles.change(ctx.gw, ctx.caller, "grant", body.binding(), body.reason).to_json()


@router.post("/roles:revoke", summary="Revoke a role binding")
def revoke(body: BindingIn, ctx: Ctx) -> dict[str, Any]:
    """Needs `role.manage`. Same path as a grant; a binding that does not exist → 404."""
    return roles.change(ctx.gw, ctx.caller, "revoke", body.binding(), body.reason).to_json()


@router.delete("/roles", summary="Revoke a role binding (query parameters)")
def revoke_by_query(
    ctx: Ctx,
    principal: Annotated[str, Query(pattern=_NAME, max_length=64, description="Person or service account id")],
    role: Annotated[str, Query(pattern=_NAME, max_length=32, description="The role to take away")],
    project: Annotated[str, Query(pattern=r"^(\*|[A-Za-z0-9_.\-]+)$", max_length=64,
                                  description="Project it is bound in; '*' for a global role")],
    reason: Annotated[str | None, Query(max_length=500, description="Why; kept in the ledger")] = None,
) -> dict[str, Any]:
    """The same as POST /v1/roles:revoke."""
    return roles.change(ctx.gw, ctx.caller, "revoke", RoleBinding(principal, role, project), reason).to_json()


@router.get("/roles", summary="List role bindings")
def list_roles(
    ctx: Ctx,
    principal: Annotated[str | None, Query(description="Only this principal")] = None,
    project: Annotated[str | None, Query(description="Only this project ('*' for global roles)")] = None,
) -> dict[str, Any]:
    """Needs `role.manage`."""
    return {"bindings": roles.list_bindings(ctx.gw, ctx.caller, principal, project)}
