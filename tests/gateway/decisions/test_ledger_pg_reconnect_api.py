"""A gateway on PostgreSQL whose ledger server dropped its connections (restart, failover) refuses the mutation
that met the loss, with nothing changed, and takes mutations again once the server answers, without a restart."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from gateway_testkit import Api, InBackground, assert_problem, job_spec, ledger_entries, start_api
from sqlalchemy import func, select

from gateway.settings import Settings
from gateway.store.models import Job
from ledger.keys import load_verifier
from ledger.verify import verify_store

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_api(tmp_path: Path, fresh_pg_database: Callable[[str], str]) -> Iterator[Api]:
    yield from start_api(Settings(data_dir=tmp_path, database_url=fresh_pg_database("jobgate_biz"),
                                  ledger_url=fresh_pg_database("jobgate_ledger")))


def test_mutations_resume_after_the_ledger_server_drops_its_connections(pg_api: Api, pg_server_url: str) -> None:
    import psycopg

    api = pg_api
    assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
    ledger_url = api.settings.resolved_ledger_url()
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                     (urlparse(ledger_url).path.lstrip("/"),))
    assert_problem(api.post("/v1/jobs", "alice", json=job_spec(name="met-the-loss")), 503, "ledger-unavailable")
    for name in ("after-1", "after-2"):
        r = api.post("/v1/jobs", "alice", json=job_spec(name=name))
        assert r.status_code == 201, r.text
    with api.gateway.db.transaction(immediate=False) as s:
        names = set(s.scalars(select(Job.name)).all())
        assert s.scalar(select(func.count()).select_from(Job)) == 3
    assert "met-the-loss" not in names
    assert any(e["kind"] == "decision" for e in ledger_entries(api))
    v = verify_store(ledger_url, load_verifier(api.settings.keys_dir / "ledger.vkey"))
    assert v.ok, v.message


def test_a_ledger_table_a_dba_holds_locked_refuses_mutations_in_bounded_time(pg_api: Api) -> None:
    """The ledger write waited for the lock as long as it was held, and every mutation with it."""
    import psycopg

    api = pg_api
    assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
    dba = psycopg.connect(api.settings.resolved_ledger_url())
    try:
        dba.execute("LOCK TABLE ledger_entries IN ACCESS EXCLUSIVE MODE")  # VACUUM FULL takes the same lock
        call = InBackground(lambda: api.post("/v1/jobs", "alice", json=job_spec(name="while-locked")))
        waited = call.wait(30)  # on the old code the call returned only when the lock was let go
    finally:
        dba.rollback()
        dba.close()
    call.wait(30)
    assert waited < 30, "the submission waited for the DBA's lock"
    assert_problem(call.answer, 503, "ledger-unavailable")
    r = api.post("/v1/jobs", "alice", json=job_spec(name="after-the-lock"))
    assert r.status_code == 201, r.text
    with api.gateway.db.transaction(immediate=False) as s:
        assert set(s.scalars(select(Job.name)).all()) == {"train-a", "after-the-lock"}
    v = verify_store(api.settings.resolved_ledger_url(), load_verifier(api.settings.keys_dir / "ledger.vkey"))
    assert v.ok, v.message
