"""Stops through real node agents and real process groups: graceful, forced, agent killed mid-stop, bad commands."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
from job_host import JOB_PYTHON
from sqlalchemy import select
from stop_testkit import Cluster, start_cluster, submit, wait_for

from gateway.native.commands import wake_after_commit
from gateway.store.models import NodeCommand
from gateway.store.service_tables import Notification
from gateway.store.stop_tables import CommandAck
from nodeagent.protocol import Command, new_nonce, sign_command

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

CHECKPOINTING_JOB = """
import os, pathlib, signal, sys, time
def on_term(signum, frame):
    ckpt = pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DIR"], "final.ckpt")
    ckpt.write_bytes(b"weights-" + os.environ["JOBGATE_JOB_ID"].encode())
    print("checkpoint written", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("training", flush=True)
while True:
    time.sleep(0.05)
"""

STUBBORN_JOB = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path / "var", nodes=1, gpus=8, prefix="solo")
    try:
        yield cluster
    finally:
        cluster.stop()


def ledger_entries(cluster: Cluster) -> list[dict[str, Any]]:
    ledger = cluster.gateway.ledger
    return [json.loads(e.raw) for e in ledger.entries(0, ledger.size())]


def transitions_of(cluster: Cluster, job_id: str) -> list[str]:
    return [e["body"]["state_after"] for e in ledger_entries(cluster)
            if e["kind"] == "transition" and e["body"].get("job_id") == job_id]


def cli(cluster: Cluster, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JOBGATE_URL": cluster.url, "JOBGATE_TOKEN": cluster.tokens[who]}
    done = subprocess.run([sys.executable, "-m", "gateway.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def cli_may_fail(cluster: Cluster, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JOBGATE_URL": cluster.url, "JOBGATE_TOKEN": cluster.tokens[who]}
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def gpus_used(cluster: Cluster, node: str) -> int:
    nodes = cluster.client("dave").get("/v1/nodes").json()["nodes"]
    return int(next(n["gpus_used"] for n in nodes if n["id"] == node))


def script(tmp_path: Path, name: str, text: str) -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    return [JOB_PYTHON, str(path)]


def test_graceful_with_checkpoint_and_forced_after_window(one_node: Cluster, tmp_path: Path) -> None:
    alice = one_node.client("alice")
    good = submit(alice, "ckpt", script(tmp_path, "ckpt.py", CHECKPOINTING_JOB), grace_seconds=20)
    bad = submit(alice, "stubborn", script(tmp_path, "stubborn.py", STUBBORN_JOB), grace_seconds=1)
    for job_id in (good, bad):
        one_node.wait_state(job_id, ("running",))
        wait_for(lambda j=job_id: "training" in (one_node.work_dir("solo-1") / "jobs" / j / "output.log").read_text()
                 or "ignoring" in (one_node.work_dir("solo-1") / "jobs" / j / "output.log").read_text(),
                 10, "the job to install its signal handler")
    for job_id in (good, bad):
        r = alice.post(f"/v1/jobs/{job_id}/stop", json={"reason": "done for today"})
        assert r.status_code == 202, r.text

    stopped = one_node.wait_state(good, ("stopped",))
    assert stopped["outcome"] == "graceful"
    (ev,) = stopped["evidence"]["nodes"].values()
    assert ev["process_group_gone"] is True and ev["exit_code"] == 0
    (ckpt,) = ev["checkpoints"]
    assert ckpt["path"] == "checkpoints/final.ckpt"
    assert ckpt["sha256"] == hashlib.sha256(b"weights-" + good.encode()).hexdigest()
    assert ckpt["size"] == len(b"weights-" + good.encode())
    assert [h["to"] for h in stopped["history"]][-3:] == ["stop_requested", "stopping", "stopped"]
    # Every step of the state machine is in the ledger, not just the job's history (C3).
    assert transitions_of(one_node, good) == ["running", "stop_requested", "stopping", "stopped"]

    forced = one_node.wait_state(bad, ("stopped",))
    assert forced["outcome"] == "forced"
    (ev,) = forced["evidence"]["nodes"].values()
    assert ev["outcome"] == "forced" and ev["exit_signal"] == "SIGKILL" and ev["process_group_gone"] is True
    assert ev["signal_sent_at"] is not None and ev["exited_at"] - ev["signal_sent_at"] >= 1.0
    # Both stops released their GPUs only on that evidence.
    wait_for(lambda: gpus_used(one_node, "solo-1") == 0, 10, "GPUs to be released")


def test_agent_killed_mid_stop_escalates_then_reconciles(one_node: Cluster, tmp_path: Path) -> None:
    alice = one_node.client("alice")
    job_id = submit(alice, "stubborn", script(tmp_path, "stubborn.py", STUBBORN_JOB), grace_seconds=2)
    running = one_node.wait_state(job_id, ("running",))
    log = one_node.work_dir("solo-1") / "jobs" / job_id / "output.log"
    wait_for(lambda: "ignoring" in log.read_text(), 10, "the job to ignore SIGTERM")
    assert alice.post(f"/v1/jobs/{job_id}/stop", json={"reason": "free the node"}).status_code == 202
    one_node.wait_state(job_id, ("stopping",))
    one_node.kill_agent("solo-1")  # mid-stop: SIGTERM sent, the SIGKILL after the window never comes

    failed = one_node.wait_state(job_id, ("stop_failed",), timeout=30)
    assert "unreachable" in failed["state_reason"]
    assert one_node.nodes_state()["solo-1"] == "lost"
    # Escalated to a person: a notice for on-call, and the GPUs stay withheld.
    with one_node.gateway.db.transaction() as session:
        kinds = {(n.principal, n.kind) for n in session.scalars(select(Notification)).all()}
    assert ("dave", "stop_failed") in kinds and ("dave", "node_lost") in kinds
    assert gpus_used(one_node, "solo-1") == len(running["placement"][0]["gpus"])
    shown = cli(one_node, "dave", "nodes", "--json")
    (solo,) = [n for n in json.loads(shown.stdout)["nodes"] if n["id"] == "solo-1"]
    assert solo["state"] == "lost" and solo["gpus_withheld"] == 1 and solo["jobs"] == [job_id]
    table = cli(one_node, "dave", "nodes")
    assert "lost: solo-1" in table.stdout
    # No silent retry: nothing happens on its own while the node is away.
    time.sleep(1.0)
    assert one_node.job(job_id)["state"] == "stop_failed"

    one_node.start_agent("solo-1")  # adopts the still-running group, gets a reconcile that says: stop it
    done = one_node.wait_state(job_id, ("stopped",), timeout=40)
    assert done["outcome"] == "forced"
    (ev,) = done["evidence"]["nodes"].values()
    assert ev["process_group_gone"] is True
    assert transitions_of(one_node, job_id)[-4:] == ["stop_requested", "stopping", "stop_failed", "stopped"]
    reconciles = [e["body"] for e in ledger_entries(one_node)
                  if e["kind"] == "node" and e["body"].get("action") == "reconcile"]
    assert any(job_id in r["stop"] for r in reconciles), reconciles
    wait_for(lambda: gpus_used(one_node, "solo-1") == 0, 10, "GPUs to be released")


def _inject(cluster: Cluster, envelope: dict[str, str], nonce: str, job_id: str) -> None:
    from datetime import timedelta

    gw = cluster.gateway
    now = gw.clock()
    with gw.transaction() as session:
        session.add(NodeCommand(nonce=nonce, node="solo-1", job_id=job_id, kind="start", envelope=envelope,
                                created_at=now, expires_at=now + timedelta(minutes=5)))
        wake_after_commit(gw.bus, session, "solo-1")


def test_forged_and_replayed_commands_are_refused_and_reported(one_node: Cluster, tmp_path: Path) -> None:
    gw = one_node.gateway
    # Forged: a well-formed start command signed by some other key.
    forger = nacl.signing.SigningKey.generate()
    now = time.time()
    forged = Command(kind="start", node="solo-1", job_id="evil-1", nonce=new_nonce(), issued_at=now,
                     expires_at=now + 300, params={"argv": ["sleep", "1000"], "gpus": [0]})
    _inject(one_node, sign_command(forged, forger), forged.nonce, "evil-1")

    def reports(detail: str) -> list[dict[str, Any]]:
        return [e["body"] for e in ledger_entries(one_node)
                if e["kind"] == "agent_report" and str(e["body"].get("detail", "")).startswith(detail)]

    (refusal,) = wait_for(lambda: reports("forged"), 20, "the forged command to be reported")
    assert refusal["event"] == "rejected" and refusal["nonce"] is None  # an attacker's nonce is never echoed
    assert not (one_node.work_dir("solo-1") / "jobs" / "evil-1").exists()

    # Replayed: a genuine start command, obeyed once; the same envelope delivered again is refused.
    alice = one_node.client("alice")
    job_id = submit(alice, "once", ["sleep", "1000"])
    one_node.wait_state(job_id, ("running",))
    with gw.transaction() as session:
        cmd = session.scalars(select(NodeCommand).where(NodeCommand.job_id == job_id,
                                                        NodeCommand.kind == "start")).one()
        ack = session.get(CommandAck, cmd.nonce)
        assert ack is not None and ack.event == "started"
        session.delete(ack)  # as if the acknowledgement had been lost: the gateway hands it out again
        cmd.delivered_at = None
        wake_after_commit(gw.bus, session, "solo-1")
    (replay,) = wait_for(lambda: reports("replayed"), 20, "the replay to be reported")
    assert replay["nonce"] == cmd.nonce and replay["acknowledgement"] is True
    with gw.transaction() as session:
        assert session.get(CommandAck, cmd.nonce) is not None  # the refusal counts as delivery
    assert transitions_of(one_node, job_id).count("running") == 1
    log = (one_node.work_dir("solo-1") / "state" / "agent.log").read_text()
    assert "command rejected" in log and "forged" in log and "replayed" in log
    with gw.transaction() as session:
        alerts = [n.body for n in session.scalars(select(Notification).where(Notification.kind == "command_rejected"))]
    assert any("forged" in a["detail"] for a in alerts) and not any("replayed" in a["detail"] for a in alerts)


def test_forensics_bundle_of_a_stopped_job_verifies_offline(one_node: Cluster, tmp_path: Path) -> None:
    alice = one_node.client("alice")
    job_id = submit(alice, "ckpt", script(tmp_path, "ckpt.py", CHECKPOINTING_JOB), grace_seconds=20)
    one_node.wait_state(job_id, ("running",))
    log = one_node.work_dir("solo-1") / "jobs" / job_id / "output.log"
    wait_for(lambda: "training" in log.read_text(), 10, "the job to start training")
    alice.post(f"/v1/jobs/{job_id}/stop", json={"reason": "incident 7"})
    one_node.wait_state(job_id, ("stopped",))

    out = tmp_path / "case.bundle"
    assert cli_may_fail(one_node, "alice", "forensics", "export", "--job", job_id, "--out", str(out)).returncode == 1
    done = cli(one_node, "audrey", "forensics", "export", "--job", job_id, "--out", str(out), "--json")
    summary = json.loads(done.stdout)
    assert summary["jobs"] == [job_id] and out.stat().st_size == summary["bytes"]
    sections = summary["sections"]
    assert [x["name"] for x in sections] == ["queue_snapshots", "scheduler_job_events", "node_process_records",
                                             "checkpoint_integrity"]
    seqs = [x["seq"] for x in sections]
    assert seqs == sorted(seqs) and seqs[-1] == summary["to_seq"]  # frozen in F4 order, after the range

    lines = [json.loads(line.split(" ", 2)[2]) for line in out.read_text().splitlines()[1:]
             if line[:1].isdigit()]
    assert lines[0]["seq"] == summary["from_seq"] and lines[-1]["kind"] == "forensics"
    blobs = {json.loads(line)["blob"]: json.loads(line)["data"] for line in out.read_text().splitlines()
             if line.startswith('{"blob"')}
    integrity_digest = lines[-1]["blobs"]["checkpoint_integrity"]
    import base64

    integrity = json.loads(base64.b64decode(blobs[integrity_digest.removeprefix("sha256:")]
                                            if integrity_digest.removeprefix("sha256:") in blobs
                                            else blobs[integrity_digest]))
    assert integrity[job_id]["db_matches_ledger"] is True
    assert integrity[job_id]["checkpoints"][0]["path"] == "checkpoints/final.ckpt"

    vkey = one_node.data_dir / "keys" / "ledger.vkey"
    verified = subprocess.run([sys.executable, "-m", "gateway.cli", "ledger", "verify", "--bundle", str(out),
                               "--public-key", str(vkey)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and verified.stdout.startswith("OK"), verified.stdout + verified.stderr
    # One flipped byte in the frozen evidence and the bundle no longer verifies.
    raw = bytearray(out.read_bytes())
    at = raw.index(b'"node_process_records"')
    raw[at + 1] = ord("N")
    (tmp_path / "tampered.bundle").write_bytes(bytes(raw))
    bad = subprocess.run([sys.executable, "-m", "gateway.cli", "ledger", "verify", "--bundle",
                          str(tmp_path / "tampered.bundle"), "--public-key", str(vkey)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0


def test_cli_emergency_stop_of_one_job_watches_until_done(one_node: Cluster) -> None:
    job_id = submit(one_node.client("alice"), "sleepy", ["sleep", "1000"])
    one_node.wait_state(job_id, ("running",))
    bad = cli_may_fail(one_node, "dave", "emergency-stop", "create", "--scope", "galaxy=far", "--concern", "safety",
                       "--reason", "x y z")
    assert bad.returncode != 0 and bad.stderr.startswith("Error: ") and "Traceback" not in bad.stderr
    done = cli(one_node, "dave", "emergency-stop", "create", "--scope", f"job={job_id}", "--concern", "safety",
               "--reason", "runaway job writes to production storage", "--grace", "0", "--watch", "--json")
    es = json.loads(done.stdout)
    assert es["state"] == "done" and es["summary"]["accounted_for"] == 1 and es["deciders"] == ["dave"]
    assert one_node.job(job_id)["state"] == "stopped"
    listed = cli(one_node, "audrey", "emergency-stop", "list")
    assert es["id"] in listed.stdout


GANG_MEMBER = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("training", flush=True)
first = "gang-1" in os.environ["JOBGATE_CHECKPOINT_DIR"]
while True:
    if first and pathlib.Path(sys.argv[1]).exists():
        print("lost its rank", flush=True)
        sys.exit(3)
    time.sleep(0.05)
"""


def test_a_failed_gang_member_gets_the_other_stopped_by_its_agent(tmp_path: Path) -> None:
    """Q6 through real agents and processes: one member of a two-node gang exits 3; the system stops the other
    member, whose process ends on SIGTERM, and the job ends failed with exit code 3, every GPU released."""
    cluster = start_cluster(tmp_path / "var", nodes=2, gpus=8, prefix="gang")
    try:
        trigger = tmp_path / "fail-now"
        alice = cluster.client("alice")
        gang = submit(alice, "gang", [*script(tmp_path, "member.py", GANG_MEMBER), str(trigger)],
                      gpus_per_node=8, nodes=2)
        cluster.wait_state(gang, ("running",))
        trigger.touch()
        failed = cluster.wait_state(gang, ("failed",))
        assert failed["exit_code"] == 3
        assert failed["evidence"]["nodes"]["gang-2"]["process_group_gone"] is True
        assert transitions_of(cluster, gang) == ["running", "stop_requested", "stopping", "failed"]
        stops = [e["body"] for e in ledger_entries(cluster)
                 if e["kind"] == "decision" and e["body"]["input"]["action"] == "job.stop"]
        assert [s["decision"]["rules"] for s in stops] == [["Q6.gang_member_failed"]]
        wait_for(lambda: gpus_used(cluster, "gang-1") == gpus_used(cluster, "gang-2") == 0, 10, "GPUs released")
    finally:
        cluster.stop()


def test_an_emergency_stop_cuts_short_a_graceful_stop_in_progress(one_node: Cluster, tmp_path: Path) -> None:
    """C2 through a real agent: a job that ignores SIGTERM, stopping with an hour's window, is killed within
    seconds of an emergency stop with window 0, and the stop that was in progress is the one that ends."""
    alice, dave = one_node.client("alice"), one_node.client("dave")
    j = submit(alice, "stubborn", script(tmp_path, "stubborn.py", STUBBORN_JOB), grace_seconds=3600)
    one_node.wait_state(j, ("running",))
    wait_for(lambda: "ignoring" in (one_node.work_dir("solo-1") / "jobs" / j / "output.log").read_text(), 10,
             "the job to ignore SIGTERM")
    assert alice.post(f"/v1/jobs/{j}/stop", json={"reason": "done for today"}).status_code == 202
    one_node.wait_state(j, ("stopping",))
    es = dave.post("/v1/emergency-stops", json={"scope": {"kind": "job", "value": j}, "trigger": "security",
                                                 "reason": "leaked credentials", "grace_seconds": 0})
    assert es.status_code == 201, es.text
    done = one_node.wait_state(j, ("stopped",), timeout=30)
    assert done["outcome"] == "forced" and done["stop_request"]["emergency_id"] == es.json()["id"]
    (ev,) = done["evidence"]["nodes"].values()
    assert ev["exit_signal"] == "SIGKILL" and ev["process_group_gone"] is True


# A job that floods the gateway from inside the node: eight threads of requests, with and without the node's
# token (which it cannot read: it tries the agent's state dir and falls back to a guess), as fast as it can.
FLOODING_JOB = """
import json, os, signal, sys, threading, urllib.request
url, work = os.environ["GATEWAY"], os.environ["WORK"]
try:
    token = open(work + "/state/token").read().strip()
except OSError:
    token = "jg_guessed"
def flood(path):
    while True:
        req = urllib.request.Request(url + path, headers={"Authorization": "Bearer " + token})
        try:
            urllib.request.urlopen(req, timeout=5).read()
        except Exception:
            pass
for path in ("/healthz", "/v1/jobs", "/v1/agents/solo-1/commands?wait=0", "/v1/nodes") * 2:
    threading.Thread(target=flood, args=(path,), daemon=True).start()
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("flooding", flush=True)
signal.pause()
"""


def test_a_stop_reaches_the_agent_while_its_job_floods_the_gateway(one_node: Cluster, tmp_path: Path) -> None:
    """H1: a job cannot keep its stop from arriving by flooding the gateway from its node: the agents' long polls
    wait in a pool of their own, and the job cannot speak for the node."""
    alice = one_node.client("alice")
    env = {"GATEWAY": one_node.url, "WORK": str(one_node.work_dir("solo-1"))}
    job_id = submit(alice, "flood", script(tmp_path, "flood.py", FLOODING_JOB), grace_seconds=5, env=env)
    one_node.wait_state(job_id, ("running",))
    log = one_node.work_dir("solo-1") / "jobs" / job_id / "output.log"
    wait_for(lambda: "flooding" in log.read_text(), 20, "the flood to start")
    assert alice.post(f"/v1/jobs/{job_id}/stop", json={"reason": "enough"}).status_code == 202
    stopped = one_node.wait_state(job_id, ("stopped",), timeout=60)
    (ev,) = stopped["evidence"]["nodes"].values()
    assert stopped["outcome"] == "graceful" and ev["process_group_gone"] is True
