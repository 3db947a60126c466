"""One job's whole life through the real system: submit, refuse, stop gracefully, audit, detect tampering."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import stat
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from e2e_testkit import JOBGATE, System, wait_for
from job_host import JOB_PYTHON

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# Training-like code: announce progress, and on SIGTERM write a checkpoint, then exit cleanly.
CHECKPOINTING_JOB = """
import os, pathlib, signal, sys, time
ckpt = pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DIR"]) / "step-final.ckpt"
def on_term(signum, frame):
    ckpt.write_bytes(b"weights:" + os.environ["CUDA_VISIBLE_DEVICES"].encode())
    print("checkpoint written", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("training on GPUs", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
while True:
    time.sleep(0.05)
"""


def test_submit_refuse_stop_audit_and_tamper(demo_system: System, tmp_path: Path) -> None:
    sysd = demo_system
    assert stat.S_IMODE(os.stat(sysd.data_dir / "demo-tokens.json").st_mode) == 0o600
    script = tmp_path / "train.py"
    script.write_text(CHECKPOINTING_JOB)

    # alice submits through the CLI, as a new user would.
    out = sysd.cli("alice", "job", "submit", "--name", "resnet", "--project", "vision", "--gpus", "2",
                   "--grace", "20", "--json", "--", JOB_PYTHON, str(script))
    job_id = json.loads(out.stdout)["id"]
    alice = sysd.client("alice")
    job = wait_for(lambda: (j := alice.get(f"/v1/jobs/{job_id}").json())["state"] == "running" and j, 30,
                   "the job to run on an agent")
    assert len(job["placement"]) == 1 and len(job["placement"][0]["gpus"]) == 2

    # mallory (another tenant) may not stop it: 403 with the reason, and the denial is ledgered.
    r = sysd.client("mallory").post(f"/v1/jobs/{job_id}/stop", json={"reason": "I need the GPUs"})
    assert r.status_code == 403, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    denial_seq = r.json()["ledger_seq"]
    assert r.json()["reasons"]
    entry = sysd.client("audrey").get("/v1/ledger/entries", params={"start": denial_seq, "limit": 1}).json()
    denial = entry["entries"][0]["entry"]
    assert denial["body"]["decision"]["effect"] == "deny"
    assert denial["body"]["actor"]["id"] == "mallory"
    assert denial["body"]["input"]["targets"][0]["id"] == job_id
    assert alice.get(f"/v1/jobs/{job_id}").json()["state"] == "running"

    # alice stops it through the CLI: graceful, with the checkpoint as evidence.
    out = sysd.cli("alice", "job", "stop", job_id, "--reason", "done for today", "--wait", "30", "--json")
    stopped = json.loads(out.stdout)["job"]
    assert stopped["state"] == "stopped", stopped
    assert stopped["outcome"] == "graceful"
    (evidence,) = stopped["evidence"]["nodes"].values()
    assert evidence["outcome"] == "graceful" and evidence["exit_code"] == 0
    assert evidence["process_group_gone"] is True
    (ckpt,) = evidence["checkpoints"]
    assert ckpt["path"].endswith("step-final.ckpt")
    gpus = ",".join(str(g) for g in job["placement"][0]["gpus"])
    assert ckpt["sha256"] == hashlib.sha256(b"weights:" + gpus.encode()).hexdigest()
    assert [h["to"] for h in stopped["history"]][-3:] == ["stop_requested", "stopping", "stopped"]

    # The ledger verifies while the system runs, and again after it stopped.
    verify = sysd.cli("audrey", "ledger", "verify", "--data-dir", str(sysd.data_dir))
    assert verify.stdout.startswith("OK"), verify.stdout
    assert len(verify.stdout.strip().splitlines()) == 1
    sysd.stop()

    # Someone with the database file drops the append-only trigger and changes one byte of one entry:
    # verify fails and names that seq.
    db = sqlite3.connect(sysd.data_dir / "ledger.db")
    db.execute("DROP TRIGGER ledger_entries_no_update")
    seq, data = db.execute("SELECT seq, data FROM ledger_entries WHERE seq = ?", (denial_seq,)).fetchone()
    tampered = bytearray(data)
    i = bytes(tampered).index(b"deny")
    tampered[i] = ord("D")
    db.execute("UPDATE ledger_entries SET data = ? WHERE seq = ?", (bytes(tampered), seq))
    db.commit()
    db.close()
    bad = subprocess.run([*JOBGATE, "ledger", "verify", "--data-dir", str(sysd.data_dir)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert f"seq {seq}" in bad.stdout + bad.stderr, bad.stdout + bad.stderr


def test_the_system_shuts_down_cleanly_while_agents_long_poll(demo_system: System, tmp_path: Path) -> None:
    """SIGTERM (or Ctrl-C) ends `jobgate up` with its agents: long polls are released at once instead of
    being cancelled after the graceful timeout, which printed an ASGI traceback on every shutdown."""
    token = (demo_system.data_dir / "agents" / "demo-node-1" / "state" / "token").read_text().strip()
    answers: list[int] = []

    def poll() -> None:  # one more long poll, certain to be waiting when the signal comes
        r = httpx.get(f"{demo_system.url}/v1/agents/demo-node-1/commands", params={"wait": 30},
                      headers={"Authorization": f"Bearer {token}"}, timeout=60)
        answers.append(r.status_code)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1)
    demo_system.proc.send_signal(signal.SIGTERM)
    assert demo_system.proc.wait(timeout=30) == 0
    poller.join(30)
    assert answers == [200]
    log = (tmp_path / "gateway.log").read_text()
    assert "Traceback" not in log and "CancelledError" not in log, log


def test_stopping_the_demo_says_which_jobs_keep_running(demo_system: System, tmp_path: Path) -> None:
    """Ctrl-C on `jobgate up --demo` ends the gateway and its agents but not their jobs' processes (on purpose:
    an agent restart must not kill training). It used to end in silence, leaving them running unseen."""
    out = demo_system.cli("alice", "job", "submit", "--name", "sleeper", "--project", "vision", "--gpus", "1",
                          "--json", "--", JOB_PYTHON, "-c", "import time; time.sleep(600)")
    job_id = json.loads(out.stdout)["id"]
    alice = demo_system.client("alice")
    wait_for(lambda: alice.get(f"/v1/jobs/{job_id}").json()["state"] == "running", 30, "the job to run")
    demo_system.proc.send_signal(signal.SIGINT)
    assert demo_system.proc.wait(timeout=30) == 0
    log = (tmp_path / "gateway.log").read_text()
    assert f"1 job(s) still running on the demo nodes ({job_id})" in log, log
    assert f"jobgate up --demo --data-dir {demo_system.data_dir}" in log
