"""Red-team tests of the node agent: what a job running as the agent's own user can plant on disk, and
what a forged or edited record can make the agent do. Real subprocesses, real files, no mocks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nacl.signing
import pytest
from nodeagent_testkit import EventLog, command, nonce_of, py, wait_for_log, wait_until
from test_nodeagent_commands import SLEEPER, Harness

from nodeagent import procgroup
from nodeagent.runner import Runner

pytestmark = pytest.mark.integration

# Each plant runs in the job (cwd = its job dir) before it says "ready"; a real checkpoint sits beside it.
PLANTS = {
    "fifo": "os.mkfifo(ckpt / 'pipe')",
    "unix-socket": "s = socket.socket(socket.AF_UNIX); s.bind(str(ckpt / 'sock'))",
    "link-to-dev-zero": "os.symlink('/dev/zero', ckpt / 'zero')",
    "link-to-fifo-outside": "os.mkfifo(ckpt.parent.parent / 'outside-pipe'); "
    "os.symlink(ckpt.parent.parent / 'outside-pipe', ckpt / 'pipe')",
    "log-replaced-by-fifo": "os.remove('output.log'); os.mkfifo('output.log')",
    "log-replaced-by-dir": "os.remove('output.log'); os.mkdir('output.log')",
}


def planting_job(plant: str) -> list[str]:
    return py(
        "import os, pathlib, socket, sys, time\n"
        "ckpt = pathlib.Path(os.environ['JOBGATE_CHECKPOINT_DIR'])\n"
        "(ckpt / 'real.pt').write_bytes(b'weights')\n"
        f"{plant}\n"
        "(ckpt.parent / 'planted').touch()\n"  # a marker beside the log, which the plant may have replaced
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )


@pytest.mark.parametrize("plant", list(PLANTS.values()), ids=list(PLANTS))
def test_planted_special_files_neither_hang_nor_crash_the_stop(
    runner: Runner, events: EventLog, plant: str
) -> None:
    """A FIFO blocks open(), /dev/zero never ends, a socket fails open() with ENXIO, a directory
    fails it with EISDIR: none may keep the stop from killing the job and reporting `stopped`."""
    job_dir = runner.job_dir("planted")
    runner.start("planted", planting_job(plant), [0], {}, 30, "SIGTERM")
    wait_until(lambda: (job_dir / "planted").exists(), 15, "the plant in place")
    runner.stop("planted", 0.2)
    ev = events.wait("planted", "stopped", timeout=15).evidence
    assert ev is not None and ev["process_group_gone"] is True
    assert [a["path"] for a in ev["artifacts"]] == ["checkpoints/real.pt"]
    assert ev["artifacts"][0]["sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert runner.get("planted") is None


def test_symlink_to_a_file_outside_is_not_hashed_as_an_artifact(
    runner: Runner, events: EventLog, tmp_path: Path
) -> None:
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$secret")
    job_dir = runner.job_dir("leaky")
    runner.start("leaky", planting_job(f"os.symlink({str(secret)!r}, ckpt / 'leak.pt')"), [0], {}, 30, "SIGTERM")
    wait_for_log(job_dir, "ready")
    runner.stop("leaky", 0.2)
    ev = events.wait("leaky", "stopped", timeout=15).evidence
    assert ev is not None
    assert [a["path"] for a in ev["artifacts"]] == ["checkpoints/real.pt"]
    assert hashlib.sha256(secret.read_bytes()).hexdigest() not in str(ev)


# -- A6 / P1 deletes: only the job's own files, never a crash ------------------------------------------

DELETE_PLANTS = {
    # A real file beside each trap; a stop leaves them all for the delete to find.
    "checkpoints-dir-is-symlink": "import shutil; shutil.rmtree(ckpt); os.symlink(outside, ckpt)",
    "symlinked-subdir": "os.symlink(outside, ckpt / 'sub')",
    "job-dir-is-symlink": "os.rename(job, str(job) + '.moved'); os.symlink(outside, job)",
    "deeply-nested": "os.chdir(ckpt)\nfor _ in range(1200):\n    os.mkdir('d'); os.chdir('d')\n"
    "open('deep.pt', 'w').write('x'); os.chdir(job)",
}


def exiting_planter(plant: str, outside: Path) -> list[str]:
    return py(
        "import os, pathlib\n"
        "ckpt = pathlib.Path(os.environ['JOBGATE_CHECKPOINT_DIR']); job = ckpt.parent\n"
        f"outside = {str(outside)!r}\n"
        "(ckpt / 'real.pt').write_bytes(b'weights')\n"
        f"{plant}\n"
    )


@pytest.fixture
def harness(tmp_path: Path, signing_key: nacl.signing.SigningKey) -> Iterator[Harness]:
    h = Harness(tmp_path / "agent", signing_key)
    yield h
    h.close()


@pytest.mark.parametrize("what", ["checkpoints", "all"])
@pytest.mark.parametrize("trap", list(DELETE_PLANTS))
def test_delete_removes_nothing_outside_and_survives_any_tree(
    harness: Harness, tmp_path: Path, trap: str, what: str
) -> None:
    plant = DELETE_PLANTS[trap]
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "thesis.tex").write_text("years of work")
    harness.agent.handle_envelope(command(harness.key, "start", "trap", argv=exiting_planter(plant, outside),
                                          gpus=[0]))
    harness.wait("trap", "exited")
    wait_until(lambda: harness.agent.runner.get("trap") is None, 10, "the job to be gone")

    delete = command(harness.key, "delete_artifacts", "trap", what=what, reason="delete: job deleted")
    harness.agent.handle_envelope(delete)  # must not raise: an exception here kills the agent's poller

    assert (outside / "thesis.tex").read_text() == "years of work"
    [answer] = [r for r in harness.reports("trap") if r["nonce"] == nonce_of(delete)]
    if trap == "job-dir-is-symlink":
        assert answer["event"] == "rejected" and answer["detail"].startswith("unsafe: ")
        return
    assert answer["event"] == "deleted"
    paths = [d["path"] for d in answer["evidence"]["deleted"]]
    # The job removed its own real.pt when it swapped its checkpoints dir for the link.
    assert ("checkpoints/real.pt" in paths) == (trap != "checkpoints-dir-is-symlink")
    assert not any("thesis" in p for p in paths)
    job_dir = harness.work_dir / "jobs" / "trap"
    if trap == "deeply-nested":
        assert answer["evidence"]["left"]  # too deep to walk: said so, not silently kept
    elif what == "all":
        assert answer["evidence"]["left"] == [] and not job_dir.exists() and not job_dir.is_symlink()
    # The agent still obeys the next command.
    harness.agent.handle_envelope(command(harness.key, "stop", "nobody"))
    harness.wait("nobody", "stopped")


# -- adoption after restart: a record the job edited must not aim the agent at a stranger ---------------


@pytest.mark.parametrize("ticks", ["dropped", "copied-from-victim"])
def test_edited_process_record_does_not_make_a_stranger_adoptable(harness: Harness, ticks: str) -> None:
    """The job rewrites its own record in processes.json to name another process group (same user, so it
    can); a restarted agent must not adopt it, and the gateway's next stop must not kill the stranger."""
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    job_pid = None
    try:
        harness.agent.handle_envelope(command(harness.key, "start", "forger", argv=SLEEPER, gpus=[0]))
        job_pid = harness.wait("forger", "started")["pid"]
        path = harness.work_dir / "state" / "processes.json"
        records = json.loads(path.read_text())
        stat = procgroup.read_stat(victim.pid)
        assert stat is not None
        records["forger"].update(pid=victim.pid, pgid=victim.pid,
                                 start_ticks=None if ticks == "dropped" else stat.start_ticks)
        path.write_text(json.dumps(records))

        restarted = harness.new_agent()
        assert restarted.runner.get("forger") is None
        restarted.handle_envelope(command(harness.key, "stop", "forger", grace_seconds=0))
        restarted.runner.join_stops(10)
        time.sleep(0.2)
        assert victim.poll() is None, "the agent killed a process group that was never the job's"
        # The stranger still runs, so the job's group is not reported gone (a person must look).
        [vanished] = [r for r in harness.reports("forger", "exited")]
        assert vanished["evidence"]["process_group_gone"] is False
    finally:
        victim.kill()
        victim.wait()
        if job_pid is not None:  # the real job, which its edited record no longer names
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job_pid, signal.SIGKILL)


