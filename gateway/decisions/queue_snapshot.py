"""The queue snapshot every decision on existing jobs records (H3): which jobs were queued, in queue order,
and how their priorities were spread, as the canonical (RFC 8785) JSON blob a ledger entry references.

A queue of thousands is recorded for every such decision, so SQLite and PostgreSQL render and join the
rows themselves; the general path builds them in Python. On SQLite a snapshot is taken once per state of the
queue, not once per decision: the database keeps a token that every change of the queue replaces
(gateway/store/snapshot_rows.py), and decisions that read a token already seen here cite the blob taken under
it. The ledger stores blobs by their SHA-256, so those decisions name one stored snapshot, which is byte for
byte the one each of them would have taken.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from itertools import groupby
from typing import Any

import orjson
from sqlalchemy import BigInteger, Text, and_, case, cast, func, literal, literal_column, select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from gateway.store.models import Job
from gateway.store.snapshot_rows import QUEUE_TOKEN_SQL, SAFE_INT
from gateway.store.states import PENDING_STATES
from ledger.entry import canonical

_JOB = Job.__table__.c
_IS_PENDING = _JOB.state.in_(PENDING_STATES)
# Read in the order of the index ix_jobs_queue_snapshot, which covers it.
_QUEUE_ORDER = (_JOB.queue, _JOB.base_priority.desc(), _JOB.submitted_at, _JOB.id)
_PENDING = (select(_JOB.id, _JOB.project, _JOB.queue, _JOB.base_priority, _JOB.gpus_per_node * _JOB.nodes)
            .where(_IS_PENDING).order_by(*_QUEUE_ORDER))
# The database renders each row as canonical JSON itself and joins them in queue order, so a queue of
# thousands reaches Python as one string. SQLite's json_quote and PostgreSQL's to_json escape strings
# exactly as RFC 8785 does (tests/gateway/decisions/test_queue_snapshot.py checks the bytes on both). A whole-number
# priority is written as an int; any other leaves the row unrendered and the snapshot takes the general
# path, since neither database prints fractions as RFC 8785 does.
# SQLite keeps each row rendered in a generated column of jobs (gateway/store/snapshot_rows.py).
_RENDERED = literal_column("snapshot_row", Text)
# SQLite joins the rows in its FROM subquery's order: it drops such an ORDER BY only when the outer query
# could not tell, which an aggregate other than count, min or max can.
_SQLITE_ROWS = (select(_RENDERED.label("row")).select_from(Job.__table__)
                .where(_IS_PENDING).order_by(*_QUEUE_ORDER).subquery())
# PostgreSQL: trunc, not a cast, tests for a whole number (a cast rounds, and fails beyond bigint).
_PG_WHOLE = case((and_(_JOB.base_priority == func.trunc(_JOB.base_priority),
                       func.abs(_JOB.base_priority) <= SAFE_INT), cast(_JOB.base_priority, BigInteger)))


def _pg_json(column: Any) -> Any:
    return cast(func.to_json(column), Text)


_PG_ROW = (literal("[") + _pg_json(_JOB.id) + "," + _pg_json(_JOB.project) + "," + _pg_json(_JOB.queue) + ","
           + cast(_PG_WHOLE, Text) + "," + cast(_JOB.gpus_per_node * _JOB.nodes, Text) + "]")
_PENDING_JSON = {
    "sqlite": select(func.group_concat(_SQLITE_ROWS.c.row, ","), func.count() - func.count(_SQLITE_ROWS.c.row)),
    "postgresql": select(func.string_agg(_PG_ROW, aggregate_order_by(literal(","), *_QUEUE_ORDER)),
                         func.bool_or(_PG_WHOLE.is_(None))).where(_IS_PENDING),
}
_BY_QUEUE = select(_JOB.queue, func.count()).where(_IS_PENDING).group_by(_JOB.queue)
_SQL: dict[tuple[str, str], str] = {}  # (statement, dialect name) -> SQL; the statements have no parameters
_STATEMENTS: dict[str, Any] = {"pending": _PENDING, "pending_json": _PENDING_JSON, "by_queue": _BY_QUEUE}
SNAPSHOT_COLUMNS = ("id", "project", "queue", "priority", "gpus")
_SNAPSHOT_HEAD = b'{"columns":' + orjson.dumps(SNAPSHOT_COLUMNS) + b',"pending":['


def snapshot_sql(statement: str, dialect: Dialect) -> str:
    """The SQL of one of the snapshot's statements for a dialect, compiled once."""
    if (sql := _SQL.get((statement, dialect.name))) is None:
        stmt = _STATEMENTS[statement]
        stmt = stmt[dialect.name] if isinstance(stmt, dict) else stmt
        sql = _SQL[statement, dialect.name] = str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    return sql


