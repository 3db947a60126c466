"""/v1/inventory: every workload with environment, launcher, responsible party, dependencies (C1, R5)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from gateway.api.deps import Ctx
from gateway.errors import Invalid
from gateway.jobs import inventory

router = APIRouter(prefix="/v1/inventory", tags=["inventory"])


@router.get("", summary="Workloads, their scope, owners and stoppability; blind spots")
def list_inventory(
    ctx: Ctx,
    environment: Annotated[Literal["research", "staging", "production"] | None,
                           Query(description="Only workloads in this environment")] = None,
    label: Annotated[list[str] | None, Query(description="Label selector key:value; repeatable (AND).")] = None,
    include_ended: Annotated[bool, Query(description="Also workloads whose jobs all ended.")] = False,
) -> dict[str, Any]:
    """A workload is the jobs sharing a `workload` name (a job without one stands alone). Only projects you
    may view are listed. `blind_spots` are tracked workloads that declare themselves not stoppable."""
    labels: dict[str, str] = {}
    for item in label or []:
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise Invalid(f"label selector {item!r} must look like key:value")
        labels[key] = value
    with ctx.gw.transaction() as session:
        return inventory.workloads(ctx.gw, session, ctx.caller(session), environment=environment, labels=labels,
                                   include_ended=include_ended)
