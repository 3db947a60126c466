"""db.row_values and submission_rows.insert_submission: a submission's rows go in through Core (as one
statement), and the objects read as the stored rows do."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.store import idempotency
from gateway.store.db import Database, row_values, transient
from gateway.store.models import Job
from gateway.store.scheduler_tables import PriorityChange, SchedJob
from gateway.store.schema import create_schema
from gateway.store.submission_rows import insert_submission

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)






SUBMITTED = dict(id="j-1", name="train", project="vision", queue="normal", gpus_per_node=2, nodes=1,
                 command=["python", "train.py"], grace_seconds=30.0, stop_signal="SIGTERM", creator="alice",
                 creator_kind="person", owner="alice", beneficiary_project="vision", rights_holder="vision",
                 contact="alice", environment="prod", state="pending", submitted_at=NOW)


def new_job() -> Job:
    """A job with only the columns a submission sets; the rest have column defaults."""
    return Job(id="j-1", name="train", project="vision", queue="normal", gpus_per_node=2, nodes=1,
               command=["python", "train.py"], grace_seconds=30.0, stop_signal="SIGTERM", creator="alice",
               creator_kind="person", owner="alice", beneficiary_project="vision", rights_holder="vision",
               contact="alice", environment="prod", state="pending", submitted_at=NOW)


def _insert(session: Session, *objects: Any) -> None:
    """Each object's row through Core, as insert_submission writes them: its values as row_values gives them."""
    for obj in objects:
        session.connection().execute(obj.__table__.insert(), row_values(obj))


def test_defaults_are_filled_into_the_object_and_stored(db: Database) -> None:
    job = new_job()
    with db.transaction() as session:
        _insert(session, job)
        assert job not in session  # not tracked: no flush of it at commit
    # The object now carries what a read of the row gives, not None for the defaulted columns.
    assert (job.env, job.labels, job.placement, job.history, job.base_priority, job.external_rights) == (
        {}, {}, [], [], 0.0, False)
    with db.transaction(immediate=False) as session:
        stored = session.scalars(select(Job)).one()
        for column in Job.__table__.columns:
            got, want = getattr(stored, column.key), getattr(job, column.key)
            if isinstance(want, datetime):  # SQLite hands datetimes back without their zone
                got, want = got.replace(tzinfo=None), want.replace(tzinfo=None)
            assert got == want, column.key


def test_a_transient_object_reads_as_the_constructed_one_with_its_defaults(db: Database) -> None:
    """transient() skips the ORM's per-attribute events: it must still read, insert and flush as Job(...) does."""
    built, constructed = transient(Job, **SUBMITTED), Job(**SUBMITTED)
    row_values(constructed)  # fills its defaults in; transient() did so already
    assert {c.key: getattr(built, c.key) for c in Job.__table__.columns} == {
        c.key: getattr(constructed, c.key) for c in Job.__table__.columns}
    with db.transaction() as session:
        _insert(session, built)
        session.add(transient(Job, **{**SUBMITTED, "id": "j-2", "labels": {"team": "a"}}))  # the unit of work's insert
    with db.transaction(immediate=False) as session:
        stored = {j.id: j for j in session.scalars(select(Job))}
    assert (stored["j-1"].command, stored["j-1"].labels) == (["python", "train.py"], {})
    assert (stored["j-2"].labels, stored["j-2"].history, stored["j-2"].base_priority) == ({"team": "a"}, [], 0.0)


def test_rows_go_in_in_order_and_an_unset_autoincrement_key_is_assigned(db: Database) -> None:
    job = new_job()
    changes = [PriorityChange(job_id="j-1", at=NOW, basis="submit", before=None, after=float(i), parts={"total": i})
               for i in range(2)]
    with db.transaction() as session:
        _insert(session, job, *changes)  # the job first: the changes' foreign key needs it
    with db.transaction(immediate=False) as session:
        rows = session.scalars(select(PriorityChange).order_by(PriorityChange.id)).all()
    assert [(r.after, r.note) for r in rows] == [(0.0, ""), (1.0, "")]
    assert all(isinstance(r.id, int) for r in rows)


def submission(job_id: str = "j-1") -> tuple[Job, SchedJob, PriorityChange]:
    job = new_job()
    job.id = job_id
    return (job, SchedJob(job_id=job_id, queued_at=NOW, mounts=["/data"], priority=3.5, parts={"total": 3.5}),
            PriorityChange(job_id=job_id, at=NOW, basis="submit", before=None, after=3.5, parts={"total": 3.5}))


