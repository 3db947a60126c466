"""Business database: engine set-up for SQLite (embedded default) and PostgreSQL.

On SQLite a transaction that reads, decides and then writes the same rows (stops, approvals, placement)
starts with BEGIN IMMEDIATE, so no other writer can interleave; other transactions start deferred, so they
read concurrently and take the write lock only for their short write (and, crucially, not while they
wait for the ledger). PostgreSQL uses row locks (SELECT ... FOR UPDATE) instead.
"""

from __future__ import annotations

import functools
import select
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from psycopg.pq import ConnStatus
from sqlalchemy import ColumnDefault, Connection, Engine, Table, create_engine, event, text
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from gateway.errors import DatabaseInUse, SqliteTooOld
from gateway.store import idempotency
from ledger.walcheckpoint import AUTOCHECKPOINT_OFF, WalCheckpointer

# How often the business database's WAL is copied back (SQLite). Each round fsyncs the pages it copied, and
# while it does the ledger's fsyncs on the same disk wait for it: at 500 submissions/s a round a second copied
# about 2,000 pages and every request stalled 20-30 ms once a second; rounds four times as often stall
# requests for a few ms. An idle database costs nothing (a round with no new frames copies and syncs nothing).
CHECKPOINT_INTERVAL_S = 0.25
# A connection execution option (SQLite): issue no BEGIN, so that each statement is a transaction of its own.
SINGLE_STATEMENT = "jobgate_single_statement"


# How long a PostgreSQL statement waits for a lock (a job's row, a table) before its request is refused (503):
# a session left open in a transaction after a manual UPDATE of a job, or a migration's ALTER TABLE, otherwise
# held every request on those rows, each an API thread, until the gateway answered nothing at all.
LOCK_TIMEOUT_S = 30.0
# The scheduler writes its explanations with UPDATE ... FROM json_each() and ->> (3.33 and 3.38).
MIN_SQLITE = (3, 38)


