"""db.insert_new: a submission's rows go in through Core, and the objects read as the stored rows do."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from gateway.db import Database, insert_new
from gateway.models import Job, Principal, Project
from gateway.scheduler_tables import PriorityChange

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/biz.db"
    else:
        make: Callable[[str], str] = request.getfixturevalue("fresh_pg_database")
        url = make("jobgate_insert")
    database = Database(url)
    database.create_schema()
    with database.transaction() as session:
        session.add(Principal(id="alice", kind="person", display_name="Alice", created_at=NOW))
        session.add(Project(id="vision", organisation="acme"))
    yield database
    database.close()




def new_job() -> Job:
    """A job with only the columns a submission sets; the rest have column defaults."""
    return Job(id="j-1", name="train", project="vision", queue="normal", gpus_per_node=2, nodes=1,
               command=["python", "train.py"], grace_seconds=30.0, stop_signal="SIGTERM", creator="alice",
               creator_kind="person", owner="alice", beneficiary_project="vision", rights_holder="vision",
               contact="alice", environment="prod", state="pending", submitted_at=NOW)


def test_defaults_are_filled_into_the_object_and_stored(db: Database) -> None:
    job = new_job()
    with db.transaction() as session:
        insert_new(session, job)
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


def test_rows_go_in_in_order_and_an_unset_autoincrement_key_is_assigned(db: Database) -> None:
    job = new_job()
    changes = [PriorityChange(job_id="j-1", at=NOW, basis="submit", before=None, after=float(i), parts={"total": i})
               for i in range(2)]
    with db.transaction() as session:
        insert_new(session, job, *changes)  # the job first: the changes' foreign key needs it
    with db.transaction(immediate=False) as session:
        rows = session.scalars(select(PriorityChange).order_by(PriorityChange.id)).all()
    assert [(r.after, r.note) for r in rows] == [(0.0, ""), (1.0, "")]
    assert all(isinstance(r.id, int) for r in rows)


def test_nothing_stays_when_the_transaction_rolls_back(db: Database) -> None:
    with pytest.raises(RuntimeError), db.transaction() as session:
        insert_new(session, new_job())
        raise RuntimeError("refused after the insert")
    with db.transaction(immediate=False) as session:
        assert session.scalars(select(Job)).all() == []
