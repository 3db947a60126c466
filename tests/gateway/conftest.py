"""An in-process gateway (real FastAPI app over the ASGI transport) on SQLite and on PostgreSQL."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_testkit import Canned, CannedHandler
from gateway_testkit import Api, start_api
from served_app import served
from stop_helpers import FakeAgent

from gateway.bootstrap import in_process_execution
from gateway.demo import DEMO_GPUS_PER_NODE, DEMO_NODES
from gateway.settings import REPO_POLICIES, Settings


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "sqlite":
        return Settings(data_dir=tmp_path)
    make: Callable[[str], str] = request.getfixturevalue("fresh_pg_database")
    return Settings(data_dir=tmp_path, database_url=make("jobgate_biz"), ledger_url=make("jobgate_ledger"))


@pytest.fixture
def api(settings: Settings) -> Iterator[Api]:
    yield from start_api(settings)


@pytest.fixture
def inproc_api(settings: Settings) -> Iterator[Api]:
    """The demo gateway whose jobs run in this process (gateway/execution/inprocess.py), on the demo's two nodes of
    eight GPUs, carried out when a test calls `api.gateway.execution.run()`: for tests that are not about agents."""
    yield from start_api(settings, execution=in_process_execution(dict.fromkeys(DEMO_NODES, DEMO_GPUS_PER_NODE)))


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A copy of the shipped policies, for a test to edit and reload."""
    target = tmp_path / "candidate-policies"
    shutil.copytree(REPO_POLICIES, target)
    return target


@pytest.fixture
def papi(settings: Settings, policy_dir: Path) -> Iterator[Api]:
    """The demo gateway deciding with that copy (no watcher: reloads only by API)."""
    yield from start_api(settings.model_copy(update={"policies_dir": policy_dir, "policy_watch_interval_s": 0}))


@pytest.fixture
def agent(api: Api) -> FakeAgent:
    """demo-node-1's agent, beating, with nothing left to take (files that need it otherwise define their own)."""
    a = FakeAgent(api, "demo-node-1")
    a.beat()
    a.take()
    return a


@pytest.fixture
def canned() -> Iterator[Canned]:
    """A canned HTTP server on a real socket (tests/gateway/cli_testkit.py), for the CLI to format answers from."""
    server = Canned(("127.0.0.1", 0), CannedHandler)
    server.answers = {}
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)  # (its poll: teardown waits it)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def url(api: Api) -> Iterator[str]:
    """The fixture's app behind a real uvicorn socket."""
    with served(api.client.app) as base:
        yield base

