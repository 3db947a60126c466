"""/v1/quotas and /v1/mounts: quota tiers (A7, two platform admins) and the mount/data-set registry (Q1)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select

from gateway.api.deps import Ctx, path_id
from gateway.decisions import verdict
from gateway.jobs import quotas
from gateway.schemas import Name, Timestamp
from gateway.store.scheduler_tables import MountRow

router = APIRouter(tags=["quotas"])
# Every GPU number of a quota bounded alike, so an absurd one is refused naming its field (past 2**53 it
# was refused only by the ledger's encoder, and a negative user limit only as "body").
GpuCount = Annotated[int, Field(ge=0, le=1_000_000)]


class QuotaChangeBody(BaseModel):
    """A tenant's (or the cluster's) new quota, for a period if given."""

    model_config = ConfigDict(extra="forbid")

    gpus: GpuCount = Field(description="GPUs the tenant owns (the cluster: hard cap, project '*').")
    borrow_limit: GpuCount | None = Field(0, description="Most GPUs it may borrow from idle quota; null: no limit.")
    lend_limit: GpuCount | None = Field(None, description="Most of its idle GPUs it lends; null: all idle ones.")
    users: dict[Name, GpuCount] = Field(default_factory=dict, max_length=10000,
                                        description="Per-user GPU limits within this tenant (for '*': across all"
                                                    " tenants).")
    effective_from: Timestamp | None = Field(None, description="When it starts to apply; default: once applied.")
    effective_until: Timestamp | None = Field(None, description="When it stops applying; default: never.")
    reason: str = Field(min_length=3, max_length=2000, description="Written reason, kept in the ledger.")
    ticket: str | None = Field(None, max_length=200, description="Linked ticket or change id.")

    @model_validator(mode="after")
    def _period(self) -> QuotaChangeBody:
        if self.effective_from and self.effective_until and self.effective_until <= self.effective_from:
            raise ValueError("effective_until must be after effective_from")
        return self


class MountBody(BaseModel):
    """A storage mount or data set jobs may declare (Q1)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$", description="What jobs write in `mounts` or"
                      " `datasets`.")
    kind: Literal["mount", "dataset"] = Field(description="A storage mount or a data set.")
    path: str = Field("", max_length=1000, description="Where it lives, for people; the gateway does not read it.")
    projects: list[Name] = Field(default_factory=lambda: ["*"], max_length=1000,
                                 description="Projects whose jobs may use it ('*': all).")
    available: bool = Field(True, description="False: jobs that need it are refused at admission until it is back.")


@router.get("/v1/quotas", summary="Quota tiers and what each tenant uses (owned / borrowed)")
def list_quotas(ctx: Ctx) -> dict[str, Any]:
    """Per tenant (and `*`, the cluster's hard cap): owned GPUs, borrow and lend limits, per-user limits and the
    effective period; beside it the GPUs each tenant uses now, owned and borrowed."""
    with ctx.gw.transaction() as session:
        ctx.caller(session)
        return {"quotas": quotas.list_quotas(session), "in_use": quotas.usage_by_tenant(session)}


@router.put("/v1/quotas/{project}", summary="Change a tenant's (or, with '*', the cluster's) quota (A7)",
            status_code=status.HTTP_200_OK, responses={202: {"description": "A second platform admin must approve"}})
def change_quota(
    project: Annotated[str, path_id("The tenant (project) id, or '*' for the cluster.")],
    body: QuotaChangeBody,
    ctx: Ctx,
) -> Any:
    """Decided by policy: a platform admin asks, a second platform admin approves (`POST
    /v1/approvals/{id}/approve`). Applied once, ledgered with before/after and the effective period."""
    params = body.model_dump(mode="json", exclude={"reason", "ticket"})
    with ctx.gw.transaction() as session:
        rec, approval, result = quotas.request_change(ctx.gw, session, ctx.caller(session), project, params,
                                                      body.reason, body.ticket)
        decision = verdict.decision_out(rec).model_dump()
        if approval is not None:
            return JSONResponse({"approval_id": approval.id, "decision": decision}, status_code=202)
        return {"applied": result, "decision": decision}


@router.get("/v1/mounts", summary="Registered storage mounts and data sets")
def list_mounts(ctx: Ctx) -> dict[str, Any]:
    """Name, kind, path, the projects that may use each, and whether it is available now."""
    with ctx.gw.transaction() as session:
        ctx.caller(session)
        rows = session.scalars(select(MountRow).order_by(MountRow.name)).all()
        return {"mounts": [{"name": r.name, "kind": r.kind, "path": r.path, "projects": list(r.projects),
                            "available": r.available} for r in rows]}


@router.post("/v1/mounts", status_code=status.HTTP_201_CREATED, summary="Register a mount or data set (admins)")
def add_mount(body: MountBody, ctx: Ctx) -> dict[str, Any]:
    """Jobs may declare only registered, available mounts and data sets open to their project (Q1)."""
    with ctx.gw.transaction() as session:
        row = quotas.add_mount(ctx.gw, session, ctx.caller(session), body.name, body.kind, body.path,
                               body.projects, body.available)
        return {"name": row.name, "kind": row.kind, "path": row.path, "projects": list(row.projects),
                "available": row.available}
