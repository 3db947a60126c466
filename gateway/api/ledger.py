"""/v1/ledger: read-only access for auditors. There is no route that changes or deletes an entry (H3)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from gateway.api.deps import Ctx, RequestContext
from gateway.jobs import refuse_unless_allowed
from gateway.pipeline import decide

router = APIRouter(prefix="/v1/ledger", tags=["ledger"])


def _require_ledger_read(ctx: RequestContext) -> None:
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        refuse_unless_allowed(decide(ctx.gw, session, caller, "ledger.read", record=False))


@router.get("/entries", summary="Read ledger entries")
def entries(
    ctx: Ctx,
    start: Annotated[int, Query(ge=0, description="First seq")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Entries in seq order, each with its hash and the exact canonical bytes that were hashed."""
    _require_ledger_read(ctx)
    ledger = ctx.gw.ledger
    rows = ledger.entries(start, limit)
    return {
        "size": ledger.size(),
        "entries": [{"seq": e.seq, "hash": e.hash, "raw": e.raw.decode(), "entry": json.loads(e.raw)} for e in rows],
    }


@router.get("/checkpoint", response_class=PlainTextResponse, summary="Latest signed checkpoint (C2SP note)")
def checkpoint(ctx: Ctx) -> str:
    _require_ledger_read(ctx)
    return ctx.gw.ledger.latest_checkpoint()
