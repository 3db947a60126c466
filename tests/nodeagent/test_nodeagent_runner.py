"""Runner against real subprocesses: prepare signal, grace window, kill, evidence (P4, C3, C5)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from nodeagent_testkit import EventLog, py, wait_for_log, wait_until

from nodeagent.errors import InvalidCommand
from nodeagent.procgroup import parse_signal
from nodeagent.runner import Runner

pytestmark = pytest.mark.integration

CHECKPOINT_ON_TERM = """
import os, signal, sys, time, pathlib
def on_term(signum, frame):
    pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DIR"], "step-100.pt").write_bytes(b"weights" * 1000)
    print("checkpoint written", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
"""

IGNORE_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def test_graceful_stop_lists_checkpoint_with_sha256(runner: Runner, events: EventLog) -> None:
    record = runner.start("train-a", py(CHECKPOINT_ON_TERM), [0, 1], {}, 10, "SIGTERM")
    assert record is not None
    job_dir = runner.job_dir("train-a")
    old = job_dir / "checkpoints" / "step-50.pt"
    old.write_bytes(b"older checkpoint")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    wait_for_log(job_dir, "ready")

    started = time.monotonic()
    thread = runner.stop("train-a", nonce="n-stop")
    assert thread is not None
    stopped = events.wait("train-a", "stopped")
    assert time.monotonic() - started < 5

    ev = stopped.evidence
    assert ev is not None
    assert stopped.nonce == "n-stop"
    assert ev["outcome"] == "graceful"
    assert ev["signal"] == "SIGTERM"
    assert ev["exit_code"] == 0 and ev["exit_signal"] is None
    assert ev["process_group_gone"] is True
    assert ev["gpus_released"] == [0, 1]
    assert ev["signal_sent_at"] <= ev["exited_at"]
    expected_sha = hashlib.sha256(b"weights" * 1000).hexdigest()
    assert ev["checkpoints"] == [
        {
            "path": "checkpoints/step-100.pt",
            "size": 7000,
            "mtime": pytest.approx((job_dir / "checkpoints/step-100.pt").stat().st_mtime),
            "sha256": expected_sha,
        }
    ]
    # C5: the older checkpoint is an artifact, untouched, but not a checkpoint of this stop.
    assert [a["path"] for a in ev["artifacts"]] == ["checkpoints/step-100.pt", "checkpoints/step-50.pt"]
    assert old.read_bytes() == b"older checkpoint"
    assert "checkpoint written" in ev["log_tail"]
    json.dumps(ev)  # reports carry evidence as JSON
    stopping = events.wait("train-a", "stopping")
    assert stopping.evidence == {
        "signal": "SIGTERM",
        "signal_sent_at": ev["signal_sent_at"],
        "grace_seconds": 10.0,
    }
    assert [e.event for e in events.of("train-a")] == ["started", "stopping", "stopped"]
    assert runner.running() == []


def test_job_ignoring_the_signal_is_killed_after_the_window(runner: Runner, events: EventLog) -> None:
    runner.start("stubborn", py(IGNORE_TERM), [], {}, 30, "SIGTERM")
    wait_for_log(runner.job_dir("stubborn"), "ready")
    t0 = time.monotonic()
    runner.stop("stubborn", 0.5)
    ev = events.wait("stubborn", "stopped").evidence
    elapsed = time.monotonic() - t0
    assert ev is not None
    assert ev["outcome"] == "forced"
    assert ev["grace_seconds"] == 0.5
    assert ev["exit_code"] is None and ev["exit_signal"] == "SIGKILL"
    assert ev["exited_at"] - ev["signal_sent_at"] >= 0.5
    assert 0.5 <= elapsed < 5
    assert ev["process_group_gone"] is True
    assert ev["checkpoints"] == []


def test_a_later_shorter_stop_brings_the_kill_forward_never_back(runner: Runner, events: EventLog) -> None:
    """An emergency stop taking over a graceful stop with an hour's window: the agent kept the hour."""
    runner.start("slow", py(IGNORE_TERM), [], {}, 3600, "SIGTERM")
    wait_for_log(runner.job_dir("slow"), "ready")
    runner.stop("slow", 3600, nonce="first")
    events.wait("slow", "stopping")
    t0 = time.monotonic()
    runner.stop("slow", 7200, nonce="longer")  # a longer window changes nothing
    runner.stop("slow", 0.5, nonce="shorter")
    said = {e.nonce: e.detail for e in events.of("slow", "stopping")}
    assert said["longer"] == "stop already in progress"
    assert said["shorter"] == "stop already in progress; grace window cut to 0.5s"
    done = events.wait("slow", "stopped")
    assert 0.5 <= time.monotonic() - t0 < 5
    assert done.nonce == "first"  # the stop in progress ends, as the gateway expects
    assert done.detail == "killed after the grace window (cut to 0.5s by a later stop)"
    assert done.evidence is not None and done.evidence["outcome"] == "forced"


def test_sigusr1_is_delivered_as_the_prepare_signal(runner: Runner, events: EventLog) -> None:
    code = """
import signal, sys, time
def on_usr1(signum, frame):
    print("got", signal.Signals(signum).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""
    runner.start("usr1", py(code), [], {}, 10, "SIGUSR1")
    wait_for_log(runner.job_dir("usr1"), "ready")
    runner.stop("usr1")  # signal and window come from the start command
    ev = events.wait("usr1", "stopped").evidence
    assert ev is not None
    assert ev["signal"] == "SIGUSR1"
    assert ev["outcome"] == "graceful"
    assert "got SIGUSR1" in ev["log_tail"]


def test_checkpoint_done_file_cuts_the_window_short(runner: Runner, events: EventLog) -> None:
    code = """
import os, signal, time, pathlib
def on_term(signum, frame):
    pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DIR"], "final.pt").write_bytes(b"final")
    pathlib.Path(os.environ["JOBGATE_CHECKPOINT_DONE"]).touch()
    print("done announced", flush=True)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(1)  # keeps running after the checkpoint: the agent must not wait out 60 s
"""
    runner.start("early", py(code), [], {}, 60, "SIGTERM")
    wait_for_log(runner.job_dir("early"), "ready")
    t0 = time.monotonic()
    runner.stop("early")
    ev = events.wait("early", "stopped", timeout=15).evidence
    assert time.monotonic() - t0 < 5
    assert ev is not None
    assert ev["outcome"] == "forced"  # it did not exit by itself; it was killed after announcing
    assert [c["path"] for c in ev["checkpoints"]] == ["checkpoints/final.pt"]
    assert "checkpoint.done seen" in events.wait("early", "stopped").detail


def test_whole_process_group_dies_grandchild_included(runner: Runner, events: EventLog) -> None:
    code = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
open("grandchild.pid", "w").write(str(child.pid))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("ready", flush=True)
time.sleep(60)
"""
    record = runner.start("tree", py(code), [], {}, 5, "SIGTERM")
    assert record is not None
    job_dir = runner.job_dir("tree")
    wait_for_log(job_dir, "ready")
    grandchild = int((job_dir / "grandchild.pid").read_text())
    assert os.getpgid(grandchild) == record.pgid
    runner.stop("tree")
    ev = events.wait("tree", "stopped").evidence
    assert ev is not None
    # The leader exited on SIGTERM; the grandchild ignoring it went with the group's SIGKILL.
    assert ev["outcome"] == "graceful"
    assert ev["process_group_gone"] is True
    with pytest.raises(ProcessLookupError):
        os.killpg(record.pgid, 0)
    with pytest.raises(ProcessLookupError):
        os.kill(grandchild, 0)


def test_environment_gpus_and_natural_exit(runner: Runner, events: EventLog) -> None:
    code = """
import os, sys
for name in ("CUDA_VISIBLE_DEVICES", "JOBGATE_JOB_ID", "JOBGATE_CHECKPOINT_DIR",
             "JOBGATE_CHECKPOINT_DONE", "EXTRA"):
    print(f"{name}={os.environ.get(name)}")
print(f"cwd={os.getcwd()}")
sys.exit(3)
"""
    runner.start("env-job", py(code), [1, 3], {"EXTRA": "yes", "CUDA_VISIBLE_DEVICES": "0"}, 5, "SIGTERM")
    exited = events.wait("env-job", "exited")
    ev = exited.evidence
    assert ev is not None
    job_dir = runner.job_dir("env-job")
    assert ev["log_tail"] == [
        "CUDA_VISIBLE_DEVICES=1,3",
        "JOBGATE_JOB_ID=env-job",
        f"JOBGATE_CHECKPOINT_DIR={job_dir / 'checkpoints'}",
        f"JOBGATE_CHECKPOINT_DONE={job_dir / 'checkpoint.done'}",
        "EXTRA=yes",
        f"cwd={job_dir}",
    ]
    assert exited.nonce is None
    assert ev["exit_code"] == 3
    assert ev["outcome"] is None and ev["signal"] is None
    assert ev["gpus_released"] == [1, 3]
    assert runner.running() == []


def test_missing_executable_is_reported_not_raised(runner: Runner, events: EventLog) -> None:
    assert runner.start("ghost", ["/nonexistent/train"], [0], {}, 5, "SIGTERM", nonce="n1") is None
    ev = events.wait("ghost", "exited")
    assert ev.pid is None and ev.nonce == "n1"
    assert ev.detail.startswith("spawn failed:")
    assert runner.running() == []


def test_bad_job_id_and_signal_are_refused(runner: Runner) -> None:
    with pytest.raises(InvalidCommand):
        runner.start("../escape", py("pass"), [], {}, 5, "SIGTERM")
    with pytest.raises(InvalidCommand):
        runner.start("ok", py("pass"), [], {}, 5, "SIGNOPE")
    assert not (runner.work_dir / "escape").exists()


def test_stop_of_unknown_job_reports_stopped_without_evidence(runner: Runner, events: EventLog) -> None:
    assert runner.stop("nobody", 0, nonce="n2") is None
    ev = events.wait("nobody", "stopped")
    assert ev.evidence is None and ev.nonce == "n2"


def test_many_parallel_stops_are_fast(runner: Runner, events: EventLog) -> None:
    count = 100
    for i in range(count):
        runner.start(f"bulk-{i}", ["sleep", "60"], [], {}, 30, "SIGTERM")
    t0 = time.monotonic()
    for i in range(count):
        runner.stop(f"bulk-{i}", 0)
    wait_until(lambda: all(events.of(f"bulk-{i}", "stopped") for i in range(count)), 20, "all stopped")
    assert time.monotonic() - t0 < 10
    outcomes = {e.evidence["outcome"] for e in events.events if e.event == "stopped" and e.evidence}
    assert outcomes <= {"graceful", "forced"}
    assert runner.running() == []


def test_stop_signal_is_sent_to_the_group_not_just_the_leader(tmp_path: Path, events: EventLog) -> None:
    # A leader that ignores the prepare signal, with a child that checkpoints on it.
    code = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('child got TERM', flush=True), sys.exit(0)))\\n"
    "print('child ready', flush=True)\\n"
    "time.sleep(60)"])
