"""Command verification in the agent (H1): forged, replayed, expired, misaddressed → rejected, never run.

The agent core runs in-process with an in-process gateway port; reports are read from its outbox, which
is exactly what the reporter thread would send.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
from nodeagent_testkit import command, nonce_of, py, wait_until

from nodeagent import protocol
from nodeagent.agent import Agent, AgentConfig

pytestmark = pytest.mark.integration

SLEEPER = py("import time; print('ready', flush=True); time.sleep(60)")


class InProcessGateway:
    """A complete GatewayPort that keeps everything in memory."""

    def __init__(self) -> None:
        self.commands: list[Any] = []
        self.reports: list[dict[str, Any]] = []
        self.heartbeats: list[dict[str, Any]] = []

    def heartbeat(self, body: dict[str, Any]) -> None:
        self.heartbeats.append(body)

    def fetch_commands(self, wait: float) -> list[Any]:
        taken, self.commands = self.commands, []
        return taken

    def post_reports(self, reports: list[dict[str, Any]]) -> None:
        self.reports.extend(reports)

    def close(self) -> None:
        pass


class Harness:
    def __init__(self, work_dir: Path, key: nacl.signing.SigningKey) -> None:
        self.work_dir = work_dir
        self.key = key
        self.agents: list[Agent] = []
        self.agent = self.new_agent()

    def new_agent(self) -> Agent:
        """A fresh agent over the same work dir, i.e. what an agent restart looks like."""
        config = AgentConfig(node="node-a", gpus=8, work_dir=self.work_dir, poll_wait=0.1)
        agent = Agent(config, InProcessGateway(), self.key.verify_key)
        agent.recover()
        # What the gateway sends a new agent instance first: no start is obeyed before it.
        running = [r.job_id for r in agent.runner.running()]
        agent.handle_envelope(command(self.key, "reconcile", "", expected=running, stop=[], pending=[]))
        self.agents.append(agent)
        self.agent = agent
        return agent

    def reports(self, job_id: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.agent.outbox.peek(10_000)
            if (job_id is None or r["job_id"] == job_id) and (event is None or r["event"] == event)
        ]

    def wait(self, job_id: str, event: str) -> dict[str, Any]:
        found = wait_until(lambda: self.reports(job_id, event), 10, f"{event} for {job_id}")
        return found[0]  # type: ignore[no-any-return]

    def close(self) -> None:
        for agent in self.agents:
            for record in agent.runner.running():
                agent.runner.stop(record.job_id, 0)
            agent.runner.join_stops(10)
            agent.runner.close()


@pytest.fixture
def harness(tmp_path: Path, signing_key: nacl.signing.SigningKey) -> Iterator[Harness]:
    h = Harness(tmp_path / "agent", signing_key)
    yield h
    h.close()


def start(key: nacl.signing.SigningKey, job_id: str, **kw: Any) -> dict[str, str]:
    return command(key, "start", job_id, **{"argv": SLEEPER, "gpus": [0], "grace_seconds": 1, "stop_signal": "SIGTERM",
                                            **kw})


def assert_never_ran(h: Harness, job_id: str) -> None:
    assert not (h.work_dir / "jobs" / job_id).exists()
    assert h.agent.runner.get(job_id) is None


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda key: start(nacl.signing.SigningKey.generate(), "j-forged"), "forged"),
        (lambda key: start(key, "j-expired", ttl=-5), "expired"),
        (lambda key: start(key, "j-misaddressed", node="node-b"), "misaddressed"),
        # Replay protection that does not rest on the nonce store alone: issue time and lifetime are bounded.
        (lambda key: start(key, "j-future", issued_in=protocol.MAX_CLOCK_SKEW_S + 60), "future"),
        (lambda key: start(key, "j-forever", ttl=protocol.MAX_COMMAND_TTL_S + 60), "lifetime"),
        (lambda key: {"payload": "{}", "signature": "not base64!"}, "malformed"),
        (lambda key: "not even an object", "malformed"),
    ],
    ids=["forged", "expired", "misaddressed", "from-the-future", "valid-too-long", "bad-signature-encoding",
         "not-an-object"],
)
def test_bad_envelopes_are_rejected_and_never_run(harness: Harness, make: Any, reason: str) -> None:
    envelope = make(harness.key)
    harness.agent.handle_envelope(envelope)
    [report] = harness.reports(event="rejected")
    assert report["detail"].startswith(f"{reason}: ")
    assert report["pid"] is None and report["evidence"] is None
    if isinstance(envelope, dict) and envelope.get("payload", "{}") != "{}":
        job_id = json.loads(envelope["payload"])["job_id"]
        assert report["job_id"] == job_id
        assert_never_ran(harness, job_id)
        # An unverifiable payload's nonce is attacker-chosen and is not echoed back.
        assert report["nonce"] == (None if reason == "forged" else nonce_of(envelope))
    assert harness.agent.runner.running() == []


def test_no_start_is_obeyed_before_the_reconcile_and_then_only_those_it_lists(
    tmp_path: Path, signing_key: nacl.signing.SigningKey
) -> None:
    """An agent whose state was lost (here: a fresh one) cannot be made to run an old start again: starts wait for
    the gateway's reconcile, which lists the commands still in flight; an older one it does not list is stale."""
    agent = Agent(AgentConfig(node="node-a", gpus=8, work_dir=tmp_path / "agent"), InProcessGateway(),
                  signing_key.verify_key)
    listed, unlisted = start(signing_key, "j-listed", gpus=[0]), start(signing_key, "j-unlisted", gpus=[1])
    for envelope in (listed, unlisted, listed):  # the gateway hands an unanswered command out again
        agent.handle_envelope(envelope)
    assert agent.runner.running() == [] and agent.outbox.peek(10) == []
    agent.handle_envelope(command(signing_key, "reconcile", "", expected=[], stop=[], pending=[nonce_of(listed)]))
    later = start(signing_key, "j-later", gpus=[2])  # issued after the reconcile: obeyed
    agent.handle_envelope(later)
    try:
        events = {(r["job_id"], r["event"]) for r in agent.outbox.peek(100)}
        assert {("j-listed", "started"), ("j-later", "started"), ("j-unlisted", "rejected"), ("", "reconciled")} \
            <= events
        assert ("j-unlisted", "started") not in events
        [stale] = [r for r in agent.outbox.peek(100) if r["event"] == "rejected"]
        assert stale["detail"].startswith("stale: ") and stale["nonce"] == nonce_of(unlisted)
    finally:
        for record in agent.runner.running():
            agent.runner.stop(record.job_id, 0)
        agent.runner.join_stops(10)
        agent.runner.close()


