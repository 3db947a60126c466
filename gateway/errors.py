"""Domain errors of the gateway and their single mapping to RFC 9457 problem+json responses."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

PROBLEM_BASE = "https://jobgate.dev/problems/"
log = logging.getLogger("jobgate.http")


class GatewayError(Exception):
    """Root of the gateway's errors. `kind` is the stable part of the problem `type` URI."""

    status = 400
    kind = "bad-request"
    title = "Bad request"
    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra
        self.headers: dict[str, str] = {}  # HTTP headers of the answer beside the problem body


class Unauthenticated(GatewayError):
    status, kind, title = 401, "unauthenticated", "Authentication required"


class Forbidden(GatewayError):
    status, kind, title = 403, "forbidden", "Forbidden"


class PolicyDenied(Forbidden):
    kind, title = "policy-denied", "Denied by policy"


class RateLimited(GatewayError):
    """H2: a calls-per-minute limit is used up. 429 with Retry-After (RFC 6585 §4, RFC 9110 §10.2.3): the same call
    succeeds later, unlike a blast-radius limit (jobs, projects, GPUs per call), which is a policy refusal (403)
    that no wait changes. The refusal is in the ledger like any decision (`ledger_seq`)."""

    status, kind, title = 429, "rate-limited", "Too many requests"

    def __init__(self, detail: str, *, retry_after_s: int, **extra: Any) -> None:
        super().__init__(detail, retry_after_s=retry_after_s, **extra)
        self.headers = {"Retry-After": str(retry_after_s)}


class RateCountsUnavailable(GatewayError):
    """H2: the shared call counts (Redis) cannot be read, so the call is refused (fail closed) and ledgered. 503:
    the gateway cannot decide now, and the caller may try again; nothing about the caller is refused."""

    status, kind, title = 503, "rate-limit-unavailable", "Rate limit counts unavailable: mutation refused"


class NotFound(GatewayError):
    status, kind, title = 404, "not-found", "Not found"


class Conflict(GatewayError):
    status, kind, title = 409, "conflict", "Conflict"


class Invalid(GatewayError):
    status, kind, title = 422, "invalid-request", "Invalid request"


class BodyTooLarge(GatewayError):
    status, kind, title = 413, "body-too-large", "Request body too large"


class DatabaseInUse(GatewayError):
    """At start-up: a gateway process that may not share it holds the business database (gateway/store/db.py
    Database.claim)."""

    status, kind, title = 503, "database-in-use", "Business database in use by another gateway"


class SqliteTooOld(GatewayError):
    """At start-up: the SQLite library Python was built with lacks what the gateway uses (gateway/store/db.py)."""

    status, kind, title = 503, "sqlite-too-old", "SQLite library too old"


class LedgerMismatch(GatewayError):
    """At start-up: the business database's records cite another ledger than this process's (gateway/bootstrap.py
    bind_ledger)."""

    status, kind, title = 503, "ledger-mismatch", "Ledger is not the one the business database cites"


class ExecutorUnavailable(GatewayError):
    """What runs the jobs (a Slurm cluster's controller) does not answer: a change it would have to carry out is
    refused before anything is recorded as asked."""

    status, kind, title = 503, "executor-unavailable", "The cluster does not answer: mutation refused"


class LedgerUnavailable(GatewayError):
    status, kind, title = 503, "ledger-unavailable", "Ledger unavailable: mutation refused"


_INSTANCE_MAX = 512  # characters of the request path kept in `instance`: a longer one is not echoed back whole


def problem(status: int, kind: str, title: str, detail: str, instance: str, **extra: Any) -> JSONResponse:
    if len(instance) > _INSTANCE_MAX:
        instance = instance[:_INSTANCE_MAX] + "..."
    body = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail, "instance": instance}
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type="application/problem+json")


# SQLSTATEs of a transaction aborted in favour of another: deadlock detected, serialization failure.
_ABORTED_FOR_ANOTHER = frozenset({"40P01", "40001"})


RefusalHook = Callable[[Request, "GatewayError"], Awaitable[None]]


