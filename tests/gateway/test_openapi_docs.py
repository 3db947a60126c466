"""The API's OpenAPI document reads well on its own: every operation says what it does, and every parameter,
request and response body, and field in them is described. A new route or field without words fails here,
naming it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.app import create_app

# FastAPI's own models for its 422 bodies: not ours to describe.
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
