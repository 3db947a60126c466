"""Business database: engine set-up for SQLite (embedded default) and PostgreSQL.

On SQLite every transaction starts with BEGIN IMMEDIATE so that a read-decide-write sequence (approvals,
placement) cannot interleave with another writer; PostgreSQL uses row locks (SELECT ... FOR UPDATE).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # let SQLAlchemy's BEGIN below own the transaction
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin_immediate(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url, pool_size=20, max_overflow=20, pool_pre_ping=True)


def create_schema(engine: Engine) -> None:
    # Imported here: the table modules import services that import this module.
    from gateway.tables import Base

    Base.metadata.create_all(engine)


class Database:
    """Owns the engine and hands out sessions, one transaction each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.is_sqlite = url.startswith("sqlite")
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def create_schema(self) -> None:
        create_schema(self.engine)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self._sessions() as session, session.begin():
            yield session

    def close(self) -> None:
        self.engine.dispose()