def test_a_submission_goes_in_whole_and_reads_as_stored(db: Database) -> None:
    """SQLite writes the three rows with one statement, through a view whose trigger fans them out: every column
    arrives converted as its own table's type would convert it, and the objects carry their defaults."""
    job, sched, change = submission()
    insert_submission(db, job, sched, change)
    assert sched.borrowed is False and sched.renewals == [] and change.note == ""
    with db.transaction(immediate=False) as session:
        stored_job = session.get(Job, "j-1")
        stored_sched = session.get(SchedJob, "j-1")
        (stored_change,) = session.scalars(select(PriorityChange)).all()
    assert stored_job is not None and stored_sched is not None
    assert (stored_job.command, stored_job.env, stored_job.grace_seconds) == (["python", "train.py"], {}, 30.0)
    assert stored_job.submitted_at.replace(tzinfo=None) == NOW.replace(tzinfo=None)
    assert (stored_sched.mounts, stored_sched.priority, stored_sched.parts, stored_sched.borrowed) == (
        ["/data"], 3.5, {"total": 3.5}, False)
    assert (stored_change.basis, stored_change.after, stored_change.parts) == ("submit", 3.5, {"total": 3.5})
    assert isinstance(stored_change.id, int)


def test_a_submission_that_fails_leaves_none_of_its_rows(db: Database) -> None:
    """All three rows or none: the job row of a second submission with the same id is refused, and its scheduling
    row and priority entry, which would have gone in beside it, are not there either."""
    insert_submission(db, *submission())
    job, sched, change = submission()
    change.after = 99.0
    with pytest.raises(IntegrityError):
        insert_submission(db, job, sched, change)
    with db.transaction(immediate=False) as session:
        assert [c.after for c in session.scalars(select(PriorityChange)).all()] == [3.5]
        assert len(session.scalars(select(SchedJob)).all()) == 1


def test_the_submission_view_follows_the_tables_when_the_schema_is_created_again(db: Database) -> None:
    create_schema(db.engine)  # every start-up does: the view is made again from the models' columns
    insert_submission(db, *submission("j-2"))
    with db.transaction(immediate=False) as session:
        assert session.get(Job, "j-2") is not None


def _reserved(db: Database, holder: str) -> idempotency.Claim:
    """A key reserved by `holder` (as the API's middleware reserves it before the request runs)."""
    claim = idempotency.Claim("principal:alice", f"k-{holder}", holder)
    with db.single_statement() as connection:
        assert idempotency.reserve_fresh(connection, claim, "print", NOW)
    return claim


def test_a_submission_holding_an_idempotency_key_marks_it_acted_with_its_rows(db: Database) -> None:
    claim = _reserved(db, "first")
    token = idempotency.CURRENT.set(claim)
    try:
        insert_submission(db, *submission())
    finally:
        idempotency.CURRENT.reset(token)
    with db.transaction(immediate=False) as session:
        row = idempotency.held(session, claim.scope, claim.key)
        assert row is not None and row.state == idempotency.ACTED and session.get(Job, "j-1") is not None


def test_a_submission_whose_key_a_retry_took_over_writes_nothing(db: Database) -> None:
    """The retry holds the key now: the first attempt's write is refused whole (on SQLite by the one statement's
    trigger, on PostgreSQL by its transaction's first statement) and the key stays the retry's."""
    claim = _reserved(db, "first")
    with db.single_statement() as connection:
        connection.execute(update(idempotency.IdempotencyKey).values(holder="retry"))
    token = idempotency.CURRENT.set(claim)
    try:
        with pytest.raises(idempotency.Superseded):
            insert_submission(db, *submission())
    finally:
        idempotency.CURRENT.reset(token)
    with db.transaction(immediate=False) as session:
        row = idempotency.held(session, claim.scope, claim.key)
        assert row is not None and (row.state, row.holder) == (idempotency.PROCESSING, "retry")
        assert session.get(Job, "j-1") is None and session.scalars(select(SchedJob)).all() == []


def test_a_fresh_key_is_reserved_once(db: Database) -> None:
    """reserve_fresh inserts only where the key has no row: the second attempt leaves the first's reservation."""
    claim = _reserved(db, "first")
    with db.single_statement() as connection:
        assert not idempotency.reserve_fresh(connection, idempotency.Claim(claim.scope, claim.key, "second"),
                                             "print", NOW)
    with db.transaction(immediate=False) as session:
        row = idempotency.held(session, claim.scope, claim.key)
        assert row is not None and row.holder == "first"
