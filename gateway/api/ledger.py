"""/v1/ledger: read-only access for auditors. There is no route that changes or deletes an entry (H3)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from gateway.api.deps import Ctx, RequestContext
from gateway.errors import Invalid
from gateway.jobs import refuse_unless_allowed
from gateway.pipeline import decide
from ledger.errors import ProofError

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


@router.get("/proof/inclusion", summary="RFC 9162 inclusion proof of one entry")
def inclusion(
    ctx: Ctx,
    seq: Annotated[int, Query(ge=0, description="Leaf index (the entry's seq)")],
    size: Annotated[int | None, Query(ge=1, description="Tree size; default: current")] = None,
) -> dict[str, Any]:
    """`{"leaf_index", "tree_size", "leaf_hash", "hashes"}`, hashes base64 in RFC 9162 order."""
    _require_ledger_read(ctx)
    try:
        return ctx.gw.ledger.inclusion_proof(seq, size).to_json()
    except ProofError as e:
        raise Invalid(str(e)) from e


@router.get("/proof/consistency", summary="RFC 9162 consistency proof between two tree sizes")
def consistency(
    ctx: Ctx,
    old: Annotated[int, Query(ge=1, description="Earlier tree size")],
    new: Annotated[int | None, Query(ge=1, description="Later tree size; default: current")] = None,
) -> dict[str, Any]:
    """`{"old_size", "new_size", "hashes"}`, hashes base64 in RFC 9162 order."""
    _require_ledger_read(ctx)
    try:
        return ctx.gw.ledger.consistency_proof(old, new).to_json()
    except ProofError as e:
        raise Invalid(str(e)) from e
