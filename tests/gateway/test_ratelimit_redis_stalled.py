"""A Redis that stops answering (a partition, a failover that pauses it) refuses mutating calls as counts
unavailable, in bounded time and in the ledger, instead of holding them (and their job rows) for ever."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from gateway_testkit import Api, job_spec, ledger_entries, start_api

from gateway.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real redis-server of this test's own, and its process (skipped where none is installed)."""
    import redis

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
                time.sleep(0.05)
        client.close()
        yield url, proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


def _post_into(answers: list[httpx.Response], api: Api, path: str) -> None:
    answers.append(api.post(path, "alice", json={"reason": "done"}))


def test_a_redis_that_stopped_answering_refuses_the_call_in_bounded_time(
    tmp_path: Path, fresh_pg_database: Callable[[str], str], redis_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, proc = redis_server
    settings = Settings(data_dir=tmp_path, database_url=fresh_pg_database("jobgate_biz"),
                        ledger_url=fresh_pg_database("jobgate_ledger"), rate_limit_storage=url,
                        policy_watch_interval_s=0)
    for api in start_api(settings):
        job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
        assert api.post(f"/v1/jobs/{job_id}/priority", "alice", json={"priority": 10}).status_code == 200
        os.kill(proc.pid, signal.SIGSTOP)  # up, connected, and answering nothing
        answers: list[httpx.Response] = []
        # A daemon thread: on the old code the call never returned, and must not hold the test run.
        caller = threading.Thread(target=_post_into, args=(answers, api, f"/v1/jobs/{job_id}/stop"), daemon=True)
        started = time.monotonic()
        caller.start()
        caller.join(20)
        waited = time.monotonic() - started
        os.kill(proc.pid, signal.SIGCONT)  # before any assert: a call still waiting then ends, and the app with it
        caller.join(20)
        assert waited < 10, f"the call waited {waited:.0f} s for a Redis that answered nothing"
        r = answers[0]
        assert r.status_code == 403 and "counts are unavailable" in r.json()["detail"], r.text
        decision = next(e for e in ledger_entries(api) if e["seq"] == r.json()["ledger_seq"])["body"]["decision"]
        assert decision["effect"] == "deny"
        assert api.get(f"/v1/jobs/{job_id}", "alice").json()["state"] == "pending"
        # Redis back: counted again, and allowed.
        assert api.post(f"/v1/jobs/{job_id}/priority", "alice", json={"priority": 20}).status_code == 200
