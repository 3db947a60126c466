"""A submission's three rows (job, scheduling row, first priority entry) written by one statement.

SQLite has one writer, and a writer waits for the interpreter lock after every statement it runs while the
other request threads hold it. Under load a submission's BEGIN, three INSERTs and COMMIT held the write lock
for about 4 ms, mostly waiting, and that capped submissions near 200/s. So on SQLite the three rows go into
`submission_rows`, an always-empty view whose INSTEAD OF trigger inserts them into their tables: one
statement in autocommit mode is one transaction (all three rows or none), with one wait for the interpreter
lock instead of five. The ledger's batches are written the same way (ledger/store.py). A request holding an
Idempotency-Key has its key's row marked acted by that statement too, as a write transaction would mark it
(gateway/store/idempotency.py).

On PostgreSQL the statement is the three INSERTs, two of them as data-modifying CTEs (`_PG_INSERT`): one round
trip in autocommit mode rather than six (the pool's ping, BEGIN, three INSERTs, COMMIT), each of which a replica's
worker thread waited for and then waited again for the interpreter lock. With an Idempotency-Key it runs in a
transaction that marks the key's row first.

The view and its trigger are generated from the three tables' columns when the schema is created, so a
column added to a model is written without touching this file.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Column, Insert, MetaData, String, Table, bindparam, insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gateway.store import idempotency
from gateway.store.db import Database, row_values
from gateway.store.models import Job
from gateway.store.scheduler_tables import PriorityChange, SchedJob

VIEW = "submission_rows"
_TABLES = tuple(cast(Table, model.__table__) for model in (Job, SchedJob, PriorityChange))  # parents first


def _written(table: Table) -> list[Column[Any]]:
    """The columns a submission gives: all but an integer key the database assigns."""
    return [c for c in table.columns if c is not table.autoincrement_column]


def _name(table: Table, column: Column[Any]) -> str:
    return f"{table.name}__{column.name}"


# The Idempotency-Key a request holds (gateway/store/idempotency.py): its row is marked acted by the same statement,
# or, when a retry has taken the key over, the statement is refused and writes nothing.
_CLAIM = tuple(f"claim__{field}" for field in ("scope", "key", "holder"))
SUPERSEDED = "jobgate: idempotency key superseded"
# The view as SQLAlchemy sees it: the tables' column types, so values are converted as for the tables.
_VIEW = Table(VIEW, MetaData(), *(Column(_name(t, c), c.type) for t in _TABLES for c in _written(t)),
              *(Column(name, String) for name in _CLAIM))
_INSERT: Insert = _VIEW.insert()
# Per table, its written columns' keys and their names in the view: worked out once, not per submission.
_KEYS = tuple(tuple((c.key, _name(t, c)) for c in _written(t)) for t in _TABLES)


def _row(table: Table) -> Insert:
    return insert(table).values({c: bindparam(_name(table, c), type_=c.type) for c in _written(table)})


# PostgreSQL: the three INSERTs as one statement, the first two as data-modifying CTEs, with the view's parameter
# names. All three rows or none; the foreign keys are checked at the end of the statement, when all are there.
_PG_INSERT: Insert = _row(_TABLES[-1]).add_cte(*(_row(t).cte(f"new_{t.name}") for t in _TABLES[:-1]))


def add_submission_view(connection: Connection) -> None:
    """SQLite: (re)create the view and its trigger for the tables' current columns."""
    names = [_name(t, c) for t in _TABLES for c in _written(t)] + list(_CLAIM)
    keys = idempotency.IdempotencyKey.__tablename__
    mine = (f"scope = NEW.{_CLAIM[0]} AND key = NEW.{_CLAIM[1]} AND holder = NEW.{_CLAIM[2]}"
            f" AND state IN ('{idempotency.PROCESSING}', '{idempotency.ACTED}')")
    claim = (f"SELECT RAISE(ABORT, '{SUPERSEDED}') WHERE NEW.{_CLAIM[2]} IS NOT NULL"
             f" AND NOT EXISTS (SELECT 1 FROM {keys} WHERE {mine});"
             f" UPDATE {keys} SET state = '{idempotency.ACTED}' WHERE NEW.{_CLAIM[2]} IS NOT NULL AND {mine};")
    inserts = claim + " " + " ".join(
        f"INSERT INTO {t.name} ({', '.join(c.name for c in _written(t))})"
        f" VALUES ({', '.join('NEW.' + _name(t, c) for c in _written(t))});"
        for t in _TABLES
    )
    connection.exec_driver_sql(f"DROP VIEW IF EXISTS {VIEW}")  # drops its trigger too
    connection.exec_driver_sql(f"CREATE VIEW {VIEW} ({', '.join(names)}) AS SELECT "
                               + ", ".join("NULL" for _ in names) + " WHERE 0")
    connection.exec_driver_sql(f"CREATE TRIGGER {VIEW}_insert INSTEAD OF INSERT ON {VIEW} BEGIN {inserts} END")


def insert_submission(db: Database, job: Job, sched: SchedJob, change: PriorityChange) -> None:
    """Insert a new job's rows in a transaction of their own (row_values' conventions: defaults filled into the
    objects, which stay outside any session). Raises SQLAlchemy's errors."""
    claim = idempotency.CURRENT.get()
    values: dict[str, Any] = {}
    for keys, obj in zip(_KEYS, (job, sched, change), strict=True):
        given = row_values(obj)
        values.update((name, given[key]) for key, name in keys)
    if not db.is_sqlite:
        # PostgreSQL: one statement too. A held Idempotency-Key's row is marked first, in the same transaction.
        if claim is None:
            with db.single_statement() as connection:
                connection.execute(_PG_INSERT, values)
            return
        with db.transaction() as session:
            session.connection().execute(_PG_INSERT, values)
        return
    values.update(zip(_CLAIM, (claim.scope, claim.key, claim.holder) if claim else (None,) * 3, strict=True))
    try:
        with db.single_statement() as connection:
            connection.execute(_INSERT, values)
    except IntegrityError as e:
        if SUPERSEDED in str(e.orig):
            raise idempotency.Superseded(idempotency.SUPERSEDED_DETAIL) from None
        raise
