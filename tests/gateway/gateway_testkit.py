"""Helpers for gateway tests: call the in-process API as one of the demo cast."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.bootstrap import ExecutionFactory, native_execution
from gateway.demo import prepare_demo
from gateway.errors import leaf_routes
from gateway.settings import Settings


@dataclass
class Api:
    """Calls the API as one of the demo cast."""

    client: TestClient
    tokens: dict[str, str]
    settings: Settings

    def headers(self, who: str | None, **extra: str) -> dict[str, str]:
        h = dict(extra)
        if who:
            h["Authorization"] = f"Bearer {self.tokens[who]}"
        return h

    def get(self, path: str, who: str | None = None, **kw: Any) -> httpx.Response:
        return self.client.get(path, headers=self.headers(who, **kw.pop("headers", {})), **kw)

    def post(self, path: str, who: str | None = None, **kw: Any) -> httpx.Response:
        return self.client.post(path, headers=self.headers(who, **kw.pop("headers", {})), **kw)

    @property
    def gateway(self) -> Any:
        return self.client.app.state.gateway  # type: ignore[attr-defined]


def start_api(settings: Settings, *, execution: ExecutionFactory = native_execution) -> Iterator[Api]:
    """The demo gateway under `settings`, its lifespan running, as the demo cast calls it; its jobs run on
    `execution` (jobgate's scheduler loop and node agents unless a test asks for another)."""
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False, execution=execution)) as client:
        yield Api(client, tokens, settings)


class InBackground:
    """A call run on a daemon thread, so that a test can bound how long it waits for it: on the code under test
    the call may never return, and must not hold the test run."""

    def __init__(self, call: Callable[[], httpx.Response]) -> None:
        self._answers: list[httpx.Response] = []
        self._thread = threading.Thread(target=lambda: self._answers.append(call()), daemon=True)
        self._started = time.monotonic()
        self._thread.start()

    def wait(self, timeout: float) -> float:
        """Wait up to `timeout` seconds more; the seconds since the call started."""
        self._thread.join(timeout)
        return time.monotonic() - self._started

    @property
    def answer(self) -> httpx.Response:
        assert self._answers, "the call has not returned"
        return self._answers[0]


@contextmanager
def redis_server(directory: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real redis-server of the test's own, answering at the URL given with it (skipped where none is installed)."""
    import redis

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        proc.terminate()
        proc.wait(timeout=10)


def job_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "train-a", "project": "vision", "gpus_per_node": 2, "nodes": 1,
                            "command": ["python3", "-c", "print(1)"]}
    spec.update(overrides)
    return spec




def app_routes(app: Any, *, skip: frozenset[str] = frozenset({"HEAD"})) -> Iterator[tuple[str, str]]:
    """(method, path) of every route of the app, including routers included in routers; methods in `skip` left
    out."""

    for route in leaf_routes(app.routes):
        for method in sorted(set(getattr(route, "methods", None) or ()) - skip):
            yield method, getattr(route, "path", "")


def path_objects(api: Api) -> dict[str, str]:
    """Real objects for the API's path ids: a running job of alice's with a stop awaiting approval, a token,
    a break-glass grant, a notice to alice that asks for a receipt, an emergency stop holding a workload; the
    project and node the job uses."""
    from gateway.store.models import Job

    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state = "running"
        job.placement = [{"node": "demo-node-1", "gpus": [0, 1]}]
    approval = api.post(f"/v1/jobs/{job_id}/stop", "carol", json={"reason": "make an approval"}).json()
    token = api.post("/v1/tokens", "alice", json={"purpose": "a path object", "projects": ["vision"],
                                                  "actions": ["job.view"], "expires_in_days": 1}).json()
    grant = api.post("/v1/break-glass", "dave", json={"projects": ["vision"], "actions": ["job.stop"],
                                                       "duration_minutes": 5, "ticket": "INC-2",
                                                       "reason": "make a grant for a path"}).json()
    other = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    asked = api.post(f"/v1/jobs/{other}/stop", "carol", json={"reason": "make a notice"}).json()["approval_id"]
    api.post(f"/v1/approvals/{asked}/approve", "dave")
    note = next(n for n in api.get("/v1/notifications", "alice").json()["notifications"] if n["receipt"] == "pending")
    api.post("/v1/jobs", "alice", json=job_spec(workload="held"))
    emergency = api.post("/v1/emergency-stops", "dave", json={
        "scope": {"kind": "workload", "value": "held"}, "trigger": "safety", "reason": "make a hold"}).json()
    api.post(f"/v1/approvals/{emergency['approval_id']}/approve", "sam")
    return {"job_id": job_id, "approval_id": approval["approval_id"], "token_id": token["id"],
            "grant_id": grant["id"], "notification_id": note["id"], "project": "vision", "node_id": "demo-node-1",
            "emergency_id": emergency["id"]}


def ledger_entries(api: Api) -> list[dict[str, Any]]:
    """Every ledger entry, read as the auditor does."""
    r = api.get("/v1/ledger/entries", "audrey", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return [e["entry"] for e in r.json()["entries"]]


def assert_problem(r: httpx.Response, status: int, kind: str, contains: str = "") -> dict[str, Any]:
    """The response is RFC 9457 problem+json of this status and type, its detail containing `contains`."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"].endswith("/" + kind), body
    assert body["status"] == status
    assert contains in body["detail"], body["detail"]
    return dict(body)
