"""No route changes or deletes a ledger entry: every route is called as the platform admin (erin), and the
ledger afterwards still holds every earlier entry byte for byte and verifies."""

from __future__ import annotations

import re

from fastapi.routing import APIRoute
from gateway_testkit import Api, job_spec

from ledger.keys import load_verifier
from ledger.service import Ledger
from ledger.verify import verify_store

READ_METHODS = {"GET", "HEAD"}


def app_routes(app: object) -> list[tuple[str, set[str]]]:
    """(path, methods) of every API route, including those of included routers (any FastAPI version)."""
    out: list[tuple[str, set[str]]] = []

    def walk(routes: list[object], prefix: str) -> None:
        for r in routes:
            if isinstance(r, APIRoute):
                out.append((prefix + r.path, set(r.methods)))
            elif hasattr(r, "original_router"):  # FastAPI >= 0.165 keeps included routers as branches
                walk(r.original_router.routes, prefix + getattr(r.include_context, "prefix", ""))

    walk(app.routes, "")  # type: ignore[attr-defined]
    return out


def all_rows(api: Api) -> list[tuple[int, str, bytes]]:
    led: Ledger = api.gateway.ledger
    return [(e.seq, e.hash, e.raw) for e in led.entries(0, led.size())]


def test_ledger_routes_are_read_only(api: Api) -> None:
    ledger_routes = [(p, m) for p, m in app_routes(api.client.app) if p.startswith("/v1/ledger")]
    assert {p for p, _ in ledger_routes} >= {
        "/v1/ledger/entries", "/v1/ledger/checkpoint", "/v1/ledger/proof/inclusion", "/v1/ledger/proof/consistency",
    }  # fmt: skip
    for path, methods in ledger_routes:
        assert methods <= READ_METHODS, (path, methods)
    for method in ("DELETE", "PUT", "PATCH", "POST"):
        for path in ("/v1/ledger/entries", "/v1/ledger/entries/0", "/v1/ledger/checkpoint", "/v1/ledger"):
            resp = api.client.request(method, path, headers=api.headers("erin"), json={})
            assert resp.status_code in (404, 405), (method, path, resp.status_code)


def test_the_ledger_service_has_no_way_to_change_an_entry() -> None:
    public = {m for m in dir(Ledger) if not m.startswith("_")}
    assert public <= {
        "append", "append_many", "enqueue", "enqueue_many", "rotate_key", "close", "open", "from_store", "size",
        "entry", "entries", "blob", "root", "latest_checkpoint", "inclusion_proof", "consistency_proof", "vkey",
        "write_problem",  # a probe for /readyz: asks the store whether it could append, writes nothing
    }, public  # fmt: skip


def _fill(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_route_called_by_the_platform_admin_leaves_history_intact(api: Api) -> None:
    for _ in range(3):
        assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
    before = all_rows(api)
    assert before
    routes = app_routes(api.client.app)
    assert len(routes) > 5
    called = 0
    for rpath, methods in routes:
        for method in sorted(methods):
            path = _fill(rpath)
            params = {"wait": 0, "timeout": 0} if method == "GET" else None
            resp = api.client.request(method, path, headers=api.headers("erin"), json={}, params=params)
            assert resp.status_code < 500, (method, path, resp.status_code, resp.text)
            called += 1
    after = all_rows(api)
    # Appends are fine (erin's attempts are themselves recorded); nothing earlier changed or vanished.
    assert after[: len(before)] == before
    verdict = verify_store(api.settings.resolved_ledger_url(), load_verifier(api.settings.keys_dir / "ledger.vkey"))
    assert verdict.ok and verdict.size == len(after), verdict.message
    # And erin reads, like the auditor.
    assert api.get("/v1/ledger/entries", "erin").status_code == 200
    assert called >= len(routes)
