"""Issue 28, Deliver 5: kill -9 of a follower under load; its clients retry on the other replica with their
Idempotency-Keys, and nothing happens twice. Two `jobgate up` processes on one PostgreSQL business database and
ledger; clients submit jobs to the follower, each request with a key of its own, until it is killed; every request
that did not get its answer is sent again, same key, to the leader (after Retry-After while the dead replica's
reservation runs out). Every key then names exactly one job, and every answered job id is that job."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_testkit import job_spec

from gateway.demo import prepare_demo
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.models import Job

pytestmark = [pytest.mark.integration, pytest.mark.e2e]  # two `jobgate up` processes

CLIENTS = 8
DEADLINE_S = 60  # (a bound on a test that would otherwise hang; no wall time is asserted)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def replicas(tmp_path: Path, fresh_pg_database: Callable[[str], str]) -> Iterator[dict[str, Any]]:
    biz, ledger = fresh_pg_database("jobgate_biz"), fresh_pg_database("jobgate_ledger")
    data_dir = tmp_path / "d"
    settings = Settings(data_dir=data_dir, database_url=biz, ledger_url=ledger)
    prepare_demo(settings)
    token = json.loads((data_dir / "demo-tokens.json").read_text())["alice"]
    env = {**os.environ, "JOBGATE_URL": "", "JOBGATE_DATABASE_URL": biz, "JOBGATE_LEDGER_URL": ledger}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for _ in range(2):
            port = _port()
            with (tmp_path / f"up-{port}.log").open("wb") as log:
                procs[f"http://127.0.0.1:{port}"] = subprocess.Popen(
                    [sys.executable, "-m", "gateway.cli", "up", "--port", str(port), "--data-dir", str(data_dir)],
                    stdout=log, stderr=subprocess.STDOUT, env=env)
        roles = {url: _role(url, proc) for url, proc in procs.items()}
        assert sorted(roles.values()) == ["follower", "leader"], roles
        follower = next(u for u, r in roles.items() if r == "follower")
        leader = next(u for u, r in roles.items() if r == "leader")
        yield {"follower": follower, "leader": leader, "kill": procs[follower], "token": token,
               "db": biz}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _role(url: str, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the replica at {url} exited with {proc.returncode}"
        try:
            return str(httpx.get(url + "/healthz", timeout=2).json()["role"])
        except (httpx.HTTPError, ValueError, KeyError):
            time.sleep(0.2)
    raise AssertionError(f"the replica at {url} did not answer /healthz")


class Client(threading.Thread):
    """Submits jobs to the follower, one key each, until it dies; then finishes its last one on the leader."""

    def __init__(self, replicas: dict[str, Any], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.r, self.stop = replicas, stop
        self.answered: dict[str, str] = {}  # key -> job id from a 201 (first answer or replay)
        self.lost: list[str] = []  # keys whose first request acted and whose answer died with the replica
        self.retried = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.r["follower"], timeout=30) as http:
                while not self.stop.is_set():
                    key = str(uuid.uuid4())
                    try:
                        self._answer(key, http.post("/v1/jobs", json=job_spec(name=key), headers=self._h(key)))
                    except httpx.TransportError:  # the follower died under this request
                        self.retried += 1
                        self._on_leader(key)
                        return
        except BaseException as e:  # reported by the test
            self.error = e

    def _h(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.r['token']}", "Idempotency-Key": f'"{key}"'}

    def _on_leader(self, key: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        with httpx.Client(base_url=self.r["leader"], timeout=30) as http:
            while time.monotonic() < deadline:
                r = http.post("/v1/jobs", json=job_spec(name=key), headers=self._h(key))
                if r.status_code == 409 and r.json()["type"].endswith("/idempotency-key-in-use"):
                    time.sleep(float(r.headers["retry-after"]))  # the dead replica's reservation runs out
                    continue
                if r.status_code == 409 and r.json()["type"].endswith("/idempotency-answer-lost"):
                    self.lost.append(key)
                    return
                self._answer(key, r)
                return
        raise AssertionError(f"{key}: no answer from the leader")

    def _answer(self, key: str, r: httpx.Response) -> None:
        assert r.status_code == 201, r.text
        self.answered[key] = r.json()["id"]


def test_clients_of_a_killed_follower_retry_on_the_leader_and_nothing_happens_twice(
        replicas: dict[str, Any]) -> None:
    stop = threading.Event()
    clients = [Client(replicas, stop) for _ in range(CLIENTS)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + DEADLINE_S
    while sum(len(c.answered) for c in clients) < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    replicas["kill"].send_signal(signal.SIGKILL)  # mid-load: requests in flight on it
    replicas["kill"].wait(10)
    stop.set()
    for c in clients:
        c.join(DEADLINE_S + 30)
        assert not c.is_alive() and c.error is None, c.error
    assert sum(c.retried for c in clients) >= 1  # some requests were cut off by the kill and sent again

    answered = {k: v for c in clients for k, v in c.answered.items()}
    lost = [k for c in clients for k in c.lost]
    db = Database(replicas["db"])
    try:
        with db.transaction(immediate=False) as s:
            rows = s.query(Job.name, Job.id).filter(Job.name.in_([*answered, *lost])).all()
    finally:
        db.close()
    by_name: dict[str, list[str]] = {}
    for name, job_id in rows:
        by_name.setdefault(name, []).append(job_id)
    assert {k: len(v) for k, v in by_name.items() if len(v) != 1} == {}  # no key acted twice
    assert {k: by_name.get(k) for k, v in answered.items() if by_name.get(k) != [v]} == {}  # the answer is the job
    assert all(k in by_name for k in lost)  # an answer lost with the replica: the job exists, once
