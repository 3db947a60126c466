"""Bad input gets a precise RFC 9457 answer and changes nothing, on every route.

Every route of the app is enumerated (walked as tests/gateway/api/test_route_guard.py walks them, all methods)
and its malformed requests are derived from the app's own OpenAPI schema, so a new route or field is swept
without being listed here: a body that is not JSON or not an object; each field, nested ones too, of the
wrong type, out of its enum, with a NUL character or an unpaired surrogate, a megabyte long, past 64 bits,
negative, NaN, infinite, or a date past year 9999; each query parameter likewise; each path id unknown or
full of odd characters; a method the path does not serve; a token that is not one. Each is sent as a demo
user the route would serve, against real objects where the path names one, and must get a 4xx
problem+json whose `detail` says in words what is wrong, while the business database commits nothing and
the ledger gains only decisions and the outcomes that close them as refused.

Run: .venv/bin/pytest -q tests/gateway/api/test_bad_input_sweep.py (PostgreSQL with JOBGATE_TEST_PG_URL).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, app_routes, job_spec, path_objects
from sqlalchemy import Engine, event

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import Settings

# Routes that are not the JSON API, each with why.
EXCLUDED: dict[str, str] = {
    "/openapi.json": "the schema document itself",
    "/docs": "Swagger UI, HTML",
    "/redoc": "ReDoc, HTML",
    "/metrics": "Prometheus text exposition for scrapers",
}
EXCLUDED_PREFIX = ("/ui/", "console pages and forms: HTML, session cookie and CSRF token (tests/gateway/console)")

# Who sends a route's requests: someone the route would serve, so bad input is not merely refused at the
# door. First matching prefix wins; everything else is alice, the owner of the sweep's job.
CALLERS: tuple[tuple[str, str], ...] = (
    ("/v1/agents/", "demo-node-1"),  # the node agents' channel takes only a node's token
    ("/v1/ledger", "audrey"),
    ("/v1/audit", "audrey"),
    ("/v1/forensics", "audrey"),
    ("/v1/policy", "sam"),
    ("/v1/roles", "erin"),
    ("/v1/quotas", "erin"),
    ("/v1/mounts", "erin"),
    ("/v1/stats/", "erin"),
    ("/v1/emergency-stops", "dave"),
    ("/v1/break-glass", "dave"),
    ("/v1/jobs/{job_id}/confirm-stopped", "dave"),
)

# Values a valid request would carry for fields of these names, so that a case with one bad field reaches
# past the others; "{...}" names an object the sweep creates. Other fields get a value from their schema.
KNOWN: dict[str, Any] = {
    "project": "vision",
    "projects": ["vision"],
    "actions": ["job.view"],
    "principal": "bob",
    "role": "queue_admin",
    "job_id": "{job_id}",
    "ids": ["{job_id}"],
    "command": ["python3", "-c", "pass"],
    "scope": {"kind": "job", "value": "{job_id}"},
}

MEGABYTE = "x" * 1_000_000
NUL = "bad\x00value"
LONE_SURROGATE = "bad\ud800value"  # JSON can say it (an escape); UTF-8 cannot
BEYOND_64_BITS = 2**64
# Path ids that name nothing, or could trip a parser, a query or a log line. Sent percent-encoded.
ODD_IDS: dict[str, str] = {
    "unknown": "no-such-object",
    "NUL": "a\x00b",
    "quote": "x' OR '1'='1",
    "non-ASCII": "jöb-💥",
    "control chars": "a\r\nb\tc",
    "dot-dot": "..",
    "long": "j" * 500,
}
ODD_INTS: dict[str, str] = {"negative": "-1", "not a number": "abc", "fraction": "1.5",
                            "beyond 64 bits": str(BEYOND_64_BITS)}
ODD_NUMBERS: dict[str, str] = {"not a number": "abc", "NaN": "nan", "infinite": "inf", "negative": "-1",
                               "overflow": "1e999"}
# A long or unknown value of a free-text query parameter is a filter that matches nothing, not malformed.
ODD_STRINGS: dict[str, str] = {"NUL": NUL}


@dataclass(frozen=True)
class Case:
    """One malformed request. Strings in `path_values`, `query` and `body` may name sweep objects ("{job_id}")."""

    method: str
    route: str
    what: str
    path_values: dict[str, str] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)
    content: Any = None  # a JSON value to send, or bytes sent as they are
    content_type: str = "application/json"
    token: str | None = None  # instead of the caller's
    verb: str | None = None  # instead of `method`
    names: tuple[str, ...] = ()  # a precise detail says one of these: the field, or the value as sent

    @property
    def id(self) -> str:
        return f"{self.method} {self.route} {self.what}"


# --- the routes ---------------------------------------------------------------------------------------------


def is_excluded(path: str) -> bool:
    return path in EXCLUDED or path.startswith(EXCLUDED_PREFIX[0])


def api_routes(app: Any) -> list[tuple[str, str]]:
    return sorted({(m, p) for m, p in app_routes(app) if not is_excluded(p)}, key=lambda mp: (mp[1], mp[0]))


# --- values from the schema ---------------------------------------------------------------------------------


class Schema:
    """Reads the OpenAPI document's schemas: resolves $ref and optional (anyOf with null) wrappers."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.components = spec.get("components", {}).get("schemas", {})

    def resolve(self, s: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in s:
            s = self.components[s["$ref"].rsplit("/", 1)[1]]
        return s

    def alternatives(self, s: dict[str, Any]) -> list[dict[str, Any]]:
        """The non-null shapes a value may take."""
        s = self.resolve(s)
        options = s.get("anyOf") or s.get("oneOf") or [s]
        return [self.resolve(o) for o in options if o.get("type") != "null"]

    def example(self, s: dict[str, Any], name: str = "") -> Any:
        """A valid value: KNOWN by field name, else the least the schema accepts."""
        if name in KNOWN:
            return KNOWN[name]
        alts = self.alternatives(s)
        if not alts:
            return None
        s = alts[0]
        if "enum" in s:
            return s["enum"][0]
        if "const" in s:
            return s["const"]
        kind = s.get("type")
        if kind == "object":
            required = set(s.get("required", ()))
            return {k: self.example(v, k) for k, v in s.get("properties", {}).items() if k in required}
        if kind == "array":
            return [self.example(s.get("items", {}))] * max(1, s.get("minItems", 1))
        if kind in ("integer", "number"):
            low = s.get("minimum", s.get("exclusiveMinimum", 0) + 1 if "exclusiveMinimum" in s else 1)
            return int(min(low, s.get("maximum", low))) if kind == "integer" else float(low)
        if kind == "boolean":
            return False
        if s.get("format") == "date-time":
            return "2030-01-01T00:00:00Z"
        return "sweep-value".ljust(s.get("minLength", 0), "v")

    def wrong_type(self, s: dict[str, Any]) -> Any:
        """A value of a JSON type none of the field's shapes takes."""
        kinds = {a.get("type") for a in self.alternatives(s)}
        # Each candidate with the types that take it (lax mode reads "12" as 12, but never 12 as "12").
        for value, takers in (({"wrong": "type"}, {"object"}), (["wrong", "type"], {"array"}),
                              (12345, {"integer", "number"}), ("twelve", {"string"})):
            if not kinds & takers:
                return value
        return None  # pragma: no cover - a field that takes anything

    def bad_values(self, s: dict[str, Any], name: str, base: Any) -> Iterator[tuple[str, tuple[Any, ...], Any]]:
        """(what, where below this field, value) for each malformed value of this field."""
        yield "wrong type", (), self.wrong_type(s)
        for alt in self.alternatives(s):
            kind = alt.get("type")
            if "enum" in alt:
                yield "not in its enum", (), "no-such-choice"
            elif kind == "string" and alt.get("format") == "date-time":
                yield "not a date", (), "next tuesday"
                yield "past year 9999 in UTC", (), "9999-12-31T23:59:59-14:00"
            elif kind == "string":
                yield "NUL", (), NUL
                yield "lone surrogate", (), LONE_SURROGATE
                yield "1 MB", (), MEGABYTE
            elif kind == "integer":
                yield "beyond 64 bits", (), BEYOND_64_BITS
                if alt.get("minimum", 0) >= 0:  # a field that takes negatives is not wrong to get one
                    yield "negative", (), -1
            elif kind == "number":
                yield "1e308", (), 1e308
                if alt.get("minimum", 0) >= 0:
                    yield "negative", (), -1.0
                yield "NaN", (), float("nan")
                yield "infinite", (), float("inf")
            elif kind == "array":
                item = base[0] if isinstance(base, list) and base else self.example(alt.get("items", {}), name)
                for what, where, value in self.bad_values(alt.get("items", {}), name, item):
                    yield f"[0] {what}", (0, *where), value
            elif kind == "object" and "properties" in alt:
                for key, sub in alt["properties"].items():
                    sub_base = base.get(key) if isinstance(base, dict) else None
                    for what, where, value in self.bad_values(sub, key, sub_base):
                        yield f".{key} {what}", (key, *where), value
            elif kind == "object" and isinstance(alt.get("additionalProperties"), dict):
                for what, where, value in self.bad_values(alt["additionalProperties"], name, None):
                    yield f"[k] {what}", ("k", *where), value


def _set(container: Any, where: tuple[Any, ...], value: Any, schema: Schema, s: dict[str, Any]) -> Any:
    """A copy of `container` with `value` at `where`, intermediate lists and objects made as needed."""
    if not where:
        return value
    head, rest = where[0], where[1:]
    alts = schema.alternatives(s)
    if isinstance(head, int):
        items = alts[0].get("items", {}) if alts else {}
        out = list(container) if isinstance(container, list) and container else [schema.example(items)]
        out[0] = _set(out[0], rest, value, schema, items)
        return out
    obj = next((a for a in alts if a.get("type") == "object"), {})
    sub = obj.get("properties", {}).get(head) or obj.get("additionalProperties") or {}
    out = dict(container) if isinstance(container, dict) else {}
    out[head] = _set(out.get(head, schema.example(sub, head)), rest, value, schema, sub)
    return out


# --- the cases ----------------------------------------------------------------------------------------------


def caller_for(path: str) -> str:
    return next((who for prefix, who in CALLERS if path.startswith(prefix)), "alice")


def cases_for(method: str, path: str, op: dict[str, Any], schema: Schema) -> Iterator[Case]:
    params = op.get("parameters", [])
    in_path = [p for p in params if p["in"] == "path"]
    in_query = [p for p in params if p["in"] == "query"]
    base_path = {p["name"]: f"{{{p['name']}}}" for p in in_path}  # the sweep's object of that name
    base_query = {p["name"]: schema.example(p["schema"], p["name"]) for p in in_query if p.get("required")}
    body_schema: dict[str, Any] | None = None
    if "requestBody" in op:
        body_schema = op["requestBody"]["content"]["application/json"]["schema"]
    base_body = schema.example(body_schema) if body_schema is not None else None

    def case(what: str, **kw: Any) -> Case:
        kw.setdefault("path_values", base_path)
        kw.setdefault("query", base_query)
        kw.setdefault("content", base_body)
        return Case(method, path, what, **kw)

    yield case("sent as PATCH, which no route serves", verb="PATCH", content=None)
    if {} not in op.get("security", [{}]):  # it requires a token (gateway/api/openapi_doc.py; health.py's is optional)
        yield case("with a token that is not one", token="jg_not-a-token")
    for p in in_path:
        is_int = p["schema"].get("type") == "integer"
        for what, value in (ODD_INTS if is_int else ODD_IDS).items():
            yield case(f"path {p['name']} {what}", path_values={**base_path, p["name"]: quote(value, safe="")})
        if not is_int:
            yield case(f"path {p['name']} broken %-escape", path_values={**base_path, p["name"]: "a%ffb%"})
    for p in in_query:
        kinds = {a.get("type") for a in schema.alternatives(p["schema"])}
        if "array" in kinds:
            kinds |= {a.get("items", {}).get("type") for a in schema.alternatives(p["schema"])}
        enum = any("enum" in a for a in schema.alternatives(p["schema"]))
        if enum:
            odd = {"not in its enum": "no-such-choice"}
        elif "integer" in kinds:
            odd = ODD_INTS
        elif "number" in kinds:
            odd = ODD_NUMBERS
        elif "boolean" in kinds:
            odd = {"not a boolean": "maybe"}
        elif any(a.get("format") == "date-time" for a in schema.alternatives(p["schema"])):
            odd = {"not a date": "next tuesday", **ODD_STRINGS}
        else:
            odd = ODD_STRINGS
        for what, value in odd.items():
            yield case(f"query {p['name']} {what}", query={**base_query, p["name"]: value},
                       names=(p["name"], value))
    if base_query:
        yield case("without its required query parameters", query={}, names=tuple(base_query))
    if body_schema is None:
        return
    yield case("body not JSON", content=b'{"reason": "unterminated', names=("body",))
    yield case("body a JSON array", content=[base_body])
    yield case("body a JSON string", content="just a string")
    yield case("body JSON as text/plain", content=json.dumps(base_body).encode(), content_type="text/plain")
    resolved = schema.alternatives(body_schema)
    obj = resolved[0] if resolved else {}
    if obj.get("required"):
        yield case("body an empty object", content={})
    if obj.get("additionalProperties") is False:
        yield case("body with an unknown field", content={**(base_body or {}), "no_such_field": 1})
    for key, sub in obj.get("properties", {}).items():
        for what, where, value in schema.bad_values(sub, key, (base_body or {}).get(key)):
            label = f"body {key}{'' if what[0] in '.[' else ' '}{what}"
            if value is MEGABYTE:
                # Each its own, so that one a route took (a job's label) is not what another case finds.
                # It may be refused for what it means (a filter matching nothing), not for its size.
                value, names = f"{method} {path} {label}: ".ljust(len(MEGABYTE), "x"), ()
            else:
                names = (key, key.replace("_", " "), json.dumps(value),
                         *([f"{value:g}"] if isinstance(value, float) else []))
            yield case(label, content=_set(base_body, (key, *where), value, schema, body_schema), names=names)


def all_cases() -> list[Case]:
    app = create_app()  # the document only: the lifespan (stores, engines) never starts
    spec = app.openapi()
    schema = Schema(spec)
    out: list[Case] = []
    for method, path in api_routes(app):
        op = spec["paths"].get(path, {}).get(method.lower())
        assert op is not None, f"{method} {path} is served but not in the OpenAPI document"
        out.extend(cases_for(method, path, op, schema))
    return out


CASES = all_cases()


# --- the gateway under test ---------------------------------------------------------------------------------


class CommittedWrites:
    """Counts INSERT, UPDATE and DELETE statements the business database commits (rolled back ones do not count).

    A snapshot of every table before and after each case said the same, at ten times the cost."""

    # A write, or a statement whose data-modifying CTEs write (a submission's rows on PostgreSQL).
    WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE)\b|\s*WITH\b.*?\bAS\s*\(\s*(INSERT|UPDATE|DELETE)\b",
                       re.IGNORECASE | re.DOTALL)

    def __init__(self, engines: list[Engine]) -> None:
        self.count = 0
        for engine in engines:
            event.listen(engine, "after_cursor_execute", self._executed)
            event.listen(engine, "commit", self._committed)
            event.listen(engine, "rollback", self._rolled_back)

    def _executed(self, conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not self.WRITE.match(statement):
            return
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            self.count += 1  # committed as it ran (Database.single_statement on PostgreSQL)
        else:
            conn.info["sweep_writes"] = conn.info.get("sweep_writes", 0) + 1

    def _committed(self, conn: Any) -> None:
        self.count += conn.info.pop("sweep_writes", 0)

    def _rolled_back(self, conn: Any) -> None:
        conn.info.pop("sweep_writes", None)


@dataclass
class Sweep:
    api: Api
    objects: dict[str, str]  # what "{job_id}" and the like stand for
    writes: CommittedWrites


def _create_pg_database(server_url: str, prefix: str) -> str:
    import psycopg

    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(server_url)._replace(path="/" + name))


