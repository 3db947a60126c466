"""A policy directory below a dot-directory (~/.config/jobgate/policies, /srv/.deploy/policies) is hashed and
watched like any other. The hash and the watcher skipped every file with a dot in any part of its *absolute*
path, so such a set hashed to SHA-256 of nothing: every version had the same hash, a reload of an edited set
answered "unchanged" and the old set kept deciding, and the ledger could not tell versions apart."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from gateway_testkit import job_spec, start_api

from gateway.decisions.policy.loader import load_policy_set, policy_hash
from gateway.settings import REPO_POLICIES, Settings

EMPTY = hashlib.sha256(b"").hexdigest()


def hidden_copy(tmp_path: Path) -> Path:
    target = tmp_path / ".config" / "jobgate" / "policies"
    shutil.copytree(REPO_POLICIES, target)
    return target


def test_a_set_below_a_dot_directory_hashes_its_files(tmp_path: Path) -> None:
    policies = hidden_copy(tmp_path)
    before = policy_hash(policies)
    assert before != EMPTY
    data = policies / "data.json"
    data.write_text(data.read_text().replace('"jobs_per_batch": 50', '"jobs_per_batch": 5000'))
    assert policy_hash(policies) != before
    assert load_policy_set(policies).hash == policy_hash(policies)
    # Dot-files inside the set (an editor's swap file) still do not count.
    (policies / ".matrix.csv.swp").write_text("x")
    assert policy_hash(policies) == load_policy_set(policies).hash


def test_an_edit_below_a_dot_directory_is_reloaded_and_decides(tmp_path: Path) -> None:
    policies = hidden_copy(tmp_path)
    settings = Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_watch_interval_s=0)
    for api in start_api(settings):
        old = api.get("/v1/policy", "sam").json()["policy_hash"]
        matrix = policies / "matrix.csv"
        matrix.write_text(matrix.read_text() + "# reviewed by sam\n")
        r = api.post("/v1/policy/reload", "sam")
        assert r.status_code == 200, r.text
        assert r.json()["attempt"]["result"] == "loaded" and r.json()["policy_hash"] != old
        # The ledger tells the versions apart: the next decision names the new one.
        job = api.post("/v1/jobs", "alice", json=job_spec()).json()
        refused = api.post(f"/v1/jobs/{job['id']}/stop", "mallory", json={"reason": "not mine"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["policy_hash"] == r.json()["policy_hash"]


def test_the_watcher_sees_an_edit_below_a_dot_directory(tmp_path: Path) -> None:
    policies = hidden_copy(tmp_path)
    settings = Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_watch_interval_s=0)
    for api in start_api(settings):
        reloader = api.client.app.state.policy_reloader
        (policies / "matrix.csv").write_text((policies / "matrix.csv").read_text() + "# reviewed\n")
        assert reloader.poll_once() is None  # the edit settles for one look
        attempt = reloader.poll_once()
        assert attempt is not None and attempt.result == "loaded"
