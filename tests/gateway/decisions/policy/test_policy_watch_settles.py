"""The directory watcher loads an edit once it has settled: a set seen half-written (one file of a multi-file
edit saved, the next not yet) is never loaded. Before, the first look after any change reloaded, so a set in
between, which no reviewer wrote, became active and was ledgered as loaded whenever it compiled and passed its
tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_testkit import Api, start_api

from gateway.decisions.policy.loader import policy_hash
from gateway.decisions.policy_reload import PolicyReloader
from gateway.settings import REPO_POLICIES, Settings


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    yield from start_api(Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_watch_interval_s=0))


def loads(api: Api) -> list[dict[str, Any]]:
    return [a for a in api.get("/v1/policy", "sam").json()["history"] if a["result"] == "loaded"]


def test_a_set_seen_half_written_is_never_loaded(api: Api) -> None:
    reloader: PolicyReloader = api.client.app.state.policy_reloader  # type: ignore[attr-defined]
    policies = api.gateway.settings.policies_dir
    data = policies / "data.json"
    # The reviewer's edit: a lower batch limit in data.json, then a note in the matrix, saved one after the other.
    data.write_text(data.read_text().replace('"jobs_per_batch": 50', '"jobs_per_batch": 40'))
    half_written = policy_hash(policies)
    assert reloader.poll_once() is None  # a change: wait for it to settle
    (policies / "matrix.csv").write_text((policies / "matrix.csv").read_text() + "# batch limit lowered\n")
    assert reloader.poll_once() is None  # changed again: still settling
    attempt = reloader.poll_once()  # unchanged since the last look: load
    assert attempt is not None and attempt.result == "loaded" and attempt.policy_hash == policy_hash(policies)
    assert half_written not in {a["policy_hash"] for a in loads(api)}
    assert reloader.poll_once() is None
