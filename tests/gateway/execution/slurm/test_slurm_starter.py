"""deploy/slurm itself: `up` again leaves a running cluster alone, and `down` stops only what `up`
started, including a job's process that escaped its job, and nothing that merely looks like it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurm_testkit import (
    StarterFailed,
    no_slurm_here,
    run_starter,
    script,
    start_cluster,
    stop_cluster_dir,
    wait_for,
    why_no_slurm,
)

from gateway.execution.slurm import JobSpec

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


def _daemon_pids(run: Path) -> dict[str, int]:
    return {f.stem: int(f.read_text()) for f in run.glob("*.pid") if not f.is_symlink()}


def test_up_is_idempotent_and_down_stops_exactly_what_up_started():
    reason = why_no_slurm()
    if reason:
        no_slurm_here(reason)
    try:
        cluster, _ = start_cluster(1, prefix="jobgate-slurm-starter-")
    except StarterFailed as e:
        no_slurm_here(str(e))
    lookalike = subprocess.Popen(["sleep", "1000"])  # same command, not the cluster's
    escaped_pid: int | None = None
    try:
        before = _daemon_pids(cluster.dir / "run")
        assert {"slurmctld", "slurmdbd", "slurmrestd", "munged", "slurmd-n001"} <= set(before)
        cluster.up()
        assert _daemon_pids(cluster.dir / "run") == before  # nothing restarted

        # A job that leaves a process behind in a session of its own: proctrack/pgid does not see it, so
        # it outlives the job's cancel. The task prolog's marker is in its environment all the same.
        pidfile = cluster.workdir / "escaped.pid"
        client = cluster.client()
        jid = client.submit(JobSpec(script=script(f'setsid sleep 1000 & echo $! > "{pidfile}"\nexec sleep 1000'),
                                    account="vision", partition="normal", workdir=str(cluster.workdir)))
        escaped_pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "the job's child"))
        client.cancel(jid)
        wait_for(lambda: client.job(jid).state == "CANCELLED", 30, "the job to end")
        assert Path(f"/proc/{escaped_pid}").exists()

        stop_cluster_dir(cluster.env)
        for name, pid in before.items():
            assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) still runs"
        wait_for(lambda: not Path(f"/proc/{escaped_pid}").exists() or _zombie(escaped_pid), 10, "the escaped child")
        assert lookalike.poll() is None  # never signalled: it does not carry the marker
        assert not cluster.dir.exists()
        run_starter("down", cluster.env)  # nothing left to stop: still exits 0
    finally:
        lookalike.kill()
        lookalike.wait()
        if cluster.dir.exists():
            stop_cluster_dir(cluster.env)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True
