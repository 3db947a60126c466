"""The OpenAPI document as clients meet the API: bearer authentication, problem+json errors, example bodies.

FastAPI documents the `Authorization` header as a plain parameter (so /docs has no Authorize button) and every
422 as its own `HTTPValidationError`, while the gateway answers every error as RFC 9457 problem+json
(gateway/errors.py). This rewrites the generated document once, when it is first asked for.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from gateway.api.examples import EXAMPLES

BEARER = "bearer"
# A route that may wait for a second person declares this beside its usual answer (M2).
AWAITS_APPROVAL: dict[int | str, dict[str, Any]] = {202: {
    "description": "A second person must approve first: nothing changed yet; `approval_id` names the request to"
                   " confirm at `POST /v1/approvals/{approval_id}/approve`."}}
_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


class FieldProblem(BaseModel):
    """One invalid field of a 422."""

    field: str = Field(description="Where: `body.reason`, `query.limit`, `path.job_id`...")
    message: str = Field(description="What is wrong with it.")


class Problem(BaseModel):
    """RFC 9457 problem details, the body of every error answer (`application/problem+json`)."""

    type: str = Field(description="A URI naming the kind of problem, e.g. https://jobgate.dev/problems/forbidden.")
    title: str = Field(description="The kind of problem in words.")
    status: int = Field(description="The HTTP status.")
    detail: str = Field(description="What went wrong with this request, in one line.")
    instance: str = Field(description="The request path.")
    errors: list[FieldProblem] | None = Field(None, description="422: each invalid field.")
    rules: list[str] | None = Field(None, description="Policy refusals: the rules that decided.")
    ledger_seq: int | None = Field(None, description="Policy refusals: where the refusal is recorded (-1: not).")
    retry_after_s: int | None = Field(None, description=(
        "429: seconds until a call fits the calls-per-minute limit again, as the `Retry-After` header says."))


_ERRORS = {
    "401": "No token, or one unknown, expired or revoked.",
    "403": "Refused: by policy (`rules`, `ledger_seq`), a blast-radius limit among them (jobs, projects or GPUs per"
           " call: the same call is refused again later), or by the token's scope.",
    "422": "Invalid input: `errors` names each field.",
    "429": "A calls-per-minute limit is used up (rule H2.rate_limit, ledgered at `ledger_seq`): the same call may be"
           " made again after `Retry-After` seconds. Counted on calls that act on existing jobs.",
    "4XX": "Other refusals: 404 unknown id, 409 conflicting state, 413 body too large.",
    "5XX": "503: the ledger, the business database or the rate-limit counts cannot be reached now; nothing changed,"
           " try again. 500: an unexpected failure; its changes were rolled back.",
}
_MUTATING = frozenset({"post", "put", "patch", "delete"})
# gateway/api/idempotency.py: documented on every mutating operation that takes a token.
_KEYED = _MUTATING
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "description": "Optional; makes a retry safe (IETF httpapi idempotency-key draft). A quoted string (RFC 8941"
                   " sf-string, e.g. `\"8e03978e-40d5-43e8-bc93-6894a57f9324\"`) or bare token of 1-255 printable"
                   " ASCII characters, unique per request; scoped to the caller and kept 24 hours. The same key"
                   " and request again gets the first answer, with `Idempotent-Replayed: true`, and nothing is done"
                   " or ledgered again; the same key with another method, path or body: 422; while the first is"
                   " still being processed: 409 with Retry-After. A 5xx, 408, 409 or 429 answer is not kept"
                   " (unless the request acted), so a retry runs again. A malformed key: 400.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 257}}
_KEY_ERRORS = {
    "409": "Conflicting state; or a request with this Idempotency-Key is still being processed (Retry-After), or"
           " was carried out and its answer lost.",
    "422": "Invalid input (`errors` names each field), or an Idempotency-Key already used for another request.",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before making the call again (RFC 9110 §10.2.3).",
                                "schema": {"type": "integer", "minimum": 1}}}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": _PROBLEM_REF}}}


def document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document with a bearer security scheme on every operation that takes a token, and
    problem+json error answers on every operation."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes,
                      tags=app.openapi_tags)
    components = doc.setdefault("components", {})
    components.setdefault("schemas", {}).update(
        {name: schema for name, schema in Problem.model_json_schema(ref_template="#/components/schemas/{model}")
         .pop("$defs", {}).items()})
    components["schemas"]["Problem"] = {k: v for k, v in Problem.model_json_schema(
        ref_template="#/components/schemas/{model}").items() if k != "$defs"}
    components["schemas"].pop("HTTPValidationError", None)
    components["schemas"].pop("ValidationError", None)
    components["securitySchemes"] = {BEARER: {
        "type": "http", "scheme": "bearer",
        "description": "A jobgate token (`jg_...`), or a break-glass credential: `Authorization: Bearer ...`."}}
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            if (example := EXAMPLES.get(f"{method.upper()} {path}")) is not None and "requestBody" in op:
                op["requestBody"]["content"]["application/json"]["example"] = example
            params = op.get("parameters", [])
            takes_token = any(p.get("in") == "header" and p.get("name", "").lower() == "authorization" for p in params)
            op["parameters"] = [p for p in params if not (p.get("in") == "header"
                                                          and p.get("name", "").lower() == "authorization")]
            if not op["parameters"]:
                del op["parameters"]
            responses = op.setdefault("responses", {})
            for code, description in _ERRORS.items():
                if code != "422" and not takes_token:
                    continue  # (the health check, metrics)
                if code == "422" and code not in responses:
                    continue  # an operation with no input to validate
                if code == "429" and method not in _MUTATING:
                    continue  # reads are not counted
                responses[code] = _problem(description)
            if takes_token and method in _KEYED and path.startswith("/v1/"):
                op.setdefault("parameters", []).append(dict(_IDEMPOTENCY_KEY))
                for code, description in _KEY_ERRORS.items():
                    responses[code] = _problem(description)
            if "429" in responses:
                responses["429"]["headers"] = _RETRY_AFTER
            if takes_token:
                op["security"] = [{BEARER: []}]
    app.openapi_schema = doc
    return doc
