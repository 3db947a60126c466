"""Emergency stop of a whole environment through four real agents: two people decide, every job accounted for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from stop_testkit import Cluster, start_cluster, submit, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

JOBGATE = [sys.executable, "-m", "gateway.cli"]


@pytest.fixture
def four_nodes(tmp_path: Path) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path / "var", nodes=4, gpus=12, prefix="es")
    try:
        yield cluster
    finally:
        cluster.stop()


def cli(cluster: Cluster, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JOBGATE_URL": cluster.url, "JOBGATE_TOKEN": cluster.tokens[who]}
    return subprocess.run([*JOBGATE, *args], env=env, capture_output=True, text=True, timeout=120)


def test_emergency_stop_of_an_environment_accounts_for_all_40_jobs(four_nodes: Cluster) -> None:
    alice, bob = four_nodes.client("alice"), four_nodes.client("bob")
    prod = [submit(alice if i % 2 else bob, f"prod-{i}", ["sleep", "1000"], environment="production",
                   grace_seconds=30) for i in range(40)]
    research = [submit(alice, f"research-{i}", ["sleep", "1000"]) for i in range(2)]
    blind = submit(alice, "untouchable", ["sleep", "1000"], environment="production", stoppable=False)
    wait_for(lambda: all(four_nodes.job(j)["state"] == "running" for j in [*prod, *research, blind]), 60,
             "43 jobs to run")
    assert len({four_nodes.job(j)["placement"][0]["node"] for j in prod}) == 4

    # A researcher cannot stop an environment; the on-call engineer can ask, and must wait for security.
    body = {"scope": {"kind": "environment", "value": "production"}, "trigger": "safety",
            "reason": "model emits unsafe content in production", "grace_seconds": 0}
    refused = alice.post("/v1/emergency-stops", json=body)
    assert refused.status_code == 403, refused.text
    dave, sam = four_nodes.client("dave"), four_nodes.client("sam")
    r = dave.post("/v1/emergency-stops", json=body)
    assert r.status_code == 202, r.text
    es = r.json()
    assert es["state"] == "pending_approval" and es["approval_id"] and es["summary"]["targets"] == 40
    assert es["blind_spots"] == [{"job_id": blind, "reason": "tracked but declared not stoppable (R5)",
                                  "state": "running"}]
    assert es["decision"]["approvals_required"]["roles"] == ["security_reviewer"]
    # The requester cannot be the second person.
    assert dave.post(f"/v1/approvals/{es['approval_id']}/approve", json={}).status_code == 403
    assert all(four_nodes.job(j)["state"] == "running" for j in prod)

    approved = sam.post(f"/v1/approvals/{es['approval_id']}/approve", json={"comment": "confirmed, stop it"})
    assert approved.status_code == 200, approved.text
    assert approved.json()["state"] == "executed"

    def finished() -> dict[str, object] | None:
        got = dave.get(f"/v1/emergency-stops/{es['id']}").json()
        return got if got["state"] == "done" else None

    done = wait_for(finished, 60, "every target to be accounted for", interval=0.3)
    summary = done["summary"]
    assert summary["targets"] == summary["accounted_for"] == 40
    assert summary["stopped_graceful"] + summary["stopped_forced"] == 40
    assert summary["stop_failed"] == summary["unreachable"] == summary["in_progress"] == 0
    assert done["deciders"] == ["dave", "sam"] and done["trigger"] == "safety"
    for job in done["jobs"]:
        assert job["state"] == "stopped" and job["process_groups_gone"] is True
        assert job["stop_latency_s"] is not None and job["stop_latency_s"] >= 0
    # Out of scope: untouched.
    assert all(four_nodes.job(j)["state"] == "running" for j in [*research, blind])
    assert sum(n["gpus_used"] for n in dave.get("/v1/nodes").json()["nodes"]) == 3

    # The ledger names the trigger and both people who decided (C6).
    ledger = four_nodes.gateway.ledger
    entries = [json.loads(e.raw) for e in ledger.entries(0, ledger.size())]
    mine = [e["body"] for e in entries if e["kind"] == "emergency" and e["body"]["emergency_id"] == es["id"]]
    assert mine[0]["trigger"] == "safety" and mine[0]["requested_by"] == "dave"
    assert mine[-1]["result"] == "executing" and mine[-1]["deciders"] == ["dave", "sam"]

    # The CLI shows the same, one line per job with --json off, and exits 0.
    shown = cli(four_nodes, "dave", "emergency-stop", "show", es["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["summary"]["accounted_for"] == 40
    table = cli(four_nodes, "sam", "emergency-stop", "show", es["id"])
    assert table.returncode == 0 and "stopped_graceful" in table.stdout
    assert "requested by dave; decided by dave, sam" in table.stdout
    assert re.search(r"stopped_graceful +\S+ +\S+ +\d+\.\d\d +\S", table.stdout), table.stdout  # latency, s
