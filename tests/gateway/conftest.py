"""An in-process gateway (real FastAPI app over the ASGI transport) on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api
from stop_helpers import FakeAgent

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import Settings


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "sqlite":
        return Settings(data_dir=tmp_path)
    make: Callable[[str], str] = request.getfixturevalue("fresh_pg_database")
    return Settings(data_dir=tmp_path, database_url=make("jobgate_biz"), ledger_url=make("jobgate_ledger"))


@pytest.fixture
def api(settings: Settings) -> Iterator[Api]:
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        yield Api(client, tokens, settings)


@pytest.fixture
def agent(api: Api) -> FakeAgent:
    """demo-node-1's agent, beating, with nothing left to take (files that need it otherwise define their own)."""
    a = FakeAgent(api, "demo-node-1")
    a.beat()
    a.take()
    return a
