"""End to end (Q5, Q8, P2, P4, Q9): an urgent job preempts a *borrowed* job that runs as a real process on a
real node agent; the victim checkpoints in its grace window, goes back to the queue, and is resumed from
its checkpoint once the urgent job is done."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from e2e_testkit import System, wait_for
from job_host import JOB_PYTHON

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# Resumes from its checkpoint if there is one; checkpoints and exits 0 on SIGTERM.
RESUMABLE_JOB = """
import os, pathlib, signal, sys, time
ckpt = pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DIR"]) / "last.ckpt"
step = int(ckpt.read_text()) if ckpt.exists() else 0
print(("resumed from checkpoint at step %d" % step) if step else "fresh start", flush=True)
def on_term(signum, frame):
    ckpt.write_text(str(step))
    print("checkpoint written at step", step, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True:
    step += 1
    time.sleep(0.05)
"""

SHORT_URGENT_JOB = "import time; time.sleep(2)"

# No minimum runtime, so the test need not wait ten minutes before a preemption is allowed.
CONFIG = "min_runtime_s: {urgent: 0, normal: 0, batch: 0}\n"


@pytest.fixture
def sched_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "scheduler.yaml"
    path.write_text(CONFIG)
    monkeypatch.setenv("JOBGATE_SCHEDULER_CONFIG", str(path))
    return path


def set_quotas(data_dir: Path) -> None:
    """Setup only: the demo cast has a single platform admin, so the A7 two-person path (tested in
    tests/gateway/native/test_sched_api.py) cannot complete here; the rows are written as it would write them."""
    now = datetime.now(UTC).isoformat()
    with sqlite3.connect(data_dir / "jobgate.db") as db:
        for project, gpus, borrow in (("vision", 8, 0), ("speech", 8, 8)):
            db.execute("INSERT INTO quotas (project, gpus, borrow_limit, lend_limit, users, updated_at, updated_by)"
                       " VALUES (?, ?, ?, NULL, '{}', ?, 'erin')", (project, gpus, borrow, now))


def test_urgent_job_preempts_a_borrowed_job_which_checkpoints_and_resumes(
        sched_config: Path, demo_system: System, tmp_path: Path) -> None:
    sysd = demo_system
    set_quotas(sysd.data_dir)
    script = tmp_path / "train.py"
    script.write_text(RESUMABLE_JOB)
    # carol is vision's queue admin: the urgent queue preempts, so it is hers to use, not every member's.
    mallory, carol = sysd.client("mallory"), sysd.client("carol")

    def submit(client, **spec) -> str:  # type: ignore[no-untyped-def]
        r = client.post("/v1/jobs", json={"command": [JOB_PYTHON, str(script)], "grace_seconds": 20, **spec})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def state(client, job_id: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
        return dict(client.get(f"/v1/jobs/{job_id}").json())

    own = submit(mallory, name="own", project="speech", gpus_per_node=8)
    wait_for(lambda: state(mallory, own)["state"] == "running", 30, "speech's owned job to run")
    lent = submit(mallory, name="lent", project="speech", gpus_per_node=8)
    running = wait_for(lambda: (j := state(mallory, lent))["state"] == "running" and j, 30, "the borrowed job")
    assert {p["quota"] for p in running["placement"]} == {"borrowed"}
    node = running["placement"][0]["node"]
    log = sysd.data_dir / "agents" / node / "jobs" / lent / "output.log"

    r = carol.post("/v1/jobs", json={"name": "urgent-eval", "project": "vision", "queue": "urgent",
                                     "gpus_per_node": 8, "command": [JOB_PYTHON, "-c", SHORT_URGENT_JOB]})
    assert r.status_code == 201, r.text
    urgent = r.json()["id"]

    # The borrowed job is preempted gracefully and goes back to the queue with its checkpoint recorded.
    requeued = wait_for(lambda: (j := state(mallory, lent))["state"] == "pending"
                        and j.get("evidence", {}).get("last_preemption") and j, 60, "the victim to be requeued")
    ev = requeued["evidence"]["last_preemption"]
    assert ev["outcome"] == "graceful"
    (node_ev,) = ev["nodes"].values()
    assert any(c["path"].endswith("last.ckpt") for c in node_ev["checkpoints"])
    assert state(mallory, own)["state"] == "running"  # the owned job was not touched
    urgent_job = wait_for(lambda: (j := state(carol, urgent))["state"] in ("running", "succeeded") and j, 30,
                          "the urgent job to start")
    assert urgent_job["placement"][0]["node"] == node

    # Explained to its owner, notified, counted.
    why = json.loads(sysd.cli("mallory", "job", "why", lent, "--json").stdout)
    assert why["preemptions"] == 1 and "compensation" in [h["basis"] for h in why["priority_history"]]
    stats = json.loads(sysd.cli("erin", "stats", "preemptions", "--by", "tenant", "--quarter", "--json").stdout)
    assert [(r["tenant"], r["count"]) for r in stats["rows"]] == [("speech", 1)]
    text = sysd.cli("mallory", "job", "why", lent).stdout
    assert "preempted 1 time(s)" in text
    queue = sysd.cli("mallory", "queue").stdout
    assert queue.startswith("cluster: ") and "of 16 GPUs in use" in queue and "speech: 8 owned" in queue
    quotas = json.loads(sysd.cli("erin", "quota", "list", "--json").stdout)
    assert {q["project"]: q["in_use"]["owned"] for q in quotas["quotas"]}["speech"] == 8
    asked = sysd.cli("erin", "quota", "set", "vision", "--gpus", "16", "--reason", "new cards arrived")
    assert "needs a second platform admin: approval apr-" in asked.stdout
    refused = sysd.cli("alice", "quota", "set", "vision", "--gpus", "64", "--reason", "more", check=False)
    assert refused.returncode == 1 and refused.stderr.startswith("Error: 403")

    # Once the urgent job is done, the victim starts again on the same node and resumes from its checkpoint.
    wait_for(lambda: state(carol, urgent)["state"] == "succeeded", 60, "the urgent job to finish")
    wait_for(lambda: state(mallory, lent)["state"] == "running", 60, "the victim to be resumed")
    wait_for(lambda: "resumed from checkpoint at step" in log.read_text(), 30, "the resumed process to say so")