# -- the gateway side: a node's token speaks for its own commands only ---------------------------------


@pytest.mark.parametrize("reporter", ["other-node", "own-node-unasked", "other-node-start-nonce",
                                      "own-node-start-nonce"])
def test_deletion_report_without_a_delete_command_for_that_node_is_not_ledgered(
    tmp_path: Path, reporter: str
) -> None:
    """A `deleted` report moves retention and purge state and writes one ledger entry per object (A6, P1);
    only a node that was sent a signed delete_artifacts for that job may make it."""
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.demo import DEMO_NODES, prepare_demo
    from gateway.native.scheduler_loop import run_once
    from gateway.settings import Settings

    settings = Settings(data_dir=tmp_path / "gw")
    prepare_demo(settings)
    alice = json.loads((settings.data_dir / "demo-tokens.json").read_text())["alice"]
    node_token = {n: (settings.data_dir / "agents" / n / "state" / "token").read_text().strip() for n in DEMO_NODES}

    with TestClient(create_app(settings, run_scheduler=False)) as client:
        def as_node(node: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {node_token[node]}"}

        for node in DEMO_NODES:
            beat = {"gpus": 8, "running": [], "version": "t", "instance": "i"}
            assert client.post(f"/v1/agents/{node}/heartbeat", json=beat, headers=as_node(node)).status_code == 200
        spec = {"name": "train-a", "project": "vision", "gpus_per_node": 2, "nodes": 1,
                "command": ["python3", "-c", "print(1)"]}
        r = client.post("/v1/jobs", json=spec, headers={"Authorization": f"Bearer {alice}"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        run_once(client.app.state.gateway)  # type: ignore[attr-defined]
        def starts(n: str) -> list[dict[str, object]]:
            envelopes = client.get(f"/v1/agents/{n}/commands", params={"wait": 0}, headers=as_node(n))
            payloads = [json.loads(e["payload"]) for e in envelopes.json()["commands"]]
            return [p for p in payloads if p["kind"] == "start" and p["job_id"] == job_id]

        sent = {n: starts(n) for n in DEMO_NODES}
        placed = [n for n in DEMO_NODES if sent[n]]
        assert len(placed) == 1
        node = placed[0] if reporter.startswith("own-node") else next(n for n in DEMO_NODES if n != placed[0])
        # A real nonce, of the start command: the wrong kind of command, and for the other node the wrong node.
        nonce = sent[placed[0]][0]["nonce"] if reporter.endswith("start-nonce") else None
        forged = {"job_id": job_id, "event": "deleted", "nonce": nonce, "at": time.time(),
                  "evidence": {"deleted": [{"path": "checkpoints/x.pt", "size": 1, "mtime": 1.0,
                                            "sha256": "ab" * 32}], "what": "all", "reason": "retention: forged"}}
        r = client.post(f"/v1/agents/{node}/reports", json={"reports": [forged]}, headers=as_node(node))
        assert r.status_code == 200, r.text

        ledger = client.app.state.gateway.ledger  # type: ignore[attr-defined]
        bodies = [json.loads(e.raw) for e in ledger.entries(0, ledger.size())]
        deletions = [b for b in bodies if b["kind"] == "deletion" and b["body"].get("job_id") == job_id]
        assert deletions == [], f"{node} made the ledger say it deleted {job_id}'s files"
