"""An in-process gateway (real FastAPI app over the ASGI transport) on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.db import Database
from gateway.demo import seed_demo
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


def job_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "train-a", "project": "vision", "gpus_per_node": 2, "nodes": 1,
                            "command": ["python3", "-c", "print(1)"]}
    spec.update(overrides)
    return spec


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "sqlite":
        return Settings(data_dir=tmp_path)
    make: Callable[[str], str] = request.getfixturevalue("fresh_pg_database")
    return Settings(data_dir=tmp_path, database_url=make("jobgate_biz"), ledger_url=make("jobgate_ledger"))


@pytest.fixture
def api(settings: Settings) -> Iterator[Api]:
    db = Database(settings.resolved_database_url())
    db.create_schema()
    with db.transaction() as session:
        seed_demo(session, settings.data_dir)
    db.close()
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        yield Api(client, tokens, settings)
