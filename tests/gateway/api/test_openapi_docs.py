"""The API's OpenAPI document reads well on its own: every operation says what it does, and every parameter,
request and response body, and field in them is described. A new route or field without words fails here,
naming it."""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from cli_testkit import readme_curls
from fastapi.routing import APIRoute
from pydantic import TypeAdapter

from gateway.api.examples import EXAMPLES
from gateway.app import create_app
from gateway.errors import GatewayError, leaf_routes

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
    assert spec["paths"]["/healthz"]["get"]["security"] == [{}, {"bearer": []}]  # a token optional (health.py)


# -- what an operation answers, and an example of what to send ---------------------------------------------------

MUTATING = frozenset({"post", "put", "patch", "delete"})
_HTTP_NAME = re.compile(r"^HTTP_(\d{3})_")


def api_routes() -> dict[str, APIRoute]:
    """"METHOD /path" -> the route, for every operation of the document."""
    return {f"{method} {route.path}": route for route in leaf_routes(create_app().routes)
            if isinstance(route, APIRoute) and route.include_in_schema for method in sorted(route.methods)}


def statuses_set_by(fn: Callable[..., Any], seen: set[Callable[..., Any]] | None = None) -> set[int]:
    """The HTTP statuses a route's own code (decorator included) sets: `status.HTTP_202_ACCEPTED`,
    `status_code=202`, in it and in the functions of its module it calls by name, such as a helper that turns an
    approval to wait for into a 202. Errors are raised as GatewayError subclasses: see the test below."""
    seen = seen if seen is not None else set()
    seen.add(fn)
    module = inspect.getmodule(fn)
    found: set[int] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
        if isinstance(node, ast.Attribute) and (m := _HTTP_NAME.match(node.attr)):
            found.add(int(m.group(1)))
        elif isinstance(node, ast.keyword) and node.arg == "status_code" and isinstance(node.value, ast.Constant):
            found.add(int(node.value.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            callee = getattr(module, node.func.id, None)
            if inspect.isfunction(callee) and inspect.getmodule(callee) is module and callee not in seen:
                found |= statuses_set_by(callee, seen)
    return found


def covered(status: int, declared: Iterable[str]) -> bool:
    return str(status) in declared or f"{str(status)[0]}XX" in declared


def test_every_status_an_operations_code_sets_is_declared(spec: dict[str, Any]) -> None:
    """`DELETE /v1/jobs/{id}` and `POST /v1/emergency-stops` answered 202 (an approval to wait for) where the
    document named only 200 and 201, so a generated client took the 202 for an error."""
    routes = api_routes()
    missing = []
    for name, op in operations(spec):
        route = routes[name]
        for status in sorted(statuses_set_by(route.endpoint) | {route.status_code or 200}):
            if str(status) not in op["responses"]:
                missing.append(f"{name} {status}")
    assert not missing, f"statuses the code sets that the document does not declare: {missing}"


def error_statuses() -> set[int]:
    """Every status an error answer can have: each GatewayError's, and the handlers' own (gateway/errors.py)."""
    found, todo = set(), [GatewayError]
    while todo:
        cls = todo.pop()
        found.add(cls.status)
        todo += cls.__subclasses__()
    return found | {409, 500, 503}  # integrity and lock conflicts, the unexpected, the database unreachable


def test_every_error_an_operation_that_takes_a_token_can_answer_is_declared(spec: dict[str, Any]) -> None:
    """503 (the ledger, the database or the rate-limit counts unavailable) and 500 had no word in the document;
    a mutation refused for its rate limit (429) says when to try again in a header the document names."""
    statuses = error_statuses()
    assert {401, 403, 404, 409, 413, 422, 429, 503} <= statuses
    # Operations that require one (a health probe's optional token, `[{}, bearer]`, refuses nothing).
    taking_token = [(name, op) for name, op in operations(spec) if op.get("security") == [{"bearer": []}]]
    missing = [f"{name} {s}" for name, op in taking_token for s in sorted(statuses)
               if not covered(s, op["responses"])]
    assert not missing, f"error statuses not declared: {missing}"
    for name, op in taking_token:
        if name.split()[0].lower() in MUTATING:
            assert "Retry-After" in op["responses"]["429"].get("headers", {}), name


def _example(spec: dict[str, Any], op: dict[str, Any]) -> Any:
    media = op["requestBody"]["content"]["application/json"]
    return media.get("example", next(iter(media.get("examples", {}).values()), {}).get("value"))


def test_every_mutating_operation_with_a_body_has_an_example_the_route_accepts(spec: dict[str, Any]) -> None:
    """/docs showed a schema and no example body, so "Try it out" started from `{}` or a sample that the route
    refused (a selector of `{}`, a reason of `"string"`)."""
    routes = api_routes()
    with_body = [(name, op) for name, op in operations(spec)
                 if name.split()[0].lower() in MUTATING and "requestBody" in op]
    assert len(with_body) > 20
    bare = [name for name, op in with_body if _example(spec, op) is None]
    assert not bare, f"mutating operations without an example body: {bare}"
    assert not set(EXAMPLES) - {name for name, _ in with_body}, "examples of operations that take no body, or none"
    for name, op in with_body:
        field = routes[name].body_field
        assert field is not None, name
        TypeAdapter(field.field_info.annotation).validate_python(_example(spec, op))  # raises naming the field


def test_the_readmes_curl_examples_send_real_bodies_to_real_routes(spec: dict[str, Any]) -> None:
    """A README curl ended in `...`: a newcomer could not tell what to send."""
    curls = readme_curls()
    assert curls
    routes = api_routes()
    for argv in curls:
        assert "..." not in argv, argv
        url = next(a for a in argv if "$JOBGATE_URL" in a)
        path = url.replace("$JOBGATE_URL", "")
        method = argv[argv.index("-X") + 1] if "-X" in argv else ("POST" if "-d" in argv else "GET")
        route = next((r for key, r in routes.items() if key.split()[0] == method
                      and r.path_regex.match(path.split("?")[0])), None)
        assert route is not None, f"no route answers {method} {path}"
        if "-d" in argv:
            assert route.body_field is not None, argv
            TypeAdapter(route.body_field.field_info.annotation).validate_python(
                json.loads(argv[argv.index("-d") + 1]))
