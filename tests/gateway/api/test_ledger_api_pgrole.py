"""The gateway runs on PostgreSQL with the append-only ledger role from `jobgate ledger init-db`."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import Settings
from ledger.admin import init_db
from ledger.keys import load_verifier
from ledger.verify import verify_store

pytestmark = pytest.mark.integration


@pytest.fixture
def role_api(
    tmp_path: Path, fresh_pg_database: Callable[[str], str], pg_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Api, str, str]]:
    import psycopg

    owner_url = fresh_pg_database("jobgate_ledger")
    role = f"jobgate_gw_{secrets.token_hex(4)}"
    res = init_db(owner_url, role=role, password=secrets.token_hex(8))
    assert res.gateway_url is not None
    # The gateway reads its ledger URL from the environment, as in production.
    monkeypatch.setenv("JOBGATE_LEDGER_URL", res.gateway_url)
    settings = Settings(data_dir=tmp_path, database_url=fresh_pg_database("jobgate_biz"))
    assert settings.resolved_ledger_url() == res.gateway_url
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    try:
        with TestClient(create_app(settings, run_scheduler=False)) as client:
            yield Api(client, tokens, settings), res.gateway_url, owner_url
    finally:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            conn.execute(f'DROP OWNED BY "{role}"')
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_gateway_appends_through_the_role_and_the_role_cannot_rewrite(role_api: tuple[Api, str, str]) -> None:
    import psycopg

    api, gateway_url, _ = role_api
    for _ in range(3):
        assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
    entries = api.get("/v1/ledger/entries", "audrey").json()["entries"]
    assert any(e["entry"]["kind"] == "decision" for e in entries)
    with psycopg.connect(gateway_url, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (gateway_url.split("//")[1].split(":")[0],)
        for stmt in ("UPDATE ledger_entries SET data = data", "DELETE FROM ledger_entries", "TRUNCATE ledger_entries"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)
    v = verify_store(gateway_url, load_verifier(api.settings.keys_dir / "ledger.vkey"))
    assert v.ok and v.size == len(entries), v.message