def make_engine(url: str, *, immediate: bool = False, lock_timeout_s: float = LOCK_TIMEOUT_S) -> Engine:
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
            cur.execute(AUTOCHECKPOINT_OFF)  # Database's WalCheckpointer does it, outside the requests' commits
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            if not conn.get_execution_options().get(SINGLE_STATEMENT):
                conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    engine = create_engine(sqlalchemy_url(url), pool_size=20, max_overflow=20)

    @event.listens_for(engine, "checkout")
    def _alive(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if not looks_alive(dbapi_conn):
            raise DisconnectionError("the server closed this pooled connection")  # the pool takes another

    if "lock_timeout" not in str(engine.url.query.get("options", "")):  # a URL that sets its own keeps it

        @event.listens_for(engine, "connect")
        def _bounds(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute(f"SET lock_timeout = {int(lock_timeout_s * 1000)}")
            dbapi_conn.commit()  # a SET inside the driver's implicit transaction would be rolled back with it

    return engine


def looks_alive(connection: Any) -> bool:
    """Whether a pooled PostgreSQL connection (psycopg's) may be handed out, told without a round trip. An idle
    connection the server has closed (a restart, pg_terminate_backend) has its goodbye waiting to be read, which
    an idle connection never has otherwise. SQLAlchemy's pool_pre_ping asked the server instead, a round trip on
    every checkout: two of a submission's five on a replica. What this cannot see (a connection lost without
    the server's word, on a network cut) fails its first statement, and then the pool drops every connection
    it holds; such a request is refused (503) with nothing changed, as it would be had the cut come a moment
    after a ping."""
    if connection.closed or connection.pgconn.status != ConnStatus.OK:
        return False
    readable, _, _ = select.select([connection.fileno()], [], [], 0)
    return not readable


def sqlalchemy_url(url: str) -> str:
    """A PostgreSQL URL as given (postgresql:// or postgres://, as the ledger and libpq take them) with the driver
    SQLAlchemy is to use; `postgres://` was refused as "Can't load plugin: sqlalchemy.dialects:postgres"."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url.removeprefix(scheme)
    return url


T = TypeVar("T")

_GATEWAY_LOCK = 7305617  # advisory lock key of the gateway processes on a business database (see Database.claim)


def transient(model: Callable[..., T], **values: Any) -> T:
    """A new, unsaved `model` object holding these column values and every unset column default: what
    `model(**values)` makes once row_values has filled its defaults in, built without the ORM's event per
    attribute set (a job: 8 µs against 47 µs; a submission builds three such objects). Nothing is validated
    or converted on the way, as the ORM's constructor does not either (the mapped classes declare no
    validators). The object may be inserted with row_values or added to a session like any other."""
    obj = cast(Any, model).__mapper__.class_manager.new_instance()
    fields = obj.__dict__  # what a set attribute writes to; the ORM's instance state lives beside it
    fields.update(values)
    for key, default, _ in _column_plan(obj.__table__):
        if default is not None and fields.get(key) is None:
            fields[key] = _default_value(default)
    return cast(T, obj)


def row_values(obj: Any) -> dict[str, Any]:
    """A new object's column values by key, its unset column defaults filled in (into the object too); an
    unset autoincrement key is left out.

    Read from the object's __dict__, which for a new object (transient, never loaded) holds every value set
    and nothing else: the instrumented attributes cost a call each."""
    fields = obj.__dict__
    values: dict[str, Any] = {}
    for key, default, database_assigns in _column_plan(obj.__table__):
        value = fields.get(key)
        if value is None:
            if default is not None:
                value = _default_value(default)
                setattr(obj, key, value)
            elif database_assigns:
                continue
        values[key] = value
    return values


def _default_value(default: ColumnDefault) -> Any:
    # SQLAlchemy wraps a callable default (list, dict) to take an execution context.
    return default.arg(None) if default.is_callable else default.arg


@functools.cache
def _column_plan(table: Table) -> tuple[tuple[str, ColumnDefault | None, bool], ...]:
    """Per column: its key, its Python-side default, whether the database assigns it when left unset. Read
    once per table: on the submission path, asking the column each time cost more than the insert."""
    return tuple((col.key, col.default if isinstance(col.default, ColumnDefault) else None,
                  bool(col.primary_key and col.autoincrement)) for col in table.columns)


class Database:
    """Owns the engine and hands out sessions, one transaction each."""

    def __init__(self, url: str, *, lock_timeout_s: float = LOCK_TIMEOUT_S) -> None:
        """Raises SqliteTooOld for a SQLite URL when Python's SQLite library is older than MIN_SQLITE."""
        if url.startswith("sqlite") and sqlite3.sqlite_version_info < MIN_SQLITE:
            raise SqliteTooOld(
                f"SQLite {sqlite3.sqlite_version} is too old: the gateway needs {'.'.join(map(str, MIN_SQLITE))} or"
                " later (Python's sqlite3 module uses the SQLite it was built with), or a PostgreSQL database"
                " (JOBGATE_DATABASE_URL)")
        self.url = url
        self.engine = make_engine(url, lock_timeout_s=lock_timeout_s)
        self.is_sqlite = url.startswith("sqlite")
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite only: a second pool whose transactions take the write lock up front.
        self._immediate_engine = make_engine(url, immediate=True) if self.is_sqlite else self.engine
        self._immediate_sessions = sessionmaker(self._immediate_engine, expire_on_commit=False)
        self._write_lock = threading.Lock()
        self._claimed = False  # claim() took the gateway lock
        self._held: list[Connection] = []  # sessions holding advisory locks of hold(), claim()'s among them
        file = self.engine.url.database if self.is_sqlite else None
        self._checkpointer = (WalCheckpointer(Path(file), interval_s=CHECKPOINT_INTERVAL_S)
                              if file and file != ":memory:" else None)

    def claim(self, *, shared: bool) -> None:
        """Hold this business database (PostgreSQL) for this gateway process until close(): alone, or `shared`
        with other replicas of one gateway.

        Its rows cite ledger entries by seq (approvals, the reconciliation watermark, outcomes of decisions another
        process took), so every process on it must append to one ledger. A PostgreSQL ledger takes any number of
        appenders (ledger/service.py, sequenced in its database): replicas on it claim the database shared. A
        SQLite ledger is one process's: its gateway claims the database alone, or a second gateway with a ledger
        of its own forked the audit trail, its outcomes citing seqs that name other entries in its ledger,
        unnoticed. (That replicas share one ledger, and not two PostgreSQL ledgers, bootstrap.py checks by the
        ledger's identity recorded here.) The claim is a session advisory lock, so it ends with the process, even
        one killed with kill -9. SQLite: the ledger's own claim already keeps a second `jobgate up` on one data
        dir out. Raises DatabaseInUse."""
        if self.is_sqlite or self._claimed:
            return
        if not self.hold(_GATEWAY_LOCK, shared=shared):
            raise DatabaseInUse(
                "another gateway process runs on this business database with a ledger only it may write (SQLite);"
                " stop it first, or run every replica on one PostgreSQL ledger (JOBGATE_LEDGER_URL)" if shared else
                "another gateway process runs on this business database (its records cite one ledger, and this"
                " process's ledger is one only it may write: SQLite); stop it first, or run every replica on one"
                " PostgreSQL ledger (JOBGATE_LEDGER_URL)")
        self._claimed = True

    def hold(self, key: int, *, shared: bool = False) -> bool:
        """PostgreSQL: take the session advisory lock `key` (alone, or `shared` with other holders) for as long as
        this process lives (or until close()), unless another process holds it so; whether this one holds it now.
        A process killed with kill -9 lets it go with its session. SQLite: True (one process per data dir)."""
        if self.is_sqlite:
            return True
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        take = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
        if not conn.execute(text(f"SELECT {take}(:k)"), {"k": key}).scalar():
            conn.close()
            return False
        self._held.append(conn)
        return True

    @contextmanager
    def transaction(self, *, immediate: bool = True) -> Iterator[Session]:
        """One transaction; `immediate=False` only for reads (or writes nobody else can race with)."""
        if not (immediate and self.is_sqlite):
            with self._sessions() as session, session.begin():
                if immediate:
                    idempotency.claim_row(session)  # a request holding an Idempotency-Key acts in this transaction
                yield session
            return
        # SQLite has one writer. Queue this process's writers on a lock rather than in SQLite's busy
        # handler, which sleeps in growing steps and turns contention into seconds of latency.
        with self._write_lock, self._immediate_sessions() as session, session.begin():
            idempotency.claim_row(session)
            yield session

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A session that only reads. On PostgreSQL its statements run outside a transaction (autocommit), each
        under a snapshot of its own as in a READ COMMITTED transaction, without the BEGIN and COMMIT round trips
        (two of a submission's reads, gateway/jobs/submission.py); never write through it, since each write
        would commit on its own. On SQLite a read transaction (one snapshot)."""
        if self.is_sqlite:
            with self._sessions() as session, session.begin():
                yield session
            return
        with (self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection,
              Session(connection, expire_on_commit=False) as session):
            yield session

    @property
    def writer_busy(self) -> bool:
        """Another thread of this process holds the write lock now (a hint: it may be let go the next moment)."""
        return self._write_lock.locked()

    @contextmanager
    def single_statement(self) -> Iterator[Connection]:
        """A connection on which each statement commits on its own, for a write done by one statement
        (gateway/store/submission_rows.py, gateway/store/idempotency.py): one round trip on PostgreSQL instead of
        BEGIN, statement, COMMIT; on SQLite no BEGIN, and the write lock held for that one statement only."""
        if not self.is_sqlite:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                yield connection
            return
        with self._write_lock, self._immediate_engine.connect() as connection:
            yield connection.execution_options(**{SINGLE_STATEMENT: True})
            connection.commit()  # nothing left to commit; ends SQLAlchemy's view of a transaction

    def close(self) -> None:
        for held in self._held:
            held.close()  # ends the session, and its lock with it
        self._held.clear()
        self._claimed = False
        if self._checkpointer is not None:
            self._checkpointer.close()
        self.engine.dispose()
        self._immediate_engine.dispose()
