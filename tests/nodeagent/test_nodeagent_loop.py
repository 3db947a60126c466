"""`python -m nodeagent` as a real subprocess against a real (fake) HTTP gateway on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import signal

import nacl.signing
import pytest
from nodeagent_testkit import AgentProcess, FakeGateway, command, nonce_of, py, wait_until

pytestmark = pytest.mark.integration

CHECKPOINTING_JOB = py(
    """
import os, signal, sys, time, pathlib
def on_term(signum, frame):
    pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DIR"], "ckpt.bin").write_bytes(b"state")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
time.sleep(60)
"""
)


def test_start_then_stop_reports_started_stopping_stopped(
    gateway: FakeGateway, agent_process: AgentProcess, signing_key: nacl.signing.SigningKey
) -> None:
    agent_process.start()
    wait_until(lambda: gateway.heartbeats, 10, "first heartbeat")
    first = dict(gateway.heartbeats[0])
    # A fresh instance id per agent process lets the gateway notice a restart and reconcile.
    assert len(first.pop("instance")) == 16
    assert isinstance(first.pop("at"), float)
    # As root (CI) each job gets a uid of its own; without root only the named unsafe switch lets the agent run.
    assert first.pop("isolation") == ("none" if os.geteuid() != 0 else agent_process.expected_isolation())
    assert first == {"gpus": 8, "running": [], "version": "0.1.0"}

    start = command(signing_key, "start", "train-1", argv=CHECKPOINTING_JOB, gpus=[2, 5], grace_seconds=10)
    gateway.push(start)
    started = gateway.wait_report("train-1", "started")
    assert started["nonce"] == nonce_of(start) and isinstance(started["pid"], int)
    wait_until(
        lambda: any(h["running"] for h in gateway.heartbeats[-3:]), 10, "heartbeat listing the job"
    )
    assert gateway.heartbeats[-1]["running"] == [{"job_id": "train-1", "pid": started["pid"], "gpus": [2, 5]}]
    log = agent_process.work_dir / "jobs" / "train-1" / "output.log"
    wait_until(lambda: log.exists() and "ready 2,5" in log.read_text(), 10, "job ready")

    stop = command(signing_key, "stop", "train-1", grace_seconds=10, stop_signal="SIGTERM", reason="preempt")
    gateway.push(stop)
    stopping = gateway.wait_report("train-1", "stopping")
    stopped = gateway.wait_report("train-1", "stopped")
    assert stopping["nonce"] == stopped["nonce"] == nonce_of(stop)
    assert stopping["detail"] == "preempt"
    ev = stopped["evidence"]
    assert ev["outcome"] == "graceful" and ev["exit_code"] == 0
    assert ev["process_group_gone"] is True and ev["gpus_released"] == [2, 5]
    assert ev["checkpoints"][0]["path"] == "checkpoints/ckpt.bin"
    assert ev["checkpoints"][0]["sha256"] == hashlib.sha256(b"state").hexdigest()
    assert [r["event"] for r in gateway.reports if r["job_id"] == "train-1"] == ["started", "stopping", "stopped"]
    with pytest.raises(ProcessLookupError):
        os.killpg(started["pid"], 0)

    assert agent_process.stop() == 0
    assert gateway.unauthorized == 0
    lines = [json.loads(line) for line in agent_process.stderr().splitlines()]
    assert any(line["msg"] == "command accepted" and line.get("job_id") == "train-1" for line in lines)


def test_forged_command_is_rejected_over_http(
    gateway: FakeGateway, agent_process: AgentProcess, signing_key: nacl.signing.SigningKey
) -> None:
    agent_process.start()
    forged = command(nacl.signing.SigningKey.generate(), "start", "evil", argv=py("print('pwned')"), gpus=[0])
    gateway.push(forged)
    rejected = gateway.wait_report("evil", "rejected")
    assert rejected["detail"].startswith("forged: ")
    assert not (agent_process.work_dir / "jobs" / "evil").exists()
    assert gateway.find("evil", "started") == []


def test_jobs_outlive_agent_restart_and_replays_stay_refused(
    gateway: FakeGateway, agent_process: AgentProcess, signing_key: nacl.signing.SigningKey
) -> None:
    agent_process.start()
    start = command(signing_key, "start", "survivor", argv=py("import time; time.sleep(60)"), gpus=[0])
    gateway.push(start)
    pid = gateway.wait_report("survivor", "started")["pid"]

    assert agent_process.stop() == 0  # SIGTERM: the agent exits cleanly ...
    os.killpg(pid, 0)  # ... and the job keeps running

    agent_process.start()
    gateway.push(start)  # the very same envelope, delivered again
    rejected = gateway.wait_report("survivor", "rejected")
    assert rejected["detail"].startswith("replayed: ")
    wait_until(
        lambda: any(h["running"] for h in gateway.heartbeats[-3:]), 10, "adopted job in heartbeat"
    )
    assert gateway.heartbeats[-1]["running"][0]["pid"] == pid

    gateway.push(command(signing_key, "stop", "survivor", grace_seconds=0.5))
    stopped = gateway.wait_report("survivor", "stopped")
    assert stopped["evidence"]["process_group_gone"] is True
    assert stopped["pid"] == pid
    assert len(gateway.find("survivor", "started")) == 1


def test_reports_survive_an_unreachable_gateway_and_a_restart(
    gateway: FakeGateway, agent_process: AgentProcess, signing_key: nacl.signing.SigningKey
) -> None:
    gateway.refuse_reports = True
    agent_process.start()
    gateway.push(command(signing_key, "stop", "never-ran", grace_seconds=0))
    outbox = agent_process.work_dir / "state" / "outbox.jsonl"
    wait_until(lambda: outbox.exists() and "never-ran" in outbox.read_text(), 10, "report in the outbox")
    assert gateway.reports == []

    assert agent_process.stop() == 0
    gateway.refuse_reports = False
    agent_process.start()
    report = gateway.wait_report("never-ran", "stopped")
    assert report["detail"] == "not running on this node"
    wait_until(lambda: outbox.read_text() == "", 10, "outbox drained")


def test_agent_exits_cleanly_on_sigint(gateway: FakeGateway, agent_process: AgentProcess) -> None:
    agent_process.start()
    wait_until(lambda: gateway.heartbeats, 10, "first heartbeat")
    agent_process.proc.send_signal(signal.SIGINT)
    assert agent_process.proc.wait(20) == 0
    assert "agent exited" in agent_process.stderr()


def _bad_key(agent: AgentProcess) -> None:
    agent.key_file.write_text("not-a-key\n")


def _plain_http_elsewhere(agent: AgentProcess) -> None:
    agent.gateway_url = "http://gateway.example:8080"  # the node token would cross the network in clear


def _unreachable_jobs(agent: AgentProcess) -> None:
    private = agent.work_dir.parent / "private"
    private.mkdir(mode=0o700)
    agent.work_dir = private / "agent"
    (agent.work_dir / "state").mkdir(parents=True)
    (agent.work_dir / "state" / "token").write_text("t\n")


STARTUP_ERRORS = {
    "unusable command key": (_bad_key, "command key"),
    "plain http to another host": (_plain_http_elsewhere, "plain http to another host"),
    # As root a job runs under a uid of its own, which must be able to walk to its directory.
    "jobs unreachable by job uids": (_unreachable_jobs, "not reachable by job uids"),
}


@pytest.mark.parametrize("case", sorted(STARTUP_ERRORS), ids=str)
def test_startup_errors_are_one_line_and_exit_2(gateway: FakeGateway, agent_process: AgentProcess, case: str
                                                ) -> None:
    spoil, says = STARTUP_ERRORS[case]
    if case == "jobs unreachable by job uids" and os.geteuid() != 0:
        pytest.skip("without root jobs run as the agent's user")
    spoil(agent_process)
    agent_process.start()
    assert agent_process.proc.wait(20) == 2
    line = json.loads(agent_process.stderr().splitlines()[-1])
    assert line["msg"] == "cannot start" and says in line["error"], line


def test_a_report_the_gateway_refuses_as_it_is_is_set_aside_and_does_not_hold_back_the_rest(
    gateway: FakeGateway, agent_process: AgentProcess, signing_key: nacl.signing.SigningKey
) -> None:
    gateway.refuse_job = "poison-1"
    agent_process.start()
    wait_until(lambda: gateway.heartbeats, 10, "first heartbeat")
    gateway.push(command(signing_key, "stop", "poison-1", reason="not here"))  # answered 'stopped' at once
    gateway.push(command(signing_key, "start", "train-2", argv=py("import time; time.sleep(30)"), gpus=[0]))
    assert gateway.wait_report("train-2", "started")["pid"]
    assert gateway.refused_batches >= 1 and not gateway.find("poison-1", "stopped")
    rejected = agent_process.work_dir / "state" / "outbox.rejected.jsonl"
    aside = [json.loads(line) for line in rejected.read_text().splitlines()]
    assert [(a["report"]["job_id"], a["report"]["event"]) for a in aside] == [("poison-1", "stopped")]
    assert "HTTP 422" in aside[0]["refused"] and "reports about poison-1 are refused" in aside[0]["refused"]
    assert "report refused by the gateway and set aside" in agent_process.stderr()


def test_a_command_the_agent_cannot_even_refuse_does_not_end_its_command_loop(
    gateway: FakeGateway, agent_process: AgentProcess, signing_key: nacl.signing.SigningKey
) -> None:
    agent_process.start()
    agent_process.wait_reconciled()
    # The nonce file cannot be written (as on a full disk): the command is not run, and not refusable either.
    blocker = agent_process.work_dir / "state" / ".nonces.json.tmp"
    blocker.mkdir()
    gateway.push(command(signing_key, "start", "train-3", argv=py("import time; time.sleep(30)"), gpus=[0]))
    wait_until(lambda: "command handling failed" in agent_process.stderr(), 10, "the failure logged")
    assert not gateway.find("train-3", "started")
    blocker.rmdir()
    gateway.push(command(signing_key, "start", "train-4", argv=py("import time; time.sleep(30)"), gpus=[1]))
    assert gateway.wait_report("train-4", "started")["pid"]


def test_a_refused_report_that_cannot_be_set_aside_is_retried_and_the_reporter_lives_on(
    gateway: FakeGateway, agent_process: AgentProcess, signing_key: nacl.signing.SigningKey
) -> None:
    gateway.refuse_job = "poison-2"
    agent_process.start()
    wait_until(lambda: gateway.heartbeats, 10, "first heartbeat")
    blocker = agent_process.work_dir / "state" / "outbox.rejected.jsonl"
    blocker.mkdir()  # as on a full disk: the refused report cannot be written aside
    gateway.push(command(signing_key, "stop", "poison-2", reason="not here"))
    wait_until(lambda: "refused report not set aside" in agent_process.stderr(), 10, "the failure logged")
    blocker.rmdir()
    gateway.push(command(signing_key, "start", "train-5", argv=py("import time; time.sleep(30)"), gpus=[2]))
    assert gateway.wait_report("train-5", "started", timeout=30)["pid"]
    assert "poison-2" in (agent_process.work_dir / "state" / "outbox.rejected.jsonl").read_text()
