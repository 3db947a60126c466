"""Request-scoped dependencies: the gateway, and the caller authenticated inside a transaction."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

import anyio.to_thread
from fastapi import Depends, Header, Path, Request
from sqlalchemy.orm import Session

from gateway import breakglass
from gateway.auth import TRIGGER_HEADER, Caller, authenticate
from gateway.context import Gateway
from gateway.errors import Invalid

# A JSON string can carry U+0000 only as the escape \u0000 (a raw control character is not JSON); one that
# follows an even number of backslashes is that escape, not an escaped backslash before the text "u0000".
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


@dataclass(frozen=True)
class RequestContext:
    gw: Gateway
    authorization: str | None
    trigger: str | None
    source: dict[str, str | bool | None]

    def caller(self, session: Session) -> Caller:
        secret = break_glass_secret(self.authorization)
        if secret:
            return breakglass.caller_for(self.gw, session, secret, source=dict(self.source))
        return authenticate(session, self.authorization, trigger=self.trigger, source=self.source, now=self.gw.clock(),
                            cache=self.gw.token_cache)


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
    await refuse_nul_characters(request)
    client = request.client.host if request.client else None
    user_agent = request.headers.get("user-agent", "")
    source: dict[str, str | bool | None] = {
        "ip": client,
        "user_agent": user_agent,
        "script": x_jobgate_trigger is not None or not user_agent.startswith("Mozilla"),
        "request_id": request.headers.get("x-request-id"),
    }
    gw = request.app.state.gateway
    secret = break_glass_secret(authorization)
    if secret:
        # A spent grant is revoked (and ledgered) in its own transaction before the call is refused.
        await anyio.to_thread.run_sync(breakglass.settle_credential, gw, secret)
    return RequestContext(gw, authorization, x_jobgate_trigger, source)


async def refuse_nul_characters(request: Request) -> None:
    """Refuse U+0000 anywhere in the path, the query or the JSON body, before the route decides anything.

    No id, name or reason needs it, and PostgreSQL text cannot hold it: there it failed the transaction
    with a 500 after the decision was already ledgered, while SQLite stored it. Raises Invalid."""
    for name, value in request.path_params.items():
        if "\x00" in str(value):
            raise Invalid(f"path parameter {name} contains the NUL character (U+0000)", field=name)
    for name, value in request.query_params.multi_items():
        if "\x00" in name or "\x00" in value:
            raise Invalid(f"query parameter {name!r} contains the NUL character (U+0000)", field=name)
    if _NUL_ESCAPE.search(await request.body()):
        raise Invalid("the request body contains the NUL character (\\u0000) in a string")


Ctx = Annotated[RequestContext, Depends(get_context)]
# Path parameters several routers share, described once for the OpenAPI document.
JobId = Annotated[str, Path(description="The job's id, as returned when it was submitted.")]
NodeId = Annotated[str, Path(description="The node's id; an agent's token names the one node it may speak for.")]
ApprovalId = Annotated[str, Path(description="The approval request's id, from the 202 answer that opened it.")]