def _fetch(session: Session, statement: str) -> Sequence[Any]:
    """Rows of a snapshot statement, read with a plain DB-API cursor on the transaction's connection:
    SQLAlchemy's result rows would double the cost. Sees this transaction's own changes, as an ORM query
    would (the session is flushed first)."""
    connection = session.connection()
    return _run(session, snapshot_sql(statement, connection.dialect))


def _run(session: Session, sql: str) -> Sequence[Any]:
    session.flush()
    cursor = session.connection().connection.cursor()
    try:
        cursor.execute(sql)
        return cursor.fetchall()
    finally:
        cursor.close()


# Blobs taken under the last few tokens of the queue (SQLite). A few, not one: a decision that read its token
# in a transaction since rolled back, or on another database, does not evict the current one. The tokens are
# 16 random bytes, so one seen on another database names another queue only by a copy of the database, which
# holds the same queue.
_BY_TOKEN: dict[bytes, bytes] = {}
_KEPT = 4
_BY_TOKEN_LOCK = threading.Lock()


def _queue_token(session: Session) -> bytes:
    """The queue's token as this transaction sees it, its own changes included (flushed first)."""
    ((token,),) = _run(session, QUEUE_TOKEN_SQL)
    return bytes(token)


def queue_snapshot(session: Session) -> dict[str, Any]:
    """Which jobs were queued at the moment of a decision and how their priorities were spread (H3).

    One row per queued job, in queue order (queue, then priority, then age), its fields named once in
    `columns`: a queue of thousands is recorded for every decision on existing jobs, and rows of
    objects would repeat every field name in every row of every snapshot."""
    rows = _fetch(session, "pending")
    # A whole-number priority is written as an int: RFC 8785 prints 3.0 as 3 anyway, so the bytes are the
    # same, and a snapshot without floats can skip the general encoder (see snapshot_bytes).
    pending = [[i, project, queue, int(p) if p.is_integer() and abs(p) <= SAFE_INT else p, gpus]
               for i, project, queue, p, gpus in rows]
    by_queue = {queue: sum(1 for _ in group) for queue, group in groupby(row[2] for row in rows)}
    return {"columns": list(SNAPSHOT_COLUMNS), "pending": pending, "pending_by_queue": dict(sorted(by_queue.items()))}


def snapshot_blob(session: Session) -> bytes:
    """The queue snapshot as the canonical (RFC 8785) JSON blob a ledger entry references (H3). On SQLite,
    taken once per state of the queue (see the module's docstring)."""
    if session.get_bind().dialect.name != "sqlite":
        return _take_blob(session)
    token = _queue_token(session)
    with _BY_TOKEN_LOCK:
        blob = _BY_TOKEN.get(token)
    if blob is None:
        blob = _take_blob(session)  # in this transaction, which saw `token`: the queue that token stands for
        with _BY_TOKEN_LOCK:
            _BY_TOKEN[token] = blob
            while len(_BY_TOKEN) > _KEPT:
                del _BY_TOKEN[next(iter(_BY_TOKEN))]
    return blob


def _take_blob(session: Session) -> bytes:
    if session.get_bind().dialect.name in _PENDING_JSON and (blob := rendered_snapshot_blob(session)) is not None:
        return blob
    return snapshot_bytes(queue_snapshot(session))


def rendered_snapshot_blob(session: Session) -> bytes | None:
    """snapshot_blob with every row rendered by the database; None when a priority is fractional."""
    ((pending, fractional),) = _fetch(session, "pending_json")
    if fractional:
        return None
    by_queue = dict(_fetch(session, "by_queue"))
    return b"".join((_SNAPSHOT_HEAD, (pending or "").encode(), b'],"pending_by_queue":', canonical(by_queue), b"}"))


def snapshot_bytes(snapshot: dict[str, Any]) -> bytes:
    """RFC 8785 bytes of a queue snapshot, which grows with the queue and is taken for every decision on
    existing jobs. Made of ASCII keys, strings and I-JSON-safe ints only, orjson's sorted output is already
    canonical (ledger/entry.py shows why; tests/gateway/decisions/test_snapshot_blob.py checks it), so the per-value
    check of `canonical` is skipped; a fractional priority, or a string orjson refuses, takes that path."""
    # Queue names are keys too: past ASCII, RFC 8785's UTF-16 order and orjson's code-point order can differ.
    if all(q.isascii() for q in snapshot["pending_by_queue"]) and all(
            type(row[3]) is int for row in snapshot["pending"]):
        try:
            return orjson.dumps(snapshot, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass
    return canonical(snapshot)
