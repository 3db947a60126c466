"""The queue snapshot every decision on existing jobs records (H3): content, order, and how it is read."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
import rfc8785
from sqlalchemy import inspect, text

from gateway.decisions.queue_snapshot import queue_snapshot, rendered_snapshot_blob, snapshot_blob, snapshot_sql
from gateway.demo import prepare_demo
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.models import Job
from gateway.store.schema import create_schema

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