def test_replayed_command_is_rejected_also_after_restart(harness: Harness) -> None:
    stop = command(harness.key, "stop", "j-replay", grace_seconds=0)
    envelope = start(harness.key, "j-replay")
    harness.agent.handle_envelope(envelope)
    started = harness.wait("j-replay", "started")
    assert started["nonce"] == nonce_of(envelope)
    harness.agent.handle_envelope(stop)
    harness.wait("j-replay", "stopped")
    harness.agent.runner.join_stops(10)

    # Same nonce again while the agent lives: refused, and nothing is spawned a second time.
    harness.agent.handle_envelope(envelope)
    [rejected] = harness.reports("j-replay", "rejected")
    assert rejected["detail"].startswith("replayed: ")
    assert rejected["nonce"] == nonce_of(envelope)
    assert harness.agent.runner.get("j-replay") is None
    assert nonce_of(envelope) in json.loads((harness.work_dir / "state" / "nonces.json").read_text())

    # A restarted agent reads nonces.json and still refuses both commands.
    restarted = harness.new_agent()
    restarted.handle_envelope(envelope)
    restarted.handle_envelope(stop)
    # The restarted agent's outbox still holds the unsent reports of the first, then its own two.
    details = [r["detail"] for r in harness.reports("j-replay", "rejected")]
    assert len(details) == 3 and all(d.startswith("replayed: ") for d in details)
    assert restarted.runner.get("j-replay") is None
    assert len(harness.reports("j-replay", "started")) == 1


def test_expired_nonces_are_pruned(harness: Harness) -> None:
    harness.agent.nonces.remember("old", expires_at=1.0)
    stop = command(harness.key, "stop", "nobody", grace_seconds=0)
    harness.agent.handle_envelope(stop)
    stored = json.loads((harness.work_dir / "state" / "nonces.json").read_text())
    assert "old" not in stored and nonce_of(stop) in stored


@pytest.mark.parametrize(
    ("params", "why"),
    [
        ({"argv": [], "gpus": [0]}, "argv is empty"),
        ({"argv": SLEEPER, "gpus": [8]}, "are not distinct GPUs"),
        ({"argv": SLEEPER, "gpus": [1, 1]}, "are not distinct GPUs"),
        ({"argv": SLEEPER, "gpus": [0], "grace_seconds": -1}, "grace_seconds"),
        ({"argv": SLEEPER, "gpus": [0], "stop_signal": "SIGBOGUS"}, "unknown signal"),
        ({"argv": "python train.py", "gpus": [0]}, "argv must be a list"),
    ],
    ids=["empty-argv", "gpu-out-of-range", "gpu-twice", "negative-grace", "bad-signal", "argv-string"],
)
def test_signed_but_unusable_start_is_rejected(harness: Harness, params: dict[str, Any], why: str) -> None:
    envelope = command(harness.key, "start", "j-bad", **params)
    harness.agent.handle_envelope(envelope)
    [report] = harness.reports("j-bad", "rejected")
    assert report["detail"].startswith("invalid: ") and why in report["detail"]
    assert report["nonce"] == nonce_of(envelope)
    assert_never_ran(harness, "j-bad")


def test_path_traversal_job_id_is_rejected(harness: Harness) -> None:
    harness.agent.handle_envelope(start(harness.key, "../../outside"))
    [report] = harness.reports("../../outside", "rejected")
    assert report["detail"].startswith("invalid: ")
    assert not (harness.work_dir.parent / "outside").exists()


