"""Q3 contribution scores in data.json must be numbers. A reviewer writing `"alice": "20"` had the set loaded
and alice's score read as 0: her jobs lost their standing in the queue, and nothing said why."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_testkit import Api, start_api

from gateway.jobs.quotas import contribution_of
from gateway.settings import REPO_POLICIES, Settings


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    yield from start_api(Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_watch_interval_s=0))


@pytest.mark.parametrize(("written", "error"), [
    ('"alice": "20"', "data.json:10: contribution.alice must be a number"),
    ('"alice": true', "data.json:10: contribution.alice must be a number"),
], ids=["text", "bool"])
def test_a_score_that_is_not_a_number_is_refused_at_reload(api: Api, written: str, error: str) -> None:
    data = api.gateway.settings.policies_dir / "data.json"
    data.write_text(data.read_text().replace('"alice": 20', written))
    r = api.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [error]
    assert contribution_of(api.gateway, "alice") == 20
