"""The store tests' business database: SQLite and PostgreSQL, with alice and project vision in it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.store.db import Database
from gateway.store.models import Principal, Project
from gateway.store.schema import create_schema

SEEDED_AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/biz.db"
    else:
        make: Callable[[str], str] = request.getfixturevalue("fresh_pg_database")
        url = make("jobgate_store")
    database = Database(url)
    create_schema(database.engine)
    with database.transaction() as session:
        session.add(Principal(id="alice", kind="person", display_name="Alice", created_at=SEEDED_AT))
        session.add(Project(id="vision", organisation="acme"))
    yield database
    database.close()
