"""/v1/policy: the active policy set, its load history, and reloads by security reviewers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from gateway.api.deps import Ctx
from gateway.decisions.pipeline import decide
from gateway.decisions.policy_reload import PolicyReloader
from gateway.decisions.verdict import refuse_unless_allowed

router = APIRouter(prefix="/v1/policy", tags=["policy"])


def get_reloader(request: Request) -> PolicyReloader:
    reloader: PolicyReloader = request.app.state.policy_reloader
    return reloader


Reloader = Annotated[PolicyReloader, Depends(get_reloader)]


@router.get("", summary="The active policy set: hash, load time, engine and reload history")
def show(ctx: Ctx, reloader: Reloader) -> dict[str, Any]:
    """Every decision entry in the ledger carries the hash shown here. The history lists recent load
    attempts (start-up, API, directory watcher), refused ones with their `file:line` errors."""
    with ctx.gw.transaction() as session:
        ctx.caller(session)
    return reloader.status()


@router.post(
    "/reload",
    summary="Reload the policy set from its directory (security reviewers)",
    responses={422: {"description": "Refused: problem+json with `errors` as `file:line: message`"}},
)
def reload(ctx: Ctx, reloader: Reloader) -> dict[str, Any]:
    """Needs `policy.reload` (security reviewer). The candidate must compile and pass its own tests
    (policies/tests); otherwise it is refused with its errors and the previous set keeps deciding. The
    decision and every load attempt are recorded in the ledger."""
    with ctx.gw.transaction() as session:
        caller = ctx.caller(session)
        rec = decide(ctx.gw, session, caller, "policy.reload")
        refuse_unless_allowed(rec)
    # Outside the transaction: a reload reads the role bindings in a transaction of its own.
    attempt = reloader.reload(trigger="api", by=caller.id, decision_seq=rec.seq)
    return {"attempt": attempt.to_json(), "decision_seq": rec.seq, **reloader.status()}
