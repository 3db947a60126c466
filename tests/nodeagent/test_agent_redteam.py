"""Red-team tests of the node agent: what a job running as the agent's own user can plant on disk, and
what a forged or edited record can make the agent do. Real subprocesses, real files, no mocks."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from nodeagent_testkit import EventLog, py, wait_for_log

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
    if "output.log" in plant:
        time.sleep(1.0)  # the job's own log is gone; give it time to plant
    else:
        wait_for_log(job_dir, "ready")
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
