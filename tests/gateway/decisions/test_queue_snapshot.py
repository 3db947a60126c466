"""The queue snapshot every decision on existing jobs records (H3): content, order, and how it is read."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
import rfc8785
from sqlalchemy import inspect, text

from gateway.decisions.queue_snapshot import queue_snapshot, rendered_snapshot_blob, snapshot_blob, snapshot_sql
from gateway.demo import prepare_demo
from gateway.jobs.priority_history import change
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.models import Job
from gateway.store.scheduler_tables import SchedJob
from gateway.store.schema import create_schema
from gateway.store.snapshot_rows import QUEUE_TOKEN_SQL, RENDERED_ROW_DDL, SNAPSHOT_READS
from gateway.store.submission_rows import insert_submission

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def job(job_id: str, *, queue: str = "default", priority: float = 0.0, state: str = "pending",
        minutes: int = 0, gpus: int = 1, nodes: int = 1) -> Job:
    return Job(id=job_id, name=job_id, project="vision", queue=queue, gpus_per_node=gpus, nodes=nodes,
               command=["true"], grace_seconds=30.0, stop_signal="SIGTERM", creator="alice", creator_kind="person",
               owner="alice", beneficiary_project="vision", rights_holder="vision", contact="alice",
               environment="prod", base_priority=priority, state=state, submitted_at=T0 + timedelta(minutes=minutes))


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    prepare_demo(settings)
    database = Database(settings.resolved_database_url())
    yield database
    database.close()


def test_snapshot_lists_pending_jobs_by_queue_then_priority_then_age(db: Database) -> None:
    with db.transaction() as session:
        session.add_all([
            job("j-b-low", queue="batch", priority=1, minutes=0),
            job("j-d-old", priority=5, minutes=1),
            job("j-d-new", priority=5, minutes=2),
            job("j-d-top", priority=7.5, minutes=3, gpus=2, nodes=2),
            job("j-d-run", priority=9, state="running"),
            job("j-b-high", queue="batch", priority=3, minutes=4),
        ])
    with db.transaction(immediate=False) as session:
        snapshot = queue_snapshot(session)
    assert snapshot["columns"] == ["id", "project", "queue", "priority", "gpus"]
    assert [row[0] for row in snapshot["pending"]] == ["j-b-high", "j-b-low", "j-d-top", "j-d-old", "j-d-new"]
    assert snapshot["pending_by_queue"] == {"batch": 2, "default": 3}
    assert snapshot["pending"][2] == ["j-d-top", "vision", "default", 7.5, 4]
    assert type(snapshot["pending"][0][3]) is int  # whole numbers as ints: the canonical bytes


def test_snapshot_sees_the_transactions_own_unflushed_changes(db: Database) -> None:
    with db.transaction() as session:
        session.add(job("j-1"))
    with db.transaction() as session:
        session.add(job("j-2", minutes=1))
        first = session.get(Job, "j-1")
        assert first is not None
        first.state = "stopped"
        assert [row[0] for row in orjson.loads(snapshot_blob(session))["pending"]] == ["j-2"]


@pytest.mark.parametrize("statement", ["pending", "pending_json", "by_queue"])
def test_sqlite_reads_the_snapshot_from_its_covering_index_without_sorting(tmp_path: Path, statement: str) -> None:
    db = Database(f"sqlite:///{tmp_path / 'b.db'}")
    create_schema(db.engine)
    with db.transaction(immediate=False) as session:
        connection = session.connection()
        plan = " | ".join(str(row[-1]) for row in connection.exec_driver_sql(
            "EXPLAIN QUERY PLAN " + snapshot_sql(statement, connection.dialect)))
    db.close()
    # The rendered rows come from their own index, which SQLite's plan does not call covering, as for any
    # index holding a virtual generated column.
    rendered = statement == "pending_json"
    index = "INDEX ix_jobs_queue_snapshot_rows " if rendered else "COVERING INDEX ix_jobs_queue_snapshot"
    assert index in plan, plan
    assert "TEMP B-TREE" not in plan, plan


# Strings SQLite must escape as RFC 8785 does: quote, backslash, the short forms, other controls (lowercase
# \u00xx), DEL and "/" (left alone), non-ASCII and astral characters (raw UTF-8).
AWKWARD = ['a"b', "back\\slash", "\b\t\n\f\r", "\x01\x1f", "\x7f/", "é", "\U0001f600", "\ufb01"]


def test_the_database_renders_the_snapshot_byte_for_byte_as_rfc8785(db: Database) -> None:
    with db.transaction(immediate=False) as session:
        empty = rendered_snapshot_blob(session)
        assert empty == rfc8785.dumps(queue_snapshot(session)) and orjson.loads(empty or b"")["pending"] == []
    with db.transaction() as session:
        session.add_all([job(f"j-{i}-{text}", queue=text, priority=p, minutes=i, gpus=i + 1)
                         for i, (text, p) in enumerate(zip(AWKWARD, [0, -3, 2**53 - 1, 7, -0.0, 1e15, 4, 5],
                                                           strict=True))])
        # and within one queue: priority first, then age, then id
        session.add_all([job("j-z1", priority=1, minutes=20), job("j-z2", priority=9, minutes=21),
                         job("j-z4", priority=9, minutes=19), job("j-z3", priority=9, minutes=19)])
    with db.transaction(immediate=False) as session:
        blob = rendered_snapshot_blob(session)
        assert blob is not None
        assert blob == rfc8785.dumps(queue_snapshot(session))
        pending = orjson.loads(blob)["pending"]
    assert len(pending) == len(AWKWARD) + 4
    assert [row[0] for row in pending if row[2] == "default"] == ["j-z3", "j-z4", "j-z2", "j-z1"]


@pytest.mark.parametrize("priority", [2.5, 2.0**53, -1e-7])
def test_a_priority_the_database_would_print_otherwise_takes_the_general_path(db: Database, priority: float) -> None:
    with db.transaction() as session:
        session.add_all([job("j-plain", priority=3), job("j-odd", priority=priority, minutes=1)])
    with db.transaction(immediate=False) as session:
        assert rendered_snapshot_blob(session) is None
        assert snapshot_blob(session) == rfc8785.dumps(queue_snapshot(session))


def test_an_existing_sqlite_database_gets_the_rendered_rows_and_renders_them_as_before(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    prepare_demo(settings)
    db = Database(settings.resolved_database_url())
    with db.engine.begin() as conn:  # as a database made before the column existed
        conn.execute(text("DROP INDEX ix_jobs_queue_snapshot_rows"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN snapshot_row"))
    with db.transaction() as session:
        session.add_all([job("j-1", priority=2), job("j-2", queue="batch", priority=-4, gpus=8, minutes=1)])
    create_schema(db.engine)
    with db.transaction(immediate=False) as session:
        blob = rendered_snapshot_blob(session)
        assert blob is not None and blob == rfc8785.dumps(queue_snapshot(session))
    assert orjson.loads(blob)["pending"] == [["j-2", "vision", "batch", -4, 8], ["j-1", "vision", "default", 2, 1]]
    assert "ix_jobs_queue_snapshot_rows" in {i["name"] for i in inspect(db.engine).get_indexes("jobs")}
    db.close()


def test_create_schema_adds_indexes_a_newer_version_declares_to_an_existing_database(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'b.db'}")
    create_schema(db.engine)
    with db.engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_jobs_queue_snapshot"))
    create_schema(db.engine)
    assert "ix_jobs_queue_snapshot" in {i["name"] for i in inspect(db.engine).get_indexes("jobs")}
    db.close()


# The queue's token (SQLite): a snapshot is taken once per state of the queue, and cited by every decision on it.

def sqlite_db(tmp_path: Path) -> Database:
    settings = Settings(data_dir=tmp_path)
    prepare_demo(settings)
    return Database(settings.resolved_database_url())


def token(db: Database) -> bytes:
    with db.engine.connect() as conn:
        return bytes(conn.exec_driver_sql(QUEUE_TOKEN_SQL).scalar_one())


def statements_of_snapshot_blob(db: Database) -> tuple[bytes, list[str]]:
    """snapshot_blob in a read transaction of its own, and the SQL statements it ran there."""
    ran: list[str] = []
    with db.transaction(immediate=False) as session:
        raw = session.connection().connection.dbapi_connection
        assert raw is not None
        raw.set_trace_callback(ran.append)
        try:
            blob = snapshot_blob(session)
        finally:
            raw.set_trace_callback(None)
    return blob, ran


def _set(attribute: str, value: object) -> Callable[[Job], None]:
    return lambda j: setattr(j, attribute, value)


# (job changed, change, whether the queue changed): each column the snapshot reads, of a queued job, changes it;
# what it does not read, or a job that is not queued, does not.
CHANGES = [
    ("j-q", _set("state", "running"), True),
    ("j-q", _set("base_priority", 4.0), True),
    ("j-q", _set("queue", "batch"), True),
    ("j-q", _set("project", "speech"), True),
    ("j-q", _set("gpus_per_node", 4), True),
    ("j-q", _set("nodes", 2), True),
    ("j-q", _set("submitted_at", T0 - timedelta(hours=1)), True),
    ("j-r", _set("state", "pending"), True),
    ("j-q", _set("name", "renamed"), False),
    ("j-q", _set("labels", {"team": "x"}), False),
    ("j-r", _set("base_priority", 4.0), False),
    ("j-r", _set("state", "completed"), False),
]


def test_a_change_of_the_queue_and_only_such_a_change_gives_it_a_new_token(tmp_path: Path) -> None:
    db = sqlite_db(tmp_path)  # one database for every case (a fresh one each costs more than all the cases)
    for i, (job_id, make_change, changes_queue) in enumerate(CHANGES):
        with db.transaction() as session:
            session.add_all([job(f"j-q{i}"), job(f"j-r{i}", state="running", minutes=1)])
        before = token(db)
        with db.transaction() as session:
            target = session.get(Job, f"{job_id}{i}")
            assert target is not None
            make_change(target)
        assert (token(db) != before) is changes_queue, (job_id, i)
    db.close()


def test_a_submission_gives_the_queue_a_new_token_through_the_view_it_is_written_by(tmp_path: Path) -> None:
    """A submission's rows go in through a view's trigger (gateway/store/submission_rows.py): the token's trigger
    fires from it too, so the next decision's snapshot holds the new job."""
    db = sqlite_db(tmp_path)
    taken, _ = statements_of_snapshot_blob(db)
    insert_submission(db, job("j-new"), SchedJob(job_id="j-new", queued_at=T0),
                      change("j-new", T0, "submit", None, {"total": 0.0}))
    fresh, ran = statements_of_snapshot_blob(db)
    assert fresh != taken and [row[0] for row in orjson.loads(fresh)["pending"]] == ["j-new"], ran
    db.close()


