"""Red team: the checkpoint retention of the important tier (P1) and the deletion recovery window (A6) are the
numbers in policies/data.json, and every ledger entry that states one states the configured one.

Both were code constants (14 and 7 days): a security reviewer who set them in the policy set changed nothing,
and the ledger promised the constants whatever the configuration said.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from gateway_testkit import Api, job_spec, start_api
from stop_helpers import FakeAgent, ledger, running_job, shift_clock, stopped_evidence

from gateway.decisions.policy.engine import RoleBinding
from gateway.jobs import lifecycle
from gateway.settings import REPO_POLICIES, Settings
from gateway.store.models import Job

CKPT = [{"path": "checkpoints/step-9.ckpt", "size": 7, "mtime": 1.0, "sha256": "ab" * 32}]
IMPORTANT_DAYS, RECOVERY_DAYS = 3, 2
DAY = 86400.0


@pytest.fixture
def capi(settings: Settings, tmp_path: Path) -> Iterator[Api]:
    """The demo gateway with a policy set that keeps important checkpoints 3 days and deleted jobs 2 days."""
    policies = tmp_path / "configured-policies"
    shutil.copytree(REPO_POLICIES, policies)
    data = json.loads((policies / "data.json").read_text())
    data["retention"] = {"important_days": IMPORTANT_DAYS}
    data["deletion"] = {"recovery_window_days": RECOVERY_DAYS}
    (policies / "data.json").write_text(json.dumps(data, indent=2))
    settings = settings.model_copy(update={"policies_dir": policies, "policy_watch_interval_s": 0})
    yield from start_api(settings)


@pytest.fixture
def agent(capi: Api) -> FakeAgent:
    a = FakeAgent(capi, "demo-node-1")
    a.beat()
    a.take()
    return a


def _stop_with_checkpoint(api: Api, agent: FakeAgent, job_id: str) -> None:
    assert api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"}).status_code == 202
    (stop,) = [c for c in agent.take() if c["kind"] == "stop" and c["job_id"] == job_id]
    agent.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=CKPT))


def _cleanups(agent: FakeAgent) -> list[str]:
    return [c["job_id"] for c in agent.take() if c["kind"] == "delete_artifacts"]


def test_a_pause_states_the_configured_retention(capi: Api) -> None:
    job_id = capi.post("/v1/jobs", "alice", json=job_spec(labels={"retention": "important"})).json()["id"]
    with capi.gateway.db.transaction() as s:
        job = s.get(Job, job_id)
        job.state, job.placement = "running", [{"node": "demo-node-1", "gpus": [0, 1]}]
    assert capi.post(f"/v1/jobs/{job_id}/pause", "dave", json={"reason": "maintenance"}).status_code == 202
    (pause,) = [
        e["body"] for e in ledger(capi) if e["kind"] == "decision" and e["body"]["input"]["action"] == "job.pause"
    ]
    assert pause["input"]["params"]["checkpoint_retention"] == {
        "tier": "important",
        "keep": f"{IMPORTANT_DAYS} days after the job stops",
    }


def test_important_checkpoints_are_kept_the_configured_days(capi: Api, agent: FakeAgent) -> None:
    first, _ = running_job(capi, agent, labels={"retention": "important"})
    _stop_with_checkpoint(capi, agent, first)
    (kept,) = [e["body"] for e in ledger(capi) if e["kind"] == "retention" and e["body"]["job_id"] == first]
    kept_for = datetime.fromisoformat(kept["keep_until"]) - datetime.fromisoformat(kept["kept_since"])
    assert kept_for == timedelta(days=IMPORTANT_DAYS)
    shift_clock(capi, 1)
    running_job(capi, agent)  # the next job on its quota starts: not the important tier's rule
    shift_clock(capi, IMPORTANT_DAYS * DAY - 2)
    lifecycle.run_chores(capi.gateway)
    assert _cleanups(agent) == []
    shift_clock(capi, 2)
    lifecycle.run_chores(capi.gateway)
    assert _cleanups(agent) == [first]


def _delete(api: Api, job_id: str) -> dict[str, Any]:
    r = api.client.request("DELETE", f"/v1/jobs/{job_id}", headers=api.headers("alice"), json={"reason": "gone"})
    assert api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "carol").status_code == 200
    return dict(r.json())


def test_a_deletion_states_and_keeps_the_configured_recovery_window(capi: Api, agent: FakeAgent) -> None:
    capi.gateway.policy.grant(RoleBinding(principal="carol", role="queue_admin", project="acme"))
    job_id, _ = running_job(capi, agent)
    _stop_with_checkpoint(capi, agent, job_id)
    before = capi.gateway.clock()
    asked = _delete(capi, job_id)
    after = capi.gateway.clock()
    assert asked["recovery_window_s"] == RECOVERY_DAYS * DAY
    (entry,) = [
        e["body"]
        for e in ledger(capi)
        if e["kind"] == "transition" and e["body"].get("job_id") == job_id and e["body"]["state_after"] == "deleted"
    ]
    assert entry["recovery_window_s"] == RECOVERY_DAYS * DAY
    window = timedelta(days=RECOVERY_DAYS)
    assert before + window <= datetime.fromisoformat(entry["purge_after"]) <= after + window
    shift_clock(capi, RECOVERY_DAYS * DAY + 1)
    lifecycle.run_chores(capi.gateway)
    assert _cleanups(agent) == [job_id]
