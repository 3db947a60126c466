"""A ceiling on request bodies, checked as the bytes arrive.

The framework reads a whole body before it judges the caller, so without a ceiling anyone who can reach the
port could make the gateway buffer gigabytes. Job specs, decisions and approvals fit in far less than 1 MiB;
node agents get more, because stop evidence lists every checkpoint file of a job with its SHA-256.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import BodyTooLarge, problem

MAX_BODY_BYTES = 1 << 20
MAX_AGENT_BODY_BYTES = 16 << 20
AGENT_PREFIX = "/v1/agents/"


def limit_for(path: str) -> int:
    return MAX_AGENT_BODY_BYTES if path.startswith(AGENT_PREFIX) else MAX_BODY_BYTES


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit:,} bytes, the most this endpoint takes"


class BodyLimitMiddleware:
    """Refuse a declared Content-Length over the limit before reading anything (the HTTP server holds a body
    to its declared length). A body without one (chunked) is read here up to the limit and then handed on;
    past the limit the caller gets the same 413 problem. Either way nothing happens."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = limit_for(scope["path"])
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is None and scope["method"] not in ("GET", "HEAD"):
            body = await _read_up_to(receive, limit)
            if body is None:
                await _refuse(scope, receive, send, limit)
                return
            receive = _replay(body, receive)
        elif declared is not None and declared.isdigit() and int(declared) > limit:
            await _refuse(scope, receive, send, limit)
            return
        await self.app(scope, receive, send)


async def _read_up_to(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it passes `limit` bytes."""
    parts: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts)  # the client went away: the app sees an empty body and answers no one
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """Hand the body that was read to the app, then whatever the client does next (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    error = BodyTooLarge(_too_large(limit))
    await problem(error.status, error.kind, error.title, error.detail, scope["path"])(scope, receive, send)
