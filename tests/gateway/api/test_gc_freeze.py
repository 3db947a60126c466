"""The gateway keeps what start-up built out of the cyclic collector's full passes (p99 latency)."""

from __future__ import annotations

import gc
from pathlib import Path

from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import Settings


def test_start_up_objects_are_frozen_before_requests_are_served(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, policy_watch_interval_s=0)
    prepare_demo(settings)
    gc.unfreeze()  # whatever an earlier test's app froze
    assert gc.get_freeze_count() == 0
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        frozen = gc.get_freeze_count()
        assert client.get("/healthz").status_code == 200
    gc.unfreeze()
    # Modules, mappers, routes and the policy engine: far more than a handful of objects.
    assert frozen > 10_000, frozen
