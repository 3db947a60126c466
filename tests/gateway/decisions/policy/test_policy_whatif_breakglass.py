"""`jobgate policy whatif` replays a break-glass call as the gateway decided it (pipeline.decide): the grant
stands in for one second person only. The replay turned every needs_approval of a break-glass call into an
allow, so a request the gateway held for two more people showed as a flip to allow under an unchanged set,
and a candidate set that asks a break-glass call for a second approver showed no flip at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from gateway_testkit import Api, job_spec, start_api

from gateway.cli.main import cli
from gateway.settings import REPO_POLICIES, Settings
from gateway.store.models import Job

GRANT = {"projects": ["vision"], "actions": ["job.stop"], "duration_minutes": 30, "max_uses": 2,
         "reason": "node 7 wedged, stopping jobs by hand", "ticket": "INC-4242"}


def running_job(api: Api, *, external_rights: bool) -> str:
    job_id = api.post("/v1/jobs", "alice", json=job_spec()).json()["id"]
    with api.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state, job.external_rights = "running", external_rights
        job.placement = [{"node": "demo-node-1", "gpus": [0, 1]}]
    return job_id


def break_glass_stops(data_dir: Path) -> dict[str, Any]:
    """Two stops of alice's jobs with one break-glass credential: a plain job (the grant stands in for the one
    second person: allow) and an external-rights job (two more people needed: it waits). Their decisions."""
    decisions: dict[str, Any] = {}
    for api in start_api(Settings(data_dir=data_dir, policy_watch_interval_s=0)):
        r = api.post("/v1/break-glass", "dave", json=GRANT)
        assert r.status_code == 201, r.text
        headers = {"Authorization": f"Bearer {r.json()['credential']}"}
        for name, external in (("plain", False), ("external", True)):
            stop = api.client.post(f"/v1/jobs/{running_job(api, external_rights=external)}/stop",
                                   json={"reason": "break-glass stop of a wedged job"}, headers=headers)
            assert stop.status_code == 202, stop.text
            decisions[name] = stop.json()["decision"]
    return decisions


def whatif(candidate: Path, data_dir: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["policy", "whatif", "--policies", str(candidate), "--data-dir", str(data_dir),
                                      "--json"])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


def test_an_unchanged_set_replays_a_break_glass_call_that_waited_as_waiting(tmp_path: Path) -> None:
    data = tmp_path / "var"
    decisions = break_glass_stops(data)
    assert decisions["plain"]["effect"] == "allow"
    assert decisions["external"]["effect"] == "needs_approval" and decisions["external"]["approvals_required"][
        "count"] == 2
    report = whatif(REPO_POLICIES, data)
    assert report["flips"] == [], report["flips"]


def test_a_candidate_needing_two_people_shows_the_break_glass_allow_flip_to_waiting(tmp_path: Path) -> None:
    data = tmp_path / "var"
    break_glass_stops(data)
    candidate = tmp_path / "candidate"
    shutil.copytree(REPO_POLICIES, candidate)
    data_json = candidate / "data.json"
    data_json.write_text(data_json.read_text().replace('"confirmations": {"job": 1,', '"confirmations": {"job": 2,'))
    report = whatif(candidate, data)
    kinds = {(f["actor"], f["action"], f["kind"]) for f in report["flips"]}
    # The gateway would now hold the plain stop for a second approver the grant cannot stand in for.
    assert ("dave", "job.stop", "allow→needs_approval") in kinds, report["flips"]
