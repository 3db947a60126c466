"""The API's OpenAPI document reads well on its own: every operation says what it does, and every parameter,
request and response body, and field in them is described. A new route or field without words fails here,
naming it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.app import create_app

# FastAPI's own models for its 422 bodies: not ours to describe (and replaced by Problem: see the last test).
FRAMEWORK_SCHEMAS = {"HTTPValidationError", "ValidationError"}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return create_app().openapi()  # the document only: the lifespan (stores, engines) never starts


def operations(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{method.upper()} {path}", op) for path, ops in spec["paths"].items() for method, op in ops.items()]


def test_every_operation_has_a_summary_and_a_description(spec: dict[str, Any]) -> None:
    bare = [name for name, op in operations(spec) if not op.get("summary") or not op.get("description")]
    assert not bare, f"operations without a summary or a description (docstring): {bare}"


def test_every_parameter_is_described(spec: dict[str, Any]) -> None:
    bare = [f"{name} {p['in']} {p['name']}" for name, op in operations(spec) for p in op.get("parameters", [])
            if not p.get("description")]
    assert not bare, f"parameters without a description: {bare}"


def test_every_schema_and_field_is_described(spec: dict[str, Any]) -> None:
    schemas = {k: v for k, v in spec["components"]["schemas"].items() if k not in FRAMEWORK_SCHEMAS}
    assert schemas, "the document has no schemas: the check below would pass on nothing"
    bare = [name for name, s in schemas.items() if not s.get("description")]
    bare += [f"{name}.{field}" for name, s in schemas.items() for field, f in s.get("properties", {}).items()
             if not f.get("description")]
    assert not bare, f"schemas or fields without a description: {bare}"


def test_errors_are_documented_as_the_problem_json_they_are_and_tokens_as_a_bearer_scheme(spec: dict[str, Any]) -> None:
    """/docs had no Authorize button (the token was a header parameter of each call) and documented every 422 as
    FastAPI's own shape, while every error answer is problem+json."""
    assert spec["components"]["securitySchemes"]["bearer"] == {**spec["components"]["securitySchemes"]["bearer"],
                                                                "type": "http", "scheme": "bearer"}
    assert not set(spec["components"]["schemas"]) & FRAMEWORK_SCHEMAS
    submit = spec["paths"]["/v1/jobs"]["post"]
    assert submit["security"] == [{"bearer": []}]
    assert "authorization" not in [p["name"].lower() for p in submit.get("parameters", [])]
    for code in ("401", "403", "422", "4XX"):
        assert submit["responses"][code]["content"] == {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}, code
    every = [op for _, op in operations(spec)]
    assert all("security" in op for op in every if op.get("responses", {}).get("401"))
    assert "security" not in spec["paths"]["/healthz"]["get"]
