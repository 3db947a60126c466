"""A data.json key that nothing reads is refused at load with its line: a reviewer tightening the per-principal
rate limit wrote `calls_per_minute_per_principle: 2`; the set loaded, the misspelt key was read by nobody and
the limit stayed at its default of 60 calls a minute."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from gateway_testkit import start_api

from gateway.decisions.policy.loader import load_policy_set
from gateway.settings import REPO_POLICIES, Settings


def misspell_the_principal_limit(policies: Path) -> None:
    data = policies / "data.json"
    data.write_text(data.read_text().replace('"calls_per_minute_per_principal": 60',
                                             '"calls_per_minute_per_principle": 2'))


def test_check_and_reload_refuse_a_misspelt_limit_naming_its_line(tmp_path: Path) -> None:
    live = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, live)
    for api in start_api(Settings(data_dir=tmp_path / "var", policies_dir=live, policy_watch_interval_s=0)):
        misspell_the_principal_limit(live)
        checked = subprocess.run([str(Path(sys.executable).parent / "jobgate"), "policy", "check", str(live)],
                                 capture_output=True, text=True, timeout=120)
        expected = "data.json:3: limits.calls_per_minute_per_principle is read by neither the gateway nor any Rego"
        assert checked.returncode == 1 and checked.stdout.startswith(expected), checked.stdout
        r = api.post("/v1/policy/reload", "sam")
        assert r.status_code == 422, r.text
        assert [e.startswith(expected) for e in r.json()["errors"]] == [True], r.json()["errors"]
        assert api.gateway.limiter is not None and api.gateway.limiter.per_principal == 60


def test_keys_a_rego_module_reads_and_the_gateways_own_are_accepted(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, policies)
    data = json.loads((policies / "data.json").read_text())
    data["limits"]["max_nodes"] = 4  # read by a rule below
    data["contribution"]["dora"] = 5
    data["about"]["max_nodes"] = "most nodes one job may span"
    (policies / "data.json").write_text(json.dumps(data, indent=1))
    guards = policies / "guards.rego"
    guards.write_text(guards.read_text() + '\ndenials contains {"rule": "T.nodes", "reason": "too many nodes"} if {\n'
                      '\tinput.params.nodes > data.limits.max_nodes\n}\n')
    assert load_policy_set(policies).data["limits"]["max_nodes"] == 4
