"""Node agents' long polls wait in a pool of their own: they never take the threads API calls run on."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.demo import DEMO_NODES, prepare_demo
from gateway.settings import Settings


@pytest.fixture
def one_thread_gateway(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[TestClient, Path]]:
    """A gateway with one API thread, on the policy engine given as the indirect parameter (default embedded)."""
    engine = getattr(request, "param", "embedded")
    if engine == "opa-inprocess":
        request.getfixturevalue("opa_golib")
    settings = Settings(data_dir=tmp_path, api_threads=1, policy_watch_interval_s=0, policy_engine=engine)
    prepare_demo(settings)
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        yield client, tmp_path


def test_long_polls_do_not_starve_api_calls(one_thread_gateway: tuple[TestClient, Path]) -> None:
    client, data_dir = one_thread_gateway
    alice = json.loads((data_dir / "demo-tokens.json").read_text())["alice"]
    node = DEMO_NODES[0]
    node_token = (data_dir / "agents" / node / "state" / "token").read_text().strip()
    finished: list[str] = []
    bus = client.app.state.gateway.bus
    waiting = threading.Semaphore(0)
    real_wait = bus.wait

    def counted_wait(*args: object) -> bool:
        waiting.release()
        return real_wait(*args)  # type: ignore[arg-type]

    bus.wait = counted_wait

    def long_poll() -> None:
        r = client.get(f"/v1/agents/{node}/commands", params={"wait": 20},
                       headers={"Authorization": f"Bearer {node_token}"})
        assert r.status_code == 200, r.text
        finished.append("poll")

    polls = [threading.Thread(target=long_poll) for _ in range(3)]
    for t in polls:
        t.start()
    for _ in polls:  # all three are inside their wait
        assert waiting.acquire(timeout=10)
    # With one API thread, a long poll holding it would make this call wait out the 20 s poll.
    r = client.get("/v1/jobs", headers={"Authorization": f"Bearer {alice}"})
    assert r.status_code == 200, r.text
    finished.append("api")
    assert finished == ["api"], finished  # answered while all three polls were still waiting
    bus.close()  # release the polls
    for t in polls:
        t.join(timeout=30)
    assert finished.count("poll") == 3


@pytest.fixture
def thread_hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions sent to a worker thread (anyio.to_thread.run_sync) from now on, in order."""
    hops: list[str] = []
    real_run_sync = anyio.to_thread.run_sync

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(func, "__name__", repr(func)))
        return await real_run_sync(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    return hops


def test_a_sync_call_takes_one_thread_hop(one_thread_gateway: tuple[TestClient, Path], thread_hops: list[str]) -> None:
    """The endpoint runs in the pool; FastAPI's validation and encoding of what it returns does not hop there
    again (gateway.app.serialize_responses_in_the_loop)."""
    client, data_dir = one_thread_gateway
    r = client.get("/v1/jobs", headers=_token(data_dir, "alice"))
    assert r.status_code == 200, r.text
    assert r.json() == {"jobs": []}  # still validated and encoded as the response model says
    assert len(thread_hops) == 1, thread_hops


def _token(data_dir: Path, who: str) -> dict[str, str]:
    return {"Authorization": "Bearer " + json.loads((data_dir / "demo-tokens.json").read_text())[who]}


SPEC = {"name": "n", "project": "vision", "gpus_per_node": 1, "command": ["true"]}


def call_in_thread(client: TestClient, data_dir: Path, answers: dict[str, int], name: str, method: str, path: str,
                   **kw: Any) -> threading.Thread:
    """Make the call as alice in a thread of its own; its status lands in answers[name]."""
    def run() -> None:
        answers[name] = client.request(method, path, headers=_token(data_dir, "alice"), **kw).status_code

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("one_thread_gateway", ["embedded", "opa-inprocess"], indirect=True)
def test_a_submission_runs_on_the_event_loop(one_thread_gateway: tuple[TestClient, Path],
                                             thread_hops: list[str]) -> None:
    """On the embedded SQLite with a policy engine in-process (regopy, or OPA's evaluator) a submission takes no
    thread hop (gateway.jobs.submit): nothing it waits on is across a network."""
    client, data_dir = one_thread_gateway
    r = client.post("/v1/jobs", json=SPEC, headers=_token(data_dir, "alice"))
    assert r.status_code == 201, r.text
    assert thread_hops == []


def test_a_submission_waiting_for_the_ledger_holds_no_worker_thread(one_thread_gateway: tuple[TestClient, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    client, data_dir = one_thread_gateway
    store = client.app.state.gateway.ledger._store
    gate, writing = threading.Event(), threading.Event()
    real_write = store.write_batch

    def held_write(*args: Any, **kwargs: Any) -> None:
        writing.set()
        assert gate.wait(30)
        real_write(*args, **kwargs)

    monkeypatch.setattr(store, "write_batch", held_write)
    answers: dict[str, int] = {}
    submission = call_in_thread(client, data_dir, answers, "submit", "POST", "/v1/jobs", json=SPEC)
    assert writing.wait(10)  # its decision is being written, and waits at the gate
    # With one API thread, a submission waiting in it would keep this call out until the ledger wrote.
    listing = call_in_thread(client, data_dir, answers, "list", "GET", "/v1/jobs")
    listing.join(timeout=10)
    assert answers == {"list": 200}
    gate.set()
    submission.join(timeout=30)
    assert answers == {"list": 200, "submit": 201}


def test_a_submission_whose_insert_would_wait_for_another_writer_waits_in_a_thread(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, policy_watch_interval_s=0)
    prepare_demo(settings)
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        gw = client.app.state.gateway
        size = gw.ledger.size()
        answers: dict[str, int] = {}
        with gw.db.transaction():  # another thread's write: it holds the write lock
            submission = call_in_thread(client, tmp_path, answers, "submit", "POST", "/v1/jobs", json=SPEC)
            deadline = time.monotonic() + 10
            while gw.ledger.size() == size:  # decided and recorded: next comes the insert, which must wait
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(0.1)
            # Waiting on the event loop, it would keep every other call out until the lock was let go.
            listing = call_in_thread(client, tmp_path, answers, "list", "GET", "/v1/jobs")
            listing.join(timeout=10)
            assert answers == {"list": 200}
        submission.join(timeout=30)
        assert answers == {"list": 200, "submit": 201}
