"""The OpenAPI document as clients meet the API: bearer authentication and problem+json errors.

FastAPI documents the `Authorization` header as a plain parameter (so /docs has no Authorize button) and every
422 as its own `HTTPValidationError`, while the gateway answers every error as RFC 9457 problem+json
(gateway/errors.py). This rewrites the generated document once, when it is first asked for.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

BEARER = "bearer"
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


_ERRORS = {
    "401": "No token, or one unknown, expired or revoked.",
    "403": "Refused: by policy (`rules`, `ledger_seq`) or by the token's scope.",
    "422": "Invalid input: `errors` names each field.",
    "4XX": "Other refusals: 404 unknown id, 409 conflicting state, 413 body too large, 429 rate limit.",
    "503": "The ledger or the business database cannot take the request now (unreachable, or a lock held too"
           " long): nothing was changed; try again later.",
}
# The answer of a route whose action may need a second person first (M2); its body is the route's own.
SECOND_PERSON: dict[int | str, dict[str, Any]] = {
    202: {"description": "A second person must approve first: `approval_id` names the request; nothing has changed"
                         " yet."}}


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
    for operations in doc.get("paths", {}).values():
        for op in operations.values():
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
                responses[code] = _problem(description)
            if takes_token:
                op["security"] = [{BEARER: []}]
    app.openapi_schema = doc
    return doc