def install_error_handlers(app: FastAPI, *, on_refusal: RefusalHook | None = None) -> None:
    """Map every error to problem+json. `on_refusal` sees each GatewayError before it is answered (the app
    ledgers refused attempts there, gateway/decisions/refusals.py); it must not raise."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        if on_refusal is not None:
            await on_refusal(request, exc)
        response = problem(exc.status, exc.kind, exc.title, exc.detail, request.url.path, **exc.extra)
        response.headers.update(exc.headers)
        return response

    # The business database's own refusals reached the caller as a bare "Internal Server Error" page. Each
    # comes out of the request's transaction, which rolled back: say so, as problem+json, without the SQL.
    @app.exception_handler(IntegrityError)
    async def _integrity(request: Request, exc: IntegrityError) -> JSONResponse:
        # Two requests wrote the same record at once (two creations of one name): the later one loses.
        log.warning("%s %s: integrity error, rolled back: %s", request.method, request.url.path, exc.orig)
        return problem(409, "conflict", "Conflict", "another request wrote the same record at the same time;"
                       " nothing was changed, try again", request.url.path)

    @app.exception_handler(OperationalError)
    async def _database_unavailable(request: Request, exc: OperationalError) -> JSONResponse:
        if getattr(exc.orig, "sqlstate", None) in _ABORTED_FOR_ANOTHER:
            # PostgreSQL broke a deadlock, or a serialization conflict, by aborting this transaction: a
            # concurrent request (or the scheduler's cycle) holds the same rows. The database is fine.
            log.warning("%s %s: aborted for a concurrent transaction: %s", request.method, request.url.path, exc.orig)
            return problem(409, "conflict", "Conflict", "a concurrent request changed the same records and the"
                           " database aborted this one to settle it; nothing was changed, try again", request.url.path)
        log.error("%s %s: business database unavailable: %s", request.method, request.url.path, exc.orig)
        return problem(503, "database-unavailable", "Business database unavailable: request refused",
                       "the business database could not be reached or refused the transaction; nothing was"
                       " changed, try again later", request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The server still logs the traceback (Starlette re-raises after answering); the caller gets no trace.
        return problem(500, "internal-error", "Internal error",
                       f"the gateway failed unexpectedly ({exc.__class__.__name__}); its database changes were"
                       " rolled back; the gateway log has the details", request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_field_error(e) for e in exc.errors()]
        detail = "; ".join(f"{e['field'] or 'body'}: {e['message']}" for e in errors)
        return problem(422, "invalid-request", "Invalid request", detail, request.url.path, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """The router's own 404 and 405 (no route; a route without that method): say what was asked and,
        for a 405, keep the Allow header RFC 9110 requires and name the methods in words too."""
        kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        asked = f"{request.method} {request.url.path}"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_methods_at(app, request))
        detail = {
            404: f"no endpoint answers {asked}; the API is listed at /docs",
            405: f"{asked} is not allowed here; this path takes {headers.get('Allow')}",
        }.get(exc.status_code, str(exc.detail))
        response = problem(exc.status_code, kind, str(exc.detail), detail, request.url.path)
        response.headers.update(headers)
        return response


def _methods_at(app: FastAPI, request: Request) -> list[str]:
    """Every method some route takes at this path. Starlette's own Allow names only the first route that
    matched the path, and GET and POST on one path are two routes here."""
    methods: set[str] = set()
    for route in leaf_routes(app.router.routes):
        if route.matches(request.scope)[0] is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods)


def leaf_routes(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """The app's routes themselves, also those of routers included in routers (FastAPI wraps each included
    router in one route object that keeps the original router)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from leaf_routes(inner.routes) if inner is not None else [route]


# Every pattern a request field must match, in words: pydantic quotes the regular expression itself, which reads
# as noise to most people who mistyped a name. tests/gateway/api/test_bad_input_sweep.py checks that each pattern
# in the OpenAPI document is here.
PATTERN_WORDS = {
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$":
        "must be 1 to 128 characters: a letter or digit, then letters, digits, '.', '_' or '-'",
    r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$":
        "must be 1 to 128 characters: a letter or digit, then letters, digits, '.', '_', '-' or '/'",
    r"^[A-Za-z0-9_.\-]+$": "must be letters, digits, '.', '_' or '-' only",
    r"^(\*|[A-Za-z0-9_.\-]+)$": "must be * (every project) or letters, digits, '.', '_' or '-' only",
}


def _field_error(e: Any) -> dict[str, str]:
    """One pydantic error as {field, message}; the body's own fields are named without the "body." prefix."""
    if e["type"] == "json_invalid":  # its loc is ("body", character offset): no field to name
        return {"field": "", "message": f"not valid JSON at character {e['loc'][-1]} ({e['ctx']['error']})"}
    message = e["msg"]
    if e["type"] == "string_pattern_mismatch":
        message = PATTERN_WORDS.get(str(e.get("ctx", {}).get("pattern")), message)
    return {"field": ".".join(str(p) for p in e["loc"] if p != "body"), "message": message}
