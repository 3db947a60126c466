"""A request waiting for a PostgreSQL lock another session keeps (a job row left locked by a manual UPDATE in an
open transaction) is refused after JOBGATE_DATABASE_LOCK_TIMEOUT_S, not held for as long as that session lives."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from gateway_testkit import InBackground, assert_problem, job_spec, ledger_entries, start_api

from gateway.settings import Settings

pytestmark = pytest.mark.integration


def test_a_job_row_another_session_keeps_locked_refuses_the_stop_in_bounded_time(
    tmp_path: Path, fresh_pg_database: Callable[[str], str]
) -> None:
    import psycopg

    biz = fresh_pg_database("jobgate_biz")
    settings = Settings(data_dir=tmp_path, database_url=biz, ledger_url=fresh_pg_database("jobgate_ledger"),
                        database_lock_timeout_s=2)
    for api in start_api(settings):
        job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
        seen = len(ledger_entries(api))
        dba = psycopg.connect(biz)  # a psql session left open after a manual UPDATE
        try:
            dba.execute("UPDATE jobs SET state_reason = 'looked at by hand' WHERE id = %s", (job_id,))
            call = InBackground(partial(api.post, f"/v1/jobs/{job_id}/stop", "alice",
                                                json={"reason": "done for today"}))
            waited = call.wait(20)  # on the old code the call returned only when that session ended
        finally:
            dba.rollback()
            dba.close()
        call.wait(20)
        assert waited < 20, "the stop waited for the other session's lock"
        assert_problem(call.answer, 503, "database-unavailable")
        assert len(ledger_entries(api)) == seen  # refused before anything was decided
        r = api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done for today"})
        assert r.status_code in (200, 202), r.text