def _drop_pg_database(server_url: str, url: str) -> None:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def _objects(api: Api) -> dict[str, str]:
    """Real objects for the path ids (gateway_testkit.path_objects); ids of kinds not made there stay unknown."""
    return {**path_objects(api), "seq": "1"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def sweep(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    """One gateway per database for the whole module: the cases change nothing, so they can share it."""
    data_dir = tmp_path_factory.mktemp(f"sweep-{request.param}")
    server, made = "", []
    if request.param == "sqlite":
        settings = Settings(data_dir=data_dir)
    else:
        server = request.getfixturevalue("pg_server_url")
        made = [_create_pg_database(server, "jobgate_biz"), _create_pg_database(server, "jobgate_ledger")]
        settings = Settings(data_dir=data_dir, database_url=made[0], ledger_url=made[1])
    try:
        prepare_demo(settings)
        tokens = json.loads((data_dir / "demo-tokens.json").read_text())
        tokens["demo-node-1"] = (data_dir / "agents" / "demo-node-1" / "state" / "token").read_text().strip()
        # A 5xx comes back as a response to assert on, not as the exception behind it.
        with TestClient(create_app(settings, run_scheduler=False), raise_server_exceptions=False) as client:
            api = Api(client, tokens, settings)
            objects = _objects(api)
            db = api.gateway.db
            yield Sweep(api, objects, CommittedWrites(list({db.engine, db._immediate_engine})))
    finally:
        for url in made:
            _drop_pg_database(server, url)


def _fill(value: Any, objects: dict[str, str]) -> Any:
    if isinstance(value, str):
        named = re.fullmatch(r"\{(\w+)\}", value)
        return objects.get(named[1], f"no-such-{named[1]}") if named else value
    if isinstance(value, dict):
        return {k: _fill(v, objects) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, objects) for v in value]
    return value


def send(sw: Sweep, case: Case) -> httpx.Response:
    api = sw.api
    url = case.route.format(**{k: _fill(v, sw.objects) for k, v in case.path_values.items()})
    headers = {"Authorization": f"Bearer {case.token or api.tokens[caller_for(case.route)]}"}
    content: bytes | None = None
    if isinstance(case.content, bytes):
        content = case.content
    elif case.content is not None:
        content = json.dumps(_fill(case.content, sw.objects)).encode()  # NaN and Infinity as Python writes them
    if content is not None:
        headers["Content-Type"] = case.content_type
    return api.client.request(case.verb or case.method, url, params=_fill(case.query, sw.objects) or None,
                              content=content, headers=headers)


# --- the checks ---------------------------------------------------------------------------------------------

# A Python repr or a traceback is not a message for people.
NOT_FOR_PEOPLE = re.compile(r"Traceback|File \"|<[\w.]+ object at 0x|\b[A-Z]\w*(Error|Exception)\(|sqlalchemy|psycopg"
                            r"|\{'[^']*': |\['[^']*'[,\]]")
# Outcome results that record a refusal: an allowed decision whose action did not happen is closed by one.
REFUSED_RESULTS = {"rejected", "failed"}


def assert_refused_cleanly(sw: Sweep, send_it: Callable[[], httpx.Response], names: tuple[str, ...] = ()) -> None:
    """The request gets a 4xx problem+json that says in words what is wrong (naming one of `names`), and
    changes nothing: no business row, and no ledger entry but decisions, the outcomes that close them as
    refused, and the refused attempt itself (gateway/decisions/refusals.py)."""
    writes, size = sw.writes.count, sw.api.gateway.ledger.size()
    r = send_it()
    assert 400 <= r.status_code < 500, f"{r.status_code}: {r.text[:2000]}"
    assert r.headers["content-type"].startswith("application/problem+json"), r.text[:2000]
    problem = r.json()
    assert {"type", "title", "status", "detail"} <= problem.keys(), problem
    assert problem["status"] == r.status_code and problem["type"].startswith("https://"), problem
    assert isinstance(problem["title"], str) and problem["title"].strip(), problem
    detail = problem["detail"]
    assert isinstance(detail, str) and detail.strip(), problem
    assert not NOT_FOR_PEOPLE.search(detail), detail
    assert not names or any(n.lower() in detail.lower() for n in names), f"{detail!r} names none of {names}"
    assert len(detail) < 2000, f"the detail echoes the input: {detail[:200]}..."
    assert sw.writes.count == writes, "a refused request changed the business database"
    for stored in sw.api.gateway.ledger.entries(size, 1000):
        entry = json.loads(stored.raw)
        assert entry["kind"] in ("decision", "refusal") or (
            entry["kind"] == "outcome" and entry["body"].get("result") in REFUSED_RESULTS), stored.raw[:500]


# Cases that fail for a known reason, each with that reason (strict: a fix makes them fail here, as a prompt
# to remove them). None at present: every string the sweep sends 1 MB of is bounded (gateway/schemas.py, Name).
XFAIL: dict[str, str] = {}


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=XFAIL[c.id])] if c.id in XFAIL else [])
    for c in CASES])
