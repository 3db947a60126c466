"""jobgate in front of a real Slurm cluster (gateway/execution/slurm/execution.py, poll.py): the README's walk-through
on the Slurm backend, jobgate's preemption for an urgent gang (its victims signalled, then requeued keeping their
priority), an emergency stop of an environment, and Slurm down: mutations refused, nothing half-done, caught up
when it returns.

One gateway on the session's cluster for the module (its Slurm loop driven by the tests, one cycle at a time, as
the in-process executor's run() is); each test leaves the cluster and the gateway with nothing running."""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from gateway_testkit import Api, assert_problem, job_spec, ledger_entries, start_api
from slurm_testkit import LocalCluster

from gateway.bootstrap import slurm_execution
from gateway.cli.queue import describe_why
from gateway.cli.up import up
from gateway.execution.slurm.execution import SlurmExecution
from gateway.execution.slurm.poll import SlurmLoop
from gateway.settings import Settings
from gateway.store.scheduler_tables import SchedJob
from gateway.store.slurm_tables import SlurmRun
from scheduler.model import DEFAULT_CONFIG, QUEUES

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

# The README's train.py: on SIGTERM it writes its checkpoint and exits 0. It says when its handler is in place (a
# prepare signal before that would kill python instead), beside its checkpoint directory, not in it.
TRAIN = """
import os, pathlib, signal, sys, time
ckpt = os.environ["JOBGATE_CHECKPOINT_DIR"]
def on_term(*_):
    pathlib.Path(ckpt, "last.ckpt").write_text("weights")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(ckpt + ".ready").touch()
while True: time.sleep(1)
"""
# A job that ignores its prepare signal: only jobgate's scancel at the window's end stops it.
IGNORES_TERM = """
import os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DIR"] + ".ready").touch()
while True: time.sleep(1)
"""


