"""What one scheduler cycle reads with jobs waiting: each waiting job's rows once, without the columns neither
the plan nor the explanation uses (the cycle runs every second, and on SQLite every write waits for it), and
still the explanation of every waiting job and a whole start command for every job it starts."""

from __future__ import annotations

import re

import pytest
from gateway_testkit import Api, job_spec
from sched_testkit import bring_up_nodes, full_cluster_an_hour_on
from sqlalchemy import Engine, event, select

from gateway.native.scheduler_loop import run_once
from gateway.store.models import NodeCommand
from gateway.store.scheduler_tables import SchedJob

WAITING_ROWS = re.compile(r"\bFROM jobs LEFT OUTER JOIN sched_jobs\b.*\bWHERE jobs\.state = ", re.DOTALL)


def statements_of_a_cycle_that_starts_nothing(api: Api) -> list[str]:
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        assert run_once(api.gateway) == 0
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    return statements


def test_a_cycle_reads_the_waiting_jobs_once_and_explains_each(api: Api) -> None:
    full_cluster_an_hour_on(api)
    waiting = [api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=1, name=f"w{i}")).json()["id"]
               for i in range(3)]
    statements = statements_of_a_cycle_that_starts_nothing(api)
    reads = [s for s in statements if s.startswith("SELECT") and WAITING_ROWS.search(s)]
    assert len(reads) == 1, reads  # the explanation used to read every waiting job's rows a second time
    assert not re.search(r"\bjobs\.(history|evidence|command|env|labels)\b", reads[0])
    assert not re.search(r"\bsched_jobs\.(parts|mounts|datasets|renewals)\b", reads[0])  # JSON no plan reads
    now = api.gateway.clock()
    with api.gateway.transaction(immediate=False) as s:
        rows = {r.job_id: r for r in s.scalars(select(SchedJob).where(SchedJob.job_id.in_(waiting)))}
        assert sorted(r.position for r in rows.values()) == [1, 2, 3]
        assert all(r.estimated_at == now and r.blocked_reason for r in rows.values())


def test_a_job_the_cycle_starts_gets_its_whole_start_command(api: Api) -> None:
    """The cycle reads waiting jobs without their command and environment; the one it starts reads them."""
    bring_up_nodes(api)
    spec = job_spec(command=["python3", "train.py", "--epochs", "3"], env={"SEED": "7"})
    job_id = api.post("/v1/jobs", "alice", json=spec).json()["id"]
    assert run_once(api.gateway) == 1
    with api.gateway.transaction(immediate=False) as s:
        (start,) = s.scalars(select(NodeCommand).where(NodeCommand.job_id == job_id, NodeCommand.kind == "start"))
        params = start.envelope_params()
    assert params["argv"] == spec["command"] and params["env"] == {"SEED": "7"}


def test_the_cycle_locks_the_waiting_jobs_without_reading_their_rows(api: Api) -> None:
    """PostgreSQL: the cycle locks every job it may change first, in id order. That lock used to load each whole
    row, every waiting job's command, env and history decoded from JSON, each cycle; the steps after it read
    what they need."""
    if api.gateway.db.is_sqlite:
        pytest.skip("SQLite: the cycle's transaction holds the write lock, there are no row locks")
    full_cluster_an_hour_on(api)
    for i in range(3):
        api.post("/v1/jobs", "alice", json=job_spec(gpus_per_node=1, name=f"w{i}"))
    statements = statements_of_a_cycle_that_starts_nothing(api)
    locks = [s for s in statements if "FOR UPDATE" in s and re.search(r"\bFROM jobs\b", s)]
    assert locks, statements
    assert all(re.match(r"SELECT jobs\.id\s+FROM jobs\b", s) for s in locks), locks
