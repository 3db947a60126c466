"""Request-scoped dependencies: the gateway, and the caller authenticated inside a transaction.

Each request's context begins its attempt (gateway/decisions/attempts.py): what it asks, and, once authenticated, who
asks; a refusal answered to a known caller is ledgered from it (gateway/decisions/refusals.py)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Depends, Header, Path, Request
from sqlalchemy.orm import Session

from gateway.access import breakglass
from gateway.api.storable_text import refuse_unstorable_text
from gateway.context import Gateway
from gateway.decisions import attempts
from gateway.identity.auth import TRIGGER_HEADER, Caller, authenticate, bearer_secret


@dataclass(frozen=True)
class RequestContext:
    gw: Gateway
    authorization: str | None
    trigger: str | None
    source: dict[str, str | bool | None]
    breakglass_grant: str | None = None  # the grant whose use this call was counted as
    attempt: attempts.Attempt | None = None

    def caller(self, session: Session) -> Caller:
        if self.breakglass_grant:
            caller = breakglass.caller_for(self.gw, session, self.breakglass_grant, source=dict(self.source))
        else:
            caller = authenticate(session, self.authorization, trigger=self.trigger, source=self.source,
                                  now=self.gw.clock(), cache=self.gw.token_cache)
        if self.attempt is not None:
            self.attempt.authenticated(caller)  # from here on, a refusal names this caller in the ledger
        return caller


def break_glass_secret(authorization: str | None) -> str | None:
    scheme, _, secret = (authorization or "").partition(" ")
    secret = secret.strip()
    return secret if scheme.lower() == "bearer" and secret.startswith(breakglass.PREFIX) else None


async def get_context(
    request: Request,
    authorization: Annotated[str | None, Header(description="Bearer token: `Bearer jg_...`")] = None,
    x_jobgate_trigger: Annotated[
        str | None, Header(alias=TRIGGER_HEADER, description="Service accounts: pipeline and run id (F1).")
    ] = None,
) -> RequestContext:
    gw = request.app.state.gateway
    secret = break_glass_secret(authorization)
    if not secret:
        bearer_secret(authorization)  # 401 for a missing or malformed token, before the body is judged
    await refuse_unstorable_text(request)
    client = request.client.host if request.client else None
    user_agent = request.headers.get("user-agent", "")
    source: dict[str, str | bool | None] = {
        "ip": client,
        "user_agent": user_agent,
        "script": x_jobgate_trigger is not None or not user_agent.startswith("Mozilla"),
        "request_id": request.headers.get("x-request-id"),
    }
    grant = None
    if secret:
        # The use is counted, ledgered and alerted (or a spent grant revoked) in a transaction of its own.
        grant = await anyio.to_thread.run_sync(partial(breakglass.settle_credential, gw, secret, source=dict(source)))
    # Begun after the use was ledgered: that entry is not the record of what this request then asks.
    attempt = attempts.begin(attempts.Attempt(
        request.method, attempts.route_of(request.scope), dict(request.path_params),
        request.query_params.multi_items(), await request.body()))
    request.state.attempt = attempt
    return RequestContext(gw, authorization, x_jobgate_trigger, source, grant, attempt)


Ctx = Annotated[RequestContext, Depends(get_context)]
ID_MAX = 64  # characters in the widest id column


def path_id(description: str) -> Any:
    """An id in the path: one longer than any id column names nothing, and is refused rather than echoed back."""
    return Path(max_length=ID_MAX, description=description)


# Path parameters several routers share, described once for the OpenAPI document.
JobId = Annotated[str, path_id("The job's id, as returned when it was submitted.")]
NodeId = Annotated[str, path_id("The node's id; an agent's token names the one node it may speak for.")]
ApprovalId = Annotated[str, path_id("The approval request's id, from the 202 answer that opened it.")]
