"""Database.reading: the session a submission reads and decides in. On PostgreSQL its statements run outside a
transaction (no BEGIN and COMMIT round trips); on SQLite it is a read transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select, text

from gateway.store.db import Database
from gateway.store.models import Principal
from gateway.store.schema import create_schema

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/biz.db"
    else:
        make: Callable[[str], str] = request.getfixturevalue("fresh_pg_database")
        url = make("jobgate_reading")
    database = Database(url)
    create_schema(database.engine)
    with database.transaction() as session:
        session.add(Principal(id="alice", kind="person", display_name="Alice", created_at=NOW))
    yield database
    database.close()


def test_a_reading_session_reads_what_is_committed(db: Database) -> None:
    with db.reading() as session:
        assert session.scalars(select(Principal.id)).all() == ["alice"]


def test_on_postgresql_a_reading_session_holds_no_transaction_open(db: Database) -> None:
    if db.is_sqlite:
        pytest.skip("SQLite: a read transaction, one snapshot for the whole session")
    with db.reading() as session:
        connection = session.connection()
        connection.execute(select(Principal.id)).all()
        pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with db.engine.connect() as other:
            state = other.execute(text("SELECT state FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).scalar()
    # Inside a transaction the backend would be "idle in transaction" between statements.
    assert state == "idle"


def test_on_sqlite_a_reading_session_is_one_snapshot(db: Database) -> None:
    if not db.is_sqlite:
        pytest.skip("PostgreSQL: each statement reads under a snapshot of its own")
    with db.reading() as session:
        assert session.scalars(select(Principal.id)).all() == ["alice"]
        with db.transaction() as writer:
            writer.add(Principal(id="bob", kind="person", display_name="Bob", created_at=NOW))
        assert session.scalars(select(Principal.id)).all() == ["alice"]