def test_gpu_held_by_another_job_is_a_conflict(harness: Harness) -> None:
    harness.agent.handle_envelope(start(harness.key, "first"))
    harness.wait("first", "started")
    harness.agent.handle_envelope(start(harness.key, "second"))
    [report] = harness.reports("second", "rejected")
    assert report["detail"].startswith("conflict: ")
    assert_never_ran(harness, "second")


def test_reconcile_stops_listed_and_reports_unknown_and_missing(harness: Harness) -> None:
    for job_id, gpu in (("keep", 0), ("drop", 1), ("stray", 2)):
        harness.agent.handle_envelope(
            command(harness.key, "start", job_id, argv=SLEEPER, gpus=[gpu], grace_seconds=0.2)
        )
        harness.wait(job_id, "started")
    reconcile = command(harness.key, "reconcile", "*", expected=["keep", "drop", "gone"], stop=["drop"])
    harness.agent.handle_envelope(reconcile)

    stopped = harness.wait("drop", "stopped")
    assert stopped["nonce"] == nonce_of(reconcile)
    assert stopped["evidence"]["process_group_gone"] is True
    unknown = harness.wait("stray", "unknown")
    assert unknown["nonce"] == nonce_of(reconcile) and unknown["pid"] is not None
    missing = harness.wait("gone", "exited")
    assert missing["detail"] == "not running on this node"
    assert {r["job_id"] for r in harness.reports(event="unknown")} == {"stray"}
    # Unknown is reported, not stopped: only the gateway decides that (H1).
    assert harness.agent.runner.get("stray") is not None
    assert harness.agent.runner.get("keep") is not None


def test_restarted_agent_adopts_running_job_and_can_stop_it(harness: Harness) -> None:
    harness.agent.handle_envelope(start(harness.key, "long"))
    started = harness.wait("long", "started")
    records = json.loads((harness.work_dir / "state" / "processes.json").read_text())
    assert records["long"]["pid"] == started["pid"]

    # A new agent over the same directory (the old one simply stops being used).
    restarted = harness.new_agent()
    assert [r.job_id for r in restarted.runner.running()] == ["long"]
    assert restarted.heartbeat_body()["running"] == [{"job_id": "long", "pid": started["pid"], "gpus": [0]}]
    restarted.handle_envelope(command(harness.key, "stop", "long", grace_seconds=0.3))
    stopped = harness.wait("long", "stopped")
    assert stopped["evidence"]["process_group_gone"] is True
    assert stopped["evidence"]["outcome"] == "graceful"  # sleep dies of SIGTERM within the window
    assert json.loads((harness.work_dir / "state" / "processes.json").read_text()) == {}


CHECKPOINTER = py(
    "import os, pathlib, signal, sys, time\n"
    "def on_term(*_):\n"
    "    pathlib.Path(os.environ['JOBGATE_CHECKPOINT_DIR'], 'c.ckpt').write_bytes(b'w')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_delete_artifacts_lists_every_removed_file_and_refuses_a_running_job(harness: Harness) -> None:
    harness.agent.handle_envelope(command(harness.key, "start", "j-del", argv=CHECKPOINTER, gpus=[0],
                                          grace_seconds=5))
    harness.wait("j-del", "started")
    log = harness.work_dir / "jobs" / "j-del" / "output.log"
    wait_until(lambda: log.exists() and "ready" in log.read_text(), 10, "the job to be ready")
    running = command(harness.key, "delete_artifacts", "j-del", what="checkpoints", reason="retention")
    harness.agent.handle_envelope(running)
    [refused] = harness.reports("j-del", "rejected")
    assert refused["detail"].startswith("conflict: ") and refused["nonce"] == nonce_of(running)

    harness.agent.handle_envelope(command(harness.key, "stop", "j-del"))
    harness.wait("j-del", "stopped")
    harness.agent.runner.join_stops(10)
    ckpt = harness.work_dir / "jobs" / "j-del" / "checkpoints" / "c.ckpt"
    assert ckpt.exists()  # a stop never deletes (C5)

    delete = command(harness.key, "delete_artifacts", "j-del", what="checkpoints", reason="retention: next job")
    harness.agent.handle_envelope(delete)
    report = harness.wait("j-del", "deleted")
    assert report["nonce"] == nonce_of(delete)
    assert [d["path"] for d in report["evidence"]["deleted"]] == ["checkpoints/c.ckpt"]
    assert report["evidence"]["deleted"][0]["sha256"] == hashlib.sha256(b"w").hexdigest()
    assert not ckpt.exists() and log.exists()  # only the checkpoints went

    everything = command(harness.key, "delete_artifacts", "j-del", what="all", reason="delete: job deleted")
    harness.agent.handle_envelope(everything)
    wait_until(lambda: len(harness.reports("j-del", "deleted")) == 2, 10, "the second deletion report")
    last = harness.reports("j-del", "deleted")[-1]
    assert [d["path"] for d in last["evidence"]["deleted"]] == ["output.log"]
    assert not (harness.work_dir / "jobs" / "j-del").exists()
    bad = command(harness.key, "delete_artifacts", "j-del", what="everything-else")
    harness.agent.handle_envelope(bad)
    assert harness.reports("j-del", "rejected")[-1]["detail"].startswith("invalid: ")
