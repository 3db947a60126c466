"""A set the reload refused does not become active when the gateway restarts. The reload refuses a set that
fails its own tests, and the previous set stays; but start-up only compiled the directory, so the next restart
(a deploy, a crash) made the refused set the one deciding, with nobody told."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gateway_testkit import job_spec, start_api

from gateway.bootstrap import open_gateway
from gateway.decisions.policy.errors import PolicyLoadError
from gateway.settings import REPO_POLICIES, Settings


def test_a_set_refused_at_reload_is_refused_at_the_next_start_too(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    settings = Settings(data_dir=tmp_path / "var", policies_dir=policies, policy_watch_interval_s=0)
    for api in start_api(settings):
        active = api.get("/v1/policy", "sam").json()["policy_hash"]
        matrix = policies / "matrix.csv"
        matrix.write_text(matrix.read_text().replace("p, researcher, *, job.stop.own\n", ""))
        r = api.post("/v1/policy/reload", "sam")
        assert r.status_code == 422, r.text
        refused = r.json()["policy_hash"]
    assert refused != active

    with pytest.raises(PolicyLoadError) as e:  # the server's start-up (create_app's lifespan opens the gateway)
        open_gateway(settings)
    assert any(str(p).startswith("tests/matrix.yaml:") for p in e.value.errors), e.value.errors

    started = subprocess.run([str(Path(sys.executable).parent / "jobgate"), "up", "--data-dir", str(settings.data_dir)],
                             env={**os.environ, "JOBGATE_POLICIES_DIR": str(policies)}, capture_output=True, text=True,
                             timeout=120)
    assert started.returncode != 0 and "tests/matrix.yaml:" in started.stderr, started.stderr


def test_the_shipped_set_still_starts(tmp_path: Path) -> None:
    for api in start_api(Settings(data_dir=tmp_path / "var", policy_watch_interval_s=0)):
        assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
