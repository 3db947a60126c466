"""Fixtures for ledger tests: signer, a fresh PostgreSQL database per test, a store URL per engine."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

import pytest

from ledger.keys import NoteSigner, load_or_create_signer

ORIGIN = "jobgate.local/ledger"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped afterwards.

    Needs JOBGATE_TEST_PG_URL (a server URL with CREATE DATABASE rights); skips without it unless
    JOBGATE_REQUIRE_PG=1.
    """
    base = os.environ.get("JOBGATE_TEST_PG_URL")
    if not base:
        if os.environ.get("JOBGATE_REQUIRE_PG") == "1":
            pytest.fail("JOBGATE_REQUIRE_PG=1 but JOBGATE_TEST_PG_URL is not set")
        pytest.skip("JOBGATE_TEST_PG_URL not set")
    import psycopg
    from psycopg import sql

    name = f"jobgate_ledger_test_{secrets.token_hex(6)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlparse(base)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same tests run on both LedgerStore implementations."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def signer(tmp_path: Path) -> NoteSigner:
    return load_or_create_signer(tmp_path / "keys", ORIGIN)


@pytest.fixture
def clock() -> Callable[[], datetime]:
    """A deterministic clock: one microsecond per call from a fixed instant."""
    t = [datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)]

    def now() -> datetime:
        t[0] += timedelta(microseconds=1)
        return t[0]

    return now
