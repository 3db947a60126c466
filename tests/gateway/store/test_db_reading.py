"""Database.reading: the session a submission reads and decides in. On PostgreSQL its statements run outside a
transaction (no BEGIN and COMMIT round trips); on SQLite it is a read transaction."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, text

from gateway.store.db import Database
from gateway.store.models import Principal

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)




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


def test_a_pooled_connection_the_server_closed_is_replaced_before_it_is_used(db: Database) -> None:
    """No ping on checkout (a round trip each time): the closed connection is told by the server's goodbye waiting
    on its socket, and the statement runs on a new one instead of failing."""
    if db.is_sqlite:
        pytest.skip("PostgreSQL: a server that closes its connections")
    import psycopg

    with db.engine.connect() as connection:
        pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    with psycopg.connect(db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(100):  # until the backend has gone (its goodbye is then on the socket)
            if admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None:
                break
            time.sleep(0.01)
    with db.reading() as session:
        assert session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar() != pid
        assert session.scalars(select(Principal.id)).all() == ["alice"]
