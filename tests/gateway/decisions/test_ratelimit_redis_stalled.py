"""A Redis that stops answering (a partition, a failover that pauses it) refuses mutating calls as counts
unavailable, in bounded time and in the ledger, instead of holding them (and their job rows) for ever."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from gateway_testkit import InBackground, job_spec, ledger_entries, redis_server, start_api

from gateway.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def stoppable_redis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of this test's own and its process, woken again (SIGCONT) before it is stopped."""
    with redis_server(tmp_path) as (url, proc):
        try:
            yield url, proc
        finally:
            os.kill(proc.pid, signal.SIGCONT)


def test_a_redis_that_stopped_answering_refuses_the_call_in_bounded_time(
    tmp_path: Path, fresh_pg_database: Callable[[str], str], stoppable_redis: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, proc = stoppable_redis
    settings = Settings(data_dir=tmp_path, database_url=fresh_pg_database("jobgate_biz"),
                        ledger_url=fresh_pg_database("jobgate_ledger"), rate_limit_storage=url,
                        policy_watch_interval_s=0)
    for api in start_api(settings):
        job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
        assert api.post(f"/v1/jobs/{job_id}/priority", "alice", json={"priority": 10}).status_code == 200
        os.kill(proc.pid, signal.SIGSTOP)  # up, connected, and answering nothing
        call = InBackground(partial(api.post, f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"}))
        waited = call.wait(20)  # on the old code the call never returned
        os.kill(proc.pid, signal.SIGCONT)  # before any assert: a call still waiting then ends, and the app with it
        call.wait(20)
        assert waited < 10, f"the call waited {waited:.0f} s for a Redis that answered nothing"
        r = call.answer
        assert r.status_code == 503 and "counts are unavailable" in r.json()["detail"], r.text
        decision = next(e for e in ledger_entries(api) if e["seq"] == r.json()["ledger_seq"])["body"]["decision"]
        assert decision["effect"] == "deny"
        assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "pending"
        # Redis back: counted again, and allowed.
        assert api.post(f"/v1/jobs/{job_id}/priority", "alice", json={"priority": 20}).status_code == 200