def test_a_snapshot_is_taken_once_per_state_of_the_queue_and_is_the_one_a_decision_would_take(tmp_path: Path) -> None:
    db = sqlite_db(tmp_path)
    other = Database(db.engine.url.render_as_string())  # another process's view of the same file
    with db.transaction() as session:
        session.add_all([job("j-1", priority=2), job("j-2", queue="batch", minutes=1)])
    taken, ran = statements_of_snapshot_blob(db)
    assert any("group_concat" in s for s in ran), ran
    again, ran = statements_of_snapshot_blob(db)
    assert again == taken and ran == [QUEUE_TOKEN_SQL], ran  # the same queue: only its token is read
    with other.transaction() as session:  # a change by another writer of the database
        changed = session.get(Job, "j-1")
        assert changed is not None
        changed.state = "stopped"
    fresh, ran = statements_of_snapshot_blob(db)
    with db.transaction(immediate=False) as session:
        assert fresh == rfc8785.dumps(queue_snapshot(session))
    assert [row[0] for row in orjson.loads(fresh)["pending"]] == ["j-2"]
    # A change rolled back leaves the queue, and its token, as they were.
    before = token(db)
    with pytest.raises(RuntimeError), db.transaction() as session:
        session.add(job("j-3"))
        assert [row[0] for row in orjson.loads(snapshot_blob(session))["pending"]] == ["j-2", "j-3"]
        raise RuntimeError("roll back")
    assert token(db) == before
    assert statements_of_snapshot_blob(db) == (fresh, [QUEUE_TOKEN_SQL])
    other.close()
    db.close()


def test_the_token_follows_every_column_of_jobs_the_snapshot_reads() -> None:
    """A column the snapshot reads that the token's triggers do not watch would let a decision cite the queue of
    before its change."""
    from sqlalchemy.dialects import sqlite

    sql = " ".join(snapshot_sql(name, sqlite.dialect()) for name in ("pending", "pending_json", "by_queue"))
    rendered = RENDERED_ROW_DDL.split(" AS ", 1)[1]
    read = {c.name for c in Job.__table__.columns if c.name != "snapshot_row"
            and (f"jobs.{c.name}" in sql or re.search(rf"\b{c.name}\b", rendered))}
    assert read == set(SNAPSHOT_READS)
