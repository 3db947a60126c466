"""Structured JSON logs with a request id per HTTP request.

`RequestIdMiddleware` (pure ASGI, so streaming and long polls are untouched) takes the caller's
`X-Request-Id` when it is sane, or makes one, puts it into the request headers (so the decision pipeline
records it in the ledger's `source`), onto the response, and into every log line written while the
request runs. `configure_json_logging` makes the `jobgate` loggers write one JSON object per line.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import secrets
import sys
import time
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "X-Request-Id"
_HEADER_KEY = b"x-request-id"
# Accept a caller's id only if it is short and harmless in a log line; otherwise make our own.
_SANE = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("jobgate_request_id", default=None)
access_log = logging.getLogger("jobgate.http")


def new_request_id() -> str:
    return "req-" + secrets.token_hex(8)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, and any `extra` fields."""

    _STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid:
            out["request_id"] = rid
        for key, value in vars(record).items():
            if key not in self._STANDARD and key not in out and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, sort_keys=True)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time of the call (test runners swap it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure_json_logging(level: int = logging.INFO) -> None:
    """Route the `jobgate` logger tree to stderr as JSON lines (idempotent). Records still propagate, so
a host application's own handlers see them too."""
    root = logging.getLogger("jobgate")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)


class RequestIdMiddleware:
    """Give every HTTP request an id: in its headers, its response and its log lines; log one access line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == _HEADER_KEY), None)
        rid = given if given and _SANE.match(given) else new_request_id()
        headers = [(k, v) for k, v in scope["headers"] if k != _HEADER_KEY]
        headers.append((_HEADER_KEY, rid.encode("latin-1")))
        scope = {**scope, "headers": headers}
        token = request_id_var.set(rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message = {**message, "headers": [*message.get("headers", []), (_HEADER_KEY, rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope.get("path", "")
            # Long polls from agents would flood the log; everything else gets one line.
            if not path.startswith("/v1/agents/"):
                access_log.info("%s %s %d", scope.get("method", ""), path, status,
                                extra={"request_id": rid, "method": scope.get("method"), "path": path,
                                       "status": status,
                                       "duration_ms": round((time.perf_counter() - started) * 1000, 2)})
            request_id_var.reset(token)
