"""Helpers for gateway tests: call the in-process API as one of the demo cast."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from fastapi.testclient import TestClient

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
