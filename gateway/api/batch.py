"""/v1/jobs:stop — batch stops by ids or selector, with dry run and blast radius (H2)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, status

from gateway.api.deps import Ctx
from gateway.jobs import batch
from gateway.schemas import BatchPriorityRequest, BatchRequest

router = APIRouter(tags=["jobs"])


@router.post("/v1/jobs:stop", status_code=status.HTTP_202_ACCEPTED, summary="Stop many jobs as one decision")
def stop_many(body: BatchRequest, ctx: Ctx) -> dict[str, Any]:
    """The selector is resolved to an exact, sorted id list first. `dry_run` returns that list and the blast
    radius (jobs, projects, GPUs, GPU-hours at stake) and changes nothing. Limits from policy data (jobs,
    projects, GPUs per call; calls per minute) refuse the whole call, naming the limit, its value and what
    was asked; a cross-project batch needs an extra approval."""
    with ctx.gw.transaction() as session:
        return batch.stop_many(ctx.gw, session, ctx.caller(session), body)


@router.post("/v1/jobs:reprioritize", status_code=status.HTTP_202_ACCEPTED,
             summary="Set the priority of many jobs as one decision")
def reprioritize_many(body: BatchPriorityRequest, ctx: Ctx) -> dict[str, Any]:
    """Same selection, dry run, blast radius and limits as `jobs:stop`; others' jobs need a second person
    (A3), and the approval is bound to the exact id list and the new value. Each own job is judged on its own
    (A2): alone you may set it at most to the higher of its priority now and its unadjusted priority (what
    the scheduler alone gives it); one job the value would raise past that refuses the whole batch, naming
    the job and its highest value, unless you are a queue admin or on-call, when it needs a second person."""
    with ctx.gw.transaction() as session:
        return batch.reprioritize_many(ctx.gw, session, ctx.caller(session), body)