child.wait()
print("leader done", flush=True)
"""
    r = Runner(tmp_path / "w", events)
    try:
        r.start("fan", py(code), [], {}, 10, "SIGTERM")
        wait_for_log(r.job_dir("fan"), "child ready")
        r.stop("fan")
        ev = events.wait("fan", "stopped").evidence
        assert ev is not None
        assert ev["outcome"] == "graceful"
        assert "child got TERM" in ev["log_tail"] and "leader done" in ev["log_tail"]
    finally:
        r.join_stops(10)
        r.close()


@pytest.mark.parametrize("name", ["SIGUSR1", "USR1", "sigusr1", "10"], ids=str)
def test_signal_names(name: str) -> None:
    assert parse_signal(name) == signal.SIGUSR1


# A job that starts a helper in a session of its own (setsid), out of reach of a signal to the job's
# process group, then lives until stopped (or, with EXIT, ends on its own).
LEAVES_A_STRAY = """
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print("helper", helper.pid, flush=True)
if "EXIT" not in os.environ:
    time.sleep(60)
"""


def _helper_pid(job_dir: Path) -> int:
    wait_for_log(job_dir, "helper ")
    line = next(x for x in (job_dir / "output.log").read_text().splitlines() if x.startswith("helper "))
    return int(line.split()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


@pytest.mark.parametrize("ending", ["stopped", "exited"])
def test_what_a_job_starts_outside_its_process_group_ends_with_it(runner: Runner, events: EventLog,
                                                                   ending: str) -> None:
    env = {"EXIT": "1"} if ending == "exited" else {}
    runner.start("train-s", py(LEAVES_A_STRAY), [3], env, 2, "SIGTERM")
    helper = _helper_pid(runner.job_dir("train-s"))
    if ending == "stopped":
        runner.stop("train-s", nonce="n-stop")
    ev = events.wait("train-s", ending).evidence
    assert ev is not None
    assert ev["strays"] == [{"pid": helper, "pgid": helper, "ended": True}]
    assert not _alive(helper)
    assert ev["process_group_gone"] is True and ev["gpus_released"] == [3]
