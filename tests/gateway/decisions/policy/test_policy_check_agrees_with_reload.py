"""`jobgate policy check` accepts exactly what the gateway's reload accepts. check compiled the set only, while
a reload also runs the set's own tests: a matrix edit that breaks a table case was "ok" by check and then
refused by the gateway."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from gateway_testkit import start_api

from gateway.settings import REPO_POLICIES, Settings


def jobgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "jobgate"), *args], capture_output=True, text=True,
                          timeout=120)


def test_check_refuses_the_set_the_reload_refuses_naming_the_same_cases(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    matrix = policies / "matrix.csv"
    matrix.write_text(matrix.read_text().replace("p, researcher, *, job.stop.own\n", ""))

    checked = jobgate("policy", "check", str(policies))
    assert checked.returncode == 1, checked.stdout
    assert "tests/matrix.yaml:" in checked.stdout and "'A4 owner stops own job' failed" in checked.stdout
    assert checked.stderr.strip().endswith("the set would be refused")

    shutil.copytree(REPO_POLICIES, tmp_path / "live")
    for api in start_api(Settings(data_dir=tmp_path / "var", policies_dir=tmp_path / "live",
                                  policy_watch_interval_s=0)):
        shutil.copy(matrix, tmp_path / "live" / "matrix.csv")
        r = api.post("/v1/policy/reload", "sam")
        assert r.status_code == 422, r.text
        assert sorted(r.json()["errors"]) == sorted(checked.stdout.splitlines())


def test_check_still_says_ok_to_the_shipped_set() -> None:
    checked = jobgate("policy", "check", str(REPO_POLICIES))
    assert checked.returncode == 0 and checked.stdout.startswith("ok "), checked.stdout + checked.stderr
