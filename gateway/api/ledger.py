"""/v1/ledger: read-only access for auditors. There is no route that changes or deletes an entry (H3).

Retention is a stated setting (JOBGATE_LEDGER_RETENTION, default "forever"), returned by every route
here in the `Jobgate-Ledger-Retention` header and in the entries listing; nothing here deletes.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.responses import PlainTextResponse

from gateway.api.deps import Ctx, RequestContext
from gateway.decisions.pipeline import decide
from gateway.decisions.verdict import refuse_unless_allowed
from gateway.errors import Invalid
from ledger.errors import ProofError

router = APIRouter(prefix="/v1/ledger", tags=["ledger"])

RETENTION_HEADER = "Jobgate-Ledger-Retention"
LAST_SEQ = 2**63 - 1  # a BIGINT in the ledger store: no entry lies past it
_READ_ONLY = (
    " Read-only: no API changes or deletes a ledger entry; retention is stated by"
    " `JOBGATE_LEDGER_RETENTION` (default `forever`) and returned in the `Jobgate-Ledger-Retention` header."
    " Needs the `ledger.read` capability (auditors, security reviewers, platform admins)."
)


def _require_ledger_read(ctx: RequestContext) -> None:
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        refuse_unless_allowed(decide(ctx.gw, session, caller, "ledger.read", record=False))


def _retention(ctx: RequestContext, response: Response) -> str:
    retention = ctx.gw.settings.ledger_retention
    response.headers[RETENTION_HEADER] = retention
    return retention


@router.get("/entries", summary="Read ledger entries", description="Entries in seq order." + _READ_ONLY)
def entries(
    ctx: Ctx,
    response: Response,
    start: Annotated[int, Query(ge=0, le=LAST_SEQ, description="First seq")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many entries")] = 100,
) -> dict[str, Any]:
    """Entries in seq order, each with its hash and the exact canonical bytes that were hashed."""
    _require_ledger_read(ctx)
    ledger = ctx.gw.ledger
    rows = ledger.entries(start, limit)
    return {
        "size": ledger.size(),
        "retention": _retention(ctx, response),
        "entries": [{"seq": e.seq, "hash": e.hash, "raw": e.raw.decode(), "entry": json.loads(e.raw)} for e in rows],
    }


@router.get(
    "/checkpoint",
    response_class=PlainTextResponse,
    summary="Latest signed checkpoint (C2SP note)",
    description=(
        "The latest signed checkpoint as a C2SP tlog-checkpoint signed note (origin, tree size, base64"
        " root, Ed25519 signature lines). Save it: `jobgate ledger verify --trusted-checkpoint FILE` later"
        " proves the ledger still extends it." + _READ_ONLY
    ),
)
def checkpoint(ctx: Ctx, response: Response) -> str:
    _require_ledger_read(ctx)
    _retention(ctx, response)
    return ctx.gw.ledger.latest_checkpoint()


@router.get("/proof/inclusion", summary="RFC 9162 inclusion proof of one entry")
def inclusion(
    ctx: Ctx,
    response: Response,
    seq: Annotated[int, Query(ge=0, description="Leaf index (the entry's seq)")],
    size: Annotated[int | None, Query(ge=1, description="Tree size; default: current")] = None,
) -> dict[str, Any]:
    """`{"leaf_index", "tree_size", "leaf_hash", "hashes"}`, hashes base64 in RFC 9162 order."""
    _require_ledger_read(ctx)
    _retention(ctx, response)
    try:
        return ctx.gw.ledger.inclusion_proof(seq, size).to_json()
    except ProofError as e:
        raise Invalid(str(e)) from e


@router.get("/proof/consistency", summary="RFC 9162 consistency proof between two tree sizes")
def consistency(
    ctx: Ctx,
    response: Response,
    old: Annotated[int, Query(ge=1, description="Earlier tree size")],
    new: Annotated[int | None, Query(ge=1, description="Later tree size; default: current")] = None,
) -> dict[str, Any]:
    """`{"old_size", "new_size", "hashes"}`, hashes base64 in RFC 9162 order."""
    _require_ledger_read(ctx)
    _retention(ctx, response)
    try:
        return ctx.gw.ledger.consistency_proof(old, new).to_json()
    except ProofError as e:
        raise Invalid(str(e)) from e
