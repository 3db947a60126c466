"""A service account created while a policy reload is under way keeps its role in the engine that decides
after the reload. The reload reads the role bindings, builds the new engine, then swaps it in; the account's
binding, committed in between, was put into the old engine (read at commit time, without the policy lock) and
the new engine was built without it: the account's every call was denied until the gateway restarted."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_testkit import Api, job_spec, start_api

from gateway.decisions import policy_reload
from gateway.settings import REPO_POLICIES, Settings


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    yield from start_api(Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_watch_interval_s=0))


def test_a_service_account_created_during_a_reload_keeps_its_role(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    bindings_read, go_on = threading.Event(), threading.Event()
    make_engine = policy_reload.make_engine

    def paused_make_engine(*args: Any, **kwargs: Any) -> Any:
        bindings_read.set()  # the reload has read the bindings; hold it here while the account is made
        assert go_on.wait(30)
        return make_engine(*args, **kwargs)

    monkeypatch.setattr(policy_reload, "make_engine", paused_make_engine)
    matrix = api.gateway.settings.policies_dir / "matrix.csv"
    matrix.write_text(matrix.read_text() + "# reviewed\n")
    results: dict[str, Any] = {}
    reload = threading.Thread(target=lambda: results.update(reload=api.post("/v1/policy/reload", "sam")))
    reload.start()
    assert bindings_read.wait(30)
    create = threading.Thread(target=lambda: results.update(created=api.post(
        "/v1/service-accounts", "bob", json={"name": "sweep-bot", "project": "vision"})))
    create.start()
    create.join(2)  # committed (and, before the fix, put into the old engine)
    go_on.set()
    reload.join(30)
    create.join(30)
    assert results["reload"].status_code == 200, results["reload"].text
    assert results["created"].status_code == 201, results["created"].text

    assert api.gateway.policy.roles_of("sweep-bot") == {"vision": ["service"]}
    token = api.post("/v1/tokens", "bob", json={"principal": "sweep-bot", "purpose": "nightly training",
                                               "projects": ["vision"], "actions": ["job.submit"],
                                               "expires_in_days": 30})
    assert token.status_code == 201, token.text
    headers = {"Authorization": f"Bearer {token.json()['token']}", "X-Jobgate-Trigger": "gitlab/sweep#311"}
    submitted = api.client.post("/v1/jobs", json=job_spec(), headers=headers)
    assert submitted.status_code == 201, submitted.text