def test_bad_input_is_refused_with_a_precise_problem(sweep: Sweep, case: Case) -> None:
    assert_refused_cleanly(sweep, lambda: send(sweep, case), case.names)


# Values the schema let through that their database column could not hold: PostgreSQL enforces VARCHAR
# lengths, and the submission failed with a 500 after its decision was ledgered. SQLite stored them.
@pytest.mark.parametrize(("path", "body"), [
    ("/v1/jobs", job_spec(workload="w" * 65)),
    ("/v1/jobs", job_spec(contact="c" * 129)),
    ("/v1/service-accounts", {"name": "long-words", "project": "vision", "description": "d" * 129}),
], ids=["job workload of 65", "job contact of 129", "service account description of 129"])
def test_a_value_longer_than_its_column_is_refused_before_the_decision(
        sweep: Sweep, path: str, body: dict[str, Any]) -> None:
    assert_refused_cleanly(sweep, lambda: sweep.api.post(path, "alice", json=body))


def test_the_sweep_would_see_a_change(sweep: Sweep) -> None:
    """The checks above can fail: a request that does change something is seen doing it."""
    writes, size = sweep.writes.count, sweep.api.gateway.ledger.size()
    assert sweep.api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
    assert sweep.writes.count > writes and sweep.api.gateway.ledger.size() > size


def test_every_route_is_swept_or_excluded_for_a_reason() -> None:
    app = create_app()
    routes = set(app_routes(app))
    swept = {(c.method, c.route) for c in CASES}
    assert swept == {(m, p) for m, p in routes if not is_excluded(p)}
    stale = sorted(set(EXCLUDED) - {p for _, p in routes})
    assert not stale, f"excluded routes that no longer exist: {stale}"
    assert len(swept) > 60, "fewer routes than the app serves: is the walk broken?"
    unknown = sorted(set(XFAIL) - {c.id for c in CASES})
    assert not unknown, f"XFAIL names cases the sweep no longer makes: {unknown}"
