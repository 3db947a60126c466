"""/v1/stats/* (Q10, Q11) and /v1/audit/* : the JSON behind the console's admin and auditor pages, so the
CLI shows the same (`jobgate stats usage|waits|fragmentation|suggestions`, `jobgate audit ...`)."""

from __future__ import annotations

import shutil
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from gateway.api.deps import Ctx, RequestContext
from gateway.api.ledger import LAST_SEQ
from gateway.console import ledger_view
from gateway.console.access import ADMIN_CAPABILITIES
from gateway.decisions.pipeline import decide
from gateway.decisions.verdict import refuse_unless_allowed
from gateway.errors import Forbidden
from gateway.jobs import insights

router = APIRouter(tags=["statistics"])
_ADMIN = " Needs an operator capability in every project (platform admin, on-call, security reviewer)."


def _admin(ctx: RequestContext) -> None:
    with ctx.gw.transaction(immediate=False) as session:
        who = ctx.caller(session).real_identity
    if not ctx.gw.policy.capabilities(who, "*") & ADMIN_CAPABILITIES:
        raise Forbidden(f"{who} may not read cluster administration statistics"
                        f" (needs one of {', '.join(sorted(ADMIN_CAPABILITIES))} in every project)")


@router.get("/v1/stats/usage", summary="Cluster usage, the quota heat map (tenant × day) and use over time",
            description="GPU totals, per-tenant owned/borrowed GPUs in use, quota utilisation per tenant and UTC day"
                        " (GPU-hours used ÷ quota GPUs × 24 h), and `timeline`: GPUs in use per tenant in each of the"
                        " last UTC hours (the hour's average), beside the GPUs of all nodes." + _ADMIN)
def usage(ctx: Ctx, days: Annotated[int, Query(ge=1, le=92, description="UTC days of the heat map")] = 7,
          hours: Annotated[int, Query(ge=1, le=168, description="UTC hours of the timeline")] = 24
          ) -> dict[str, Any]:
    _admin(ctx)
    now = ctx.gw.clock()
    with ctx.gw.transaction(immediate=False) as session:
        return {"cluster": insights.cluster_usage(session), "heatmap": insights.heatmap(session, now, days),
                "timeline": insights.usage_over_time(session, now, hours)}


@router.get("/v1/stats/waits", summary="Wait-time distribution per queue",
            description="Per queue: bucket counts and p50/p90/max of submitted → started, and the jobs waiting"
                        " now." + _ADMIN)
def waits(ctx: Ctx) -> dict[str, Any]:
    _admin(ctx)
    with ctx.gw.transaction(immediate=False) as session:
        return insights.waits(session, ctx.gw.clock())


@router.get("/v1/stats/fragmentation", summary="Free GPUs per node and how scattered they are" )
def fragmentation(ctx: Ctx) -> dict[str, Any]:
    """`fragmentation` = 1 − largest free block ÷ free GPUs (0: all free GPUs on one node)."""
    _admin(ctx)
    with ctx.gw.transaction(immediate=False) as session:
        return insights.fragmentation(session)


@router.get("/v1/stats/suggestions", summary="Suggested adjustments: idle quota, stale reservations, starved tenants")
def suggestions(ctx: Ctx) -> dict[str, Any]:
    """Each with its kind, the tenant or job concerned and the figures behind it: quota idle while others
    wait, reservations whose estimated start is long past, tenants with waiting work and nothing running."""
    _admin(ctx)
    with ctx.gw.transaction(immediate=False) as session:
        return {"suggestions": insights.suggestions(session, ctx.gw.clock())}


def _ledger_read(ctx: RequestContext) -> None:
    with ctx.gw.transaction(immediate=False) as session:
        refuse_unless_allowed(decide(ctx.gw, session, ctx.caller(session), "ledger.read", record=False))


@router.get("/v1/audit/entries", tags=["ledger"], summary="Search ledger entries (newest first)",
            description="Filter by job, actor, action, effect (or outcome result), kind and time. Walks back at"
                        " most 50,000 entries per call; pass `next_before` as `before` to go on. Needs"
                        " `ledger.read`.")
def audit_entries(
    ctx: Ctx,
    job: Annotated[str | None, Query(description="Entries about this job id")] = None,
    actor: Annotated[str | None, Query(description="Entries where this principal acted or approved")] = None,
    action: Annotated[str | None, Query(description="Entries for this action, e.g. job.stop")] = None,
    effect: Annotated[str | None, Query(description="Decision effect (allow, deny, needs_approval) or outcome"
                                                    " result")] = None,
    kind: Annotated[str | None, Query(description="Entry kind, e.g. decision, outcome, transition")] = None,
    since: Annotated[str | None, Query(description="ISO 8601 time; a date alone means its midnight UTC")] = None,
    until: Annotated[str | None, Query(description="ISO 8601 time, inclusive")] = None,
    before: Annotated[int | None, Query(ge=0, le=LAST_SEQ, description="Walk back from below this seq (a page's"
                                                          " `next_before`)")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="At most this many entries")] = 50,
) -> dict[str, Any]:
    _ledger_read(ctx)
    f = ledger_view.Filter(job=job, actor=actor, action=action, effect=effect, kind=kind,
                           since=ledger_view.parse_time(since, "since"), until=ledger_view.parse_time(until, "until"))
    return ledger_view.search(ctx.gw, f, before=before, limit=limit)


@router.get("/v1/audit/entries/{seq}", tags=["ledger"], summary="One entry, its inclusion proof, and the check",
            description="The entry, the latest signed checkpoint, the RFC 9162 inclusion proof in that tree, and"
                        " `verified`: the checkpoint's signature checks with the ledger key and the proof leads"
                        " from the entry's leaf hash to its root. Needs `ledger.read`.")
def audit_entry(seq: Annotated[int, Path(description="The entry's seq (its leaf index)")], ctx: Ctx
                ) -> dict[str, Any]:
    _ledger_read(ctx)
    return ledger_view.entry_detail(ctx.gw, seq)


@router.get("/v1/audit/export", tags=["ledger"], response_class=FileResponse,
            summary="Download a ledger bundle for offline verification",
            description="Every signed entry with its blobs, checkpoints and key history, as one file (the format"
                        " of `jobgate ledger export`). Verify anywhere with `jobgate ledger verify --bundle FILE"
                        " --public-key <data-dir>/keys/ledger.vkey`. Needs `ledger.read`.")
def audit_export(ctx: Ctx) -> FileResponse:
    _ledger_read(ctx)
    path = ledger_view.export(ctx.gw)
    return FileResponse(path, filename="jobgate-ledger.bundle", media_type="application/octet-stream",
                        background=BackgroundTask(shutil.rmtree, path.parent, ignore_errors=True))