class Gate:
    """The module's gateway, its Slurm execution and its loop."""

    def __init__(self, api: Api, cluster: LocalCluster) -> None:
        self.api = api
        self.cluster = cluster
        self.ex: SlurmExecution = api.gateway.execution
        self.loop = SlurmLoop(self.ex)

    def until(self, what: str, pred: Callable[[], Any], timeout: float = 45.0) -> Any:
        """Run loop cycles until pred() is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            self.loop.cycle()
            value = pred()
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
            time.sleep(0.3)

    def submit(self, who: str = "alice", program: str = TRAIN, **spec: Any) -> str:
        body = job_spec(command=["python3", "-c", program], **spec)
        r = self.api.post("/v1/jobs", who, json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.api.get(f"/v1/jobs/{job_id}", "dave")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def state(self, job_id: str) -> str:
        return str(self.job(job_id)["state"])

    def running(self, *job_ids: str) -> None:
        """Wait until each job runs in jobgate and its handler is in place."""
        self.until(f"{job_ids} running", lambda: all(self.state(j) == "running" for j in job_ids))
        for j in job_ids:
            ready = Path(str(self.ex.checkpoint_dir(j)) + ".ready")
            self.until(f"{j} ready", ready.exists, 20)

    def run_row(self, job_id: str) -> SlurmRun:
        with self.api.gateway.transaction(immediate=False) as session:
            (row,) = session.query(SlurmRun).filter_by(job_id=job_id).order_by(SlurmRun.id.desc()).limit(1)
            session.expunge(row)
            return row

    def clear(self) -> None:
        """Cancel what still runs in Slurm and let jobgate read the ends."""
        self.cluster.cancel_everything()

        def quiet() -> bool:
            with self.api.gateway.transaction(immediate=False) as session:
                return not session.query(SlurmRun).filter_by(live=True).count()

        self.until("every Slurm run read as ended", quiet, 60)


@pytest.fixture(scope="module")
def gate(slurm_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("slurm-gateway"), backend="slurm",
                        slurm_conf=slurm_cluster.slurm_conf, slurm_service_user=slurm_cluster.service_user,
                        slurm_checkpoint_dir=slurm_cluster.workdir / f"jobgate-{secrets.token_hex(3)}",
                        policy_watch_interval_s=0)
    gen = start_api(settings, execution=slurm_execution)
    api = next(gen)
    # A site's choice, here so that a victim may be taken seconds after it started (Q8's minimum runtime).
    api.gateway.scheduler_config = replace(DEFAULT_CONFIG, min_runtime_s={q: 0.0 for q in QUEUES})
    try:
        yield Gate(api, slurm_cluster)
    finally:
        gen.close()


@pytest.fixture
def g(gate: Gate) -> Iterator[Gate]:
    yield gate
    gate.clear()


def transitions(api: Api, job_id: str) -> list[str]:
    return [e["body"]["state_after"] for e in ledger_entries(api)
            if e["kind"] == "transition" and e["body"].get("job_id") == job_id and "state_after" in e["body"]]


def test_the_walk_through_on_slurm_submit_refused_stop_graceful_stop_with_its_checkpoint_ledger_verifies(
        g: Gate) -> None:
    job_id = g.submit(runtime_limit_seconds=600)
    g.running(job_id)
    run = g.run_row(job_id)
    q = g.ex.client.job(run.slurm_job_id)
    assert q is not None
    # The mapping: account = project, partition = queue, GPUs per node, time limit, jobgate's id in the comment,
    # submitted as jobgate's service user.
    assert (q.account, q.partition, q.gpus_per_node, q.nodes, q.time_limit_min, q.comment, q.user) == (
        "vision", "normal", 2, 1, 10, f"jobgate:{job_id}", g.cluster.service_user)
    assert g.job(job_id)["placement"][0]["node"] == q.node_list

    refused = g.api.post(f"/v1/jobs/{job_id}/stop", "mallory", json={"reason": "I need the GPUs"})
    assert refused.status_code == 403, refused.text
    (denied,) = [e for e in ledger_entries(g.api) if e["kind"] == "decision" and e["body"]["actor"]["id"] == "mallory"]
    assert denied["body"]["decision"]["effect"] == "deny"
    assert g.ex.client.job(run.slurm_job_id).state == "RUNNING"  # type: ignore[union-attr]

    asked = g.api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done for today"})
    assert asked.status_code == 202, asked.text
    g.until("the stop's end", lambda: g.state(job_id) == "stopped")
    stopped = g.job(job_id)
    assert stopped["outcome"] == "graceful"
    (node,) = stopped["evidence"]["nodes"].values()
    (checkpoint,) = node["checkpoints"]
    written = g.ex.checkpoint_dir(job_id) / "last.ckpt"
    assert checkpoint["path"] == "last.ckpt"
    assert checkpoint["sha256"] == hashlib.sha256(written.read_bytes()).hexdigest()
    assert (node["signal"], node["exit_code"], node["outcome"]) == ("SIGTERM", 0, "graceful")
    slurm = node["slurm"]
    assert slurm["job_id"] == run.slurm_job_id and slurm["state"] == "COMPLETED"
    assert slurm["accounting"] and slurm["accounting"][-1]["comment"] == f"jobgate:{job_id}"
    assert transitions(g.api, job_id)[-4:] == ["running", "stop_requested", "stopping", "stopped"]

    done = subprocess.run([sys.executable, "-m", "gateway.cli", "ledger", "verify", "--data-dir",
                           str(g.api.settings.data_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_jobgates_preemption_for_an_urgent_gang_signals_the_victims_requeues_them_keeping_their_priority_hold_and_lower(
        g: Gate) -> None:
    # A full cluster: every node but one runs a governed job, the last one a job submitted straight to Slurm.
    victims = [g.submit(gpus_per_node=8, name=f"fill-{i}") for i in range(g.cluster.nodes - 1)]
    g.running(*victims)
    straight = int(g.cluster.run_as("bob", "sbatch", "--parsable", "-A", "vision", "-p", "batch", "--gres=gpu:8",
                                    "--wrap", "sleep 600").stdout.strip().split(";")[0])
    g.until("the job straight to Slurm running", lambda: (q := g.ex.client.job(straight)) and q.state == "RUNNING")
    with g.api.gateway.transaction(immediate=False) as session:
        before = {j: session.get(SchedJob, j).priority for j in victims}  # type: ignore[union-attr]
    urgent = g.submit("carol", queue="urgent", gpus_per_node=8, nodes=2, name="urgent-eval")
    g.until("the urgent gang running", lambda: g.state(urgent) == "running")
    assert len(g.job(urgent)["placement"]) == 2
    requeued = g.until("two victims back in jobgate's queue",
                       lambda: [j for j in victims if g.state(j) == "pending"] if
                       len([j for j in victims if g.state(j) == "pending"]) == 2 else None)
    assert {g.state(j) for j in victims if j not in requeued} == {"running"}
    # Not jobgate's to stop: the job submitted straight to Slurm was no victim (its batch tier notwithstanding).
    assert (q := g.ex.client.job(straight)) is not None and q.state == "RUNNING" and q.restarts == 0
    for j in requeued:
        row = g.run_row(j)
        q = g.ex.client.job(row.slurm_job_id)
        # Victims lost: none. The same Slurm job waits again, its priority the one it had (P2), not restarted.
        assert q is not None and q.state == "PENDING" and q.restarts == 1 and row.live
        assert not [a.state for a in g.ex.client.accounting([row.slurm_job_id]) if a.state == "TIMEOUT"]
        with g.api.gateway.transaction(immediate=False) as session:
            kept = session.get(SchedJob, j).priority  # type: ignore[union-attr]
        assert kept >= before[j] > 0  # jobgate's record: the priority before, plus its compensation (Q8)
        # Slurm would start its age factor again; jobgate set the kept priority as Operator, and Slurm keeps it.
        g.until(f"{j}'s priority kept in Slurm", lambda j=j, row=row, kept=kept: (
            q2 := g.ex.client.job(row.slurm_job_id)) and q2.priority == round(kept) == g.run_row(j).priority_set)
        # P4: the prepare signal, and the checkpoint the job wrote in its window, read back as graceful.
        last = g.job(j)["evidence"]["last_preemption"]
        assert last["outcome"] == "graceful"
        (evidence,) = last["nodes"].values()
        assert evidence["signal"] == "SIGTERM" and evidence["signal_sent_at"] <= evidence["exited_at"]
        assert [c["sha256"] for c in evidence["checkpoints"] if c["path"] == "last.ckpt"] == \
            [hashlib.sha256(b"weights").hexdigest()]
        queue = g.api.get(f"/v1/jobs/{j}/queue", "alice").json()
        assert queue["preemptions"] == 1 and queue["priority"]["effective"] >= before[j]
        assert transitions(g.api, j)[-1] == "stopping"  # the prepare signal went out (ledgered), then requeued
    # Q10: why it waits, in jobgate's words and beside them Slurm's own reason and estimate.
    g.until("Slurm's reason read", lambda: all(g.api.get(f"/v1/jobs/{j}/queue", "alice").json()["slurm"]["reason"]
                                               for j in requeued))
    why = g.api.get(f"/v1/jobs/{requeued[0]}/queue", "alice").json()
    assert why["blocking_reason"].startswith(f"queued in Slurm as job {why['slurm']['slurm_job_id']}")
    assert why["slurm"]["state"] == "PENDING"
    assert f"Slurm says: job {why['slurm']['slurm_job_id']} on {g.ex.cluster} PENDING ({why['slurm']['reason']})" \
        in describe_why(why)
    # jobgate decided it, as natively: one decision of the scheduler naming the urgent job and both victims.
    (preempt,) = [e["body"] for e in ledger_entries(g.api) if e["kind"] == "decision"
                  and e["body"].get("input", {}).get("action") == "job.preempt"]
    assert preempt["actor"]["id"] == "scheduler" and preempt["decision"]["rules"] == ["Q8.priority_preemption"]
    assert preempt["input"]["preemptor"] == urgent and sorted(preempt["input"]["targets"]) == sorted(requeued)

    # A waiting job paused in jobgate is held in Slurm, and released with its kept priority when resumed.
    paused, lowered = requeued
    slurm_id = g.run_row(paused).slurm_job_id
    r = g.api.post(f"/v1/jobs/{paused}/pause", "alice", json={"reason": "fix the data loader"})
    assert r.status_code in (200, 202), r.text
    g.until("held in Slurm", lambda: g.ex.client.job(slurm_id).held)  # type: ignore[union-attr]
    assert g.state(paused) == "paused"
    assert g.api.post(f"/v1/jobs/{paused}/resume", "alice", json={"reason": "fixed"}).status_code == 200
    g.until("released with its priority", lambda: (q := g.ex.client.job(slurm_id)) and not q.held
            and q.priority == g.run_row(paused).priority_set)
    # The owner gives way (A2): the number is Slurm's priority at once.
    r = g.api.post(f"/v1/jobs/{lowered}/priority", "alice", json={"priority": 100, "reason": "give way"})
    assert r.status_code == 200, r.text
    g.until("Slurm priority 100", lambda: g.ex.client.job(g.run_row(lowered).slurm_job_id).priority == 100)  # type: ignore[union-attr]


def test_an_emergency_stop_of_an_environment_stops_its_jobs_in_slurm_and_only_those(g: Gate) -> None:
    staging = [g.submit(environment="staging", name=f"staging-{i}", program=IGNORES_TERM) for i in range(2)]
    other = g.submit(environment="research", name="research")
    g.running(*staging, other)
    r = g.api.post("/v1/emergency-stops", "dave", json={"scope": {"kind": "environment", "value": "staging"},
                                                         "trigger": "security", "reason": "leaked credentials",
                                                         "grace_seconds": 0})
    assert r.status_code == 202, r.text
    done = g.api.post(f"/v1/approvals/{r.json()['approval_id']}/approve", "sam")
    assert done.status_code == 200, done.text
    g.until("staging stopped", lambda: all(g.state(j) == "stopped" for j in staging))
    for j in staging:
        stopped = g.job(j)
        (node,) = stopped["evidence"]["nodes"].values()
        # Grace 0: the prepare signal (ignored), and at once jobgate's scancel; Slurm's accounting names who cancelled.
        assert stopped["outcome"] == node["outcome"] == "forced" and node["signal"] == "SIGTERM"
        assert (node["slurm"]["state"], node["slurm"]["cancelled_by"]) == ("CANCELLED", g.cluster.service_user)
        assert g.ex.client.job(g.run_row(j).slurm_job_id).state not in ("RUNNING", "PENDING")  # type: ignore[union-attr]
    assert g.state(other) == "running"
    assert g.ex.client.job(g.run_row(other).slurm_job_id).state == "RUNNING"  # type: ignore[union-attr]


def test_slurm_down_refuses_mutations_changes_nothing_and_is_caught_up_when_it_returns(g: Gate, tmp_path: Path) -> None:
    job_id = g.submit()
    g.running(job_id)
    slurm_id = g.run_row(job_id).slurm_job_id
    entries = len(ledger_entries(g.api))
    g.cluster.stop_daemon("slurmctld")
    try:
        refused = g.api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
        assert_problem(refused, 503, "executor-unavailable", "does not answer")
        assert g.state(job_id) == "running"  # nothing half-done: no stop_requested, no stop asked of Slurm
        assert "stop_requested" not in transitions(g.api, job_id)
        assert g.run_row(job_id).stop_reference is None
        lowered = g.api.post(f"/v1/jobs/{job_id}/priority", "alice", json={"priority": 1, "reason": "give way"})
        assert_problem(lowered, 503, "executor-unavailable")
        # A submission is jobgate's own business: accepted, it waits until Slurm can take it.
        waiting = g.submit(name="while-down")
        g.loop.cycle()
        assert g.state(waiting) == "pending" and g.ex.answering is False
        assert not [e for e in ledger_entries(g.api)[entries:] if e["kind"] == "transition"
                    and e["body"].get("job_id") == job_id]
        # A gateway started now says why in one line.
        started = CliRunner().invoke(up, ["--backend", "slurm", "--data-dir", str(tmp_path / "var"), "--port", "1"],
                                     env={"JOBGATE_SLURM_CONF": str(g.cluster.slurm_conf),
                                          "JOBGATE_SLURM_SERVICE_USER": g.cluster.service_user})
        assert started.exit_code == 1, started.output
        (line,) = started.output.strip().splitlines()
        assert line.startswith("Error: cannot start on Slurm") and "does not answer" in line, line
    finally:
        g.cluster.up()
    g.until("the waiting job submitted and running", lambda: g.state(waiting) == "running", 60)
    assert g.ex.client.job(slurm_id).state == "RUNNING"  # type: ignore[union-attr]
    asked = g.api.post(f"/v1/jobs/{job_id}/stop", "alice", json={"reason": "done"})
    assert asked.status_code == 202, asked.text
    g.until("stopped once Slurm answers", lambda: g.state(job_id) == "stopped")
