"""A model.conf that would not decide as written is refused. Decisions never run the Casbin matcher (an index of
the matrix answers), so a reviewer's `&& r.dom != "speech"` (nobody holds anything in project speech) loaded,
passed the set's tests, and was ignored: mallory, a researcher in speech, still submitted there."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_testkit import Api, job_spec, start_api

from gateway.decisions.policy.loader import load_policy_set
from gateway.settings import REPO_POLICIES, Settings


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, target)
    return target


@pytest.fixture
def api(tmp_path: Path, policies: Path) -> Iterator[Api]:
    yield from start_api(Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_watch_interval_s=0))


def edit_matcher(policies: Path, extra: str) -> None:
    model = policies / "model.conf"
    model.write_text("\n".join(line + extra if line.startswith("m = ") else line
                               for line in model.read_text().splitlines()) + "\n")


def test_a_matcher_the_engine_would_ignore_is_refused_at_reload(api: Api, policies: Path) -> None:
    old = api.get("/v1/policy", "sam").json()["policy_hash"]
    edit_matcher(policies, ' && r.dom != "speech"')
    r = api.post("/v1/policy/reload", "sam")
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error.startswith("model.conf:23: the model refuses ") and "in project 'speech'" in error, error
    assert api.get("/v1/policy", "sam").json()["policy_hash"] == old


def test_a_matcher_that_grants_more_than_the_matrix_is_refused(policies: Path) -> None:
    edit_matcher(policies, ' || r.act == "ledger.read"')
    with pytest.raises(Exception, match=r"model.conf:23: the model grants ledger.read to "):
        load_policy_set(policies)


def test_the_shipped_model_rewritten_without_meaning_changes_loads(api: Api, policies: Path) -> None:
    model = policies / "model.conf"
    model.write_text(model.read_text().replace("m = (g(r.sub, p.sub, r.dom) || g(r.sub, p.sub, \"*\"))",
                                               "m = (g(r.sub, p.sub, \"*\") || g(r.sub, p.sub, r.dom))"))
    r = api.post("/v1/policy/reload", "sam")
    assert r.status_code == 200, r.text
    submitted = api.post("/v1/jobs", "mallory", json=job_spec(project="speech"))
    assert submitted.status_code == 201, submitted.text
