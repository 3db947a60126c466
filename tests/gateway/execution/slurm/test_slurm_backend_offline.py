"""The Slurm backend's parts that need no cluster: host lists read as Slurm prints them, `jobgate up --backend
slurm` and the starter refusing in one line what they cannot use, and which map rows the loop's cycle may leave
without a step."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli.up import up
from gateway.execution.slurm.hostlist import expand
from gateway.execution.slurm.poll import _quiet
from gateway.execution.slurm.records import ExitStatus, QueuedJob, SlurmJobId
from gateway.store.slurm_tables import SlurmRun

T0 = datetime(2026, 12, 2, tzinfo=UTC)


@pytest.mark.parametrize(("hostlist", "names"), [
    ("n001", ["n001"]),
    ("n[001-003,007]", ["n001", "n002", "n003", "n007"]),
    ("n[08-10],gpu1", ["n08", "n09", "n10", "gpu1"]),  # the width of the first number is kept
    ("", []),
])
def test_a_host_list_is_the_node_names_slurm_means(hostlist: str, names: list[str]) -> None:
    assert expand(hostlist) == names


def test_a_host_list_it_cannot_read_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="not a number"):
        expand("n[a-c]")


def test_up_on_slurm_without_its_slurm_conf_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    missing = tmp_path / "no-such" / "slurm.conf"
    result = CliRunner().invoke(up, ["--backend", "slurm", "--data-dir", str(tmp_path / "var"), "--port", str(port)],
                                env={"JOBGATE_SLURM_CONF": str(missing)})
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: cannot start on Slurm") and f"no slurm.conf at {missing}" in line


def test_a_row_gets_its_step_unless_slurm_shows_it_as_last_seen_and_jobgate_wants_nothing_of_it() -> None:
    q = QueuedJob(job_id=SlurmJobId(7), name="job", user="jobgate", account="vision", partition="normal",
                  qos="normal", state="RUNNING", reason="None", priority=100, nice=0, comment="jobgate:j-1", nodes=1,
                  node_list="n001", gpus_per_node=1, gres="gpu:1", time_limit_min=None, restarts=0, requeue=True,
                  submit_time=T0, eligible_time=T0, start_time=T0, end_time=None, exit=ExitStatus(0, None))
    run = SlurmRun(job_id="j-1", cluster="c", slurm_job_id=7, submitted_at=T0, updated_at=T0, state="RUNNING",
                   reason="None", slurm_priority=100, restarts=0, node_list="n001", held=False, priority_set=None,
                   stop_asked_at=None)
    assert _quiet(run, "running", q)
    assert not _quiet(run, "pending", q)  # Slurm runs it, jobgate has not placed it yet
    assert not _quiet(run, "stopped", q)  # jobgate ended it: Slurm's job is cancelled
    assert not _quiet(run, "running", replace(q, state="COMPLETING"))  # Slurm changed it
    assert not _quiet(run, "running", None)  # gone from Slurm's queue: its end is read
    run.stop_asked_at = T0
    assert not _quiet(run, "running", q)  # a stop to carry out
    waiting = replace(q, state="PENDING", reason="Priority", node_list="")
    run.state, run.reason, run.stop_asked_at = "PENDING", "Priority", None
    assert _quiet(run, "pending", waiting)
    assert not _quiet(run, "paused", waiting)  # to be held
    run.priority_set = 50
    assert not _quiet(run, "pending", waiting)  # its priority to be set back


def test_the_starter_refuses_in_one_line_a_preemption_setting_it_does_not_know(tmp_path: Path) -> None:
    # Who preempts is a choice of two (jobgate, the default; slurm, for the benchmark's baseline): anything else
    # is refused before anything is made, not taken for either.
    starter = Path(__file__).parents[4] / "deploy" / "slurm" / "up"
    done = subprocess.run([str(starter), "2"], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "JOBGATE_SLURM_DIR": str(tmp_path / "c"),
                               "JOBGATE_SLURM_PREEMPT": "both"})
    assert done.returncode != 0
    assert done.stderr.strip().endswith("JOBGATE_SLURM_PREEMPT must be jobgate or slurm, not 'both'")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
