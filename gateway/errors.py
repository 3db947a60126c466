"""Domain errors of the gateway and their single mapping to RFC 9457 problem+json responses."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_BASE = "https://jobgate.dev/problems/"


class GatewayError(Exception):
    """Root of the gateway's errors. `kind` is the stable part of the problem `type` URI."""

    status = 400
    kind = "bad-request"
    title = "Bad request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class Unauthenticated(GatewayError):
    status, kind, title = 401, "unauthenticated", "Authentication required"


class Forbidden(GatewayError):
    status, kind, title = 403, "forbidden", "Forbidden"


class PolicyDenied(Forbidden):
    kind, title = "policy-denied", "Denied by policy"


class NotFound(GatewayError):
    status, kind, title = 404, "not-found", "Not found"


class Conflict(GatewayError):
    status, kind, title = 409, "conflict", "Conflict"


class Invalid(GatewayError):
    status, kind, title = 422, "invalid-request", "Invalid request"


class LedgerUnavailable(GatewayError):
    status, kind, title = 503, "ledger-unavailable", "Ledger unavailable: mutation refused"


def problem(status: int, kind: str, title: str, detail: str, instance: str, **extra: Any) -> JSONResponse:
    body = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail, "instance": instance}
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type="application/problem+json")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return problem(exc.status, exc.kind, exc.title, exc.detail, request.url.path, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_field_error(e) for e in exc.errors()]
        detail = "; ".join(f"{e['field'] or 'body'}: {e['message']}" for e in errors)
        return problem(422, "invalid-request", "Invalid request", detail, request.url.path, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return problem(exc.status_code, kind, str(exc.detail), str(exc.detail), request.url.path)


def _field_error(e: Any) -> dict[str, str]:
    """One pydantic error as {field, message}; the body's own fields are named without the "body." prefix."""
    if e["type"] == "json_invalid":  # its loc is ("body", character offset): no field to name
        return {"field": "", "message": f"not valid JSON at character {e['loc'][-1]} ({e['ctx']['error']})"}
    return {"field": ".".join(str(p) for p in e["loc"] if p != "body"), "message": e["msg"]}
