"""Slurm submission benchmark: jobs/s through the typed client beside `sbatch` alone, same cluster, same run.

Starts a local cluster with deploy/slurm (4 nodes x 8 GPUs; needs root on Debian and MariaDB on
127.0.0.1:3306), then submits N held jobs (held, so that the machine measures submission, not running)
as jobgate's service user three ways, interleaved in rounds:

- `sbatch_shell_loop`: the baseline, a bash loop of `sbatch --parsable --hold` (Slurm's own cost);
- `sbatch_subprocess`: the same command from Python's subprocess, nothing else;
- `client`: SlurmClient.submit(JobSpec(...)), which checks the spec, runs sbatch and parses its id.

Then one `SlurmClient.jobs()` (squeue --json, parsed) with the 3 x N jobs queued, and `squeue --json` alone.

Then, through jobgate on the same cluster (a gateway in this process on the Slurm backend, its Slurm loop and
its watch running as in `jobgate up --backend slurm`):

- `through_jobgate`: authorised submissions/s, each POST /v1/jobs decided by policy and ledgered, until Slurm
  holds every one (its slurm_runs row), beside `sbatch` alone from Python's subprocess for as many jobs;
- `reconciliation`: from an out-of-band `scancel` (as root) of a governed running job to its `out_of_band`
  ledger entry, per trial, beside the watch's interval and the cost of one look;

and on a full cluster of `--urgent-nodes` (64) nodes x 8 GPUs started for it: an urgent 2x8-GPU job from its
submission to running, through jobgate (POST as a queue admin; jobgate preempts: prepare signal, window,
`scontrol requeue`, the victims' priority kept) beside Slurm's own partition preemption of the same fill
submitted with sbatch alone (GraceTime 0, on a cluster of the same size started with it on), with the victims
lost (ended instead of back in the queue) for each.

    .venv/bin/python bench/slurm.py              # 300 jobs
    .venv/bin/python bench/slurm.py --jobs 100 --urgent-nodes 0   # no 64-node run

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pwd
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

# Run as a script, this folder would come first on sys.path and its modules shadow the packages.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path[:0] = [str(_HERE.parent), str(_HERE.parent / "tests" / "gateway" / "execution" / "slurm")]

from fastapi.testclient import TestClient  # noqa: E402
from slurm_testkit import LocalCluster, start_cluster, stop_cluster_dir, why_no_slurm  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from gateway.app import create_app  # noqa: E402
from gateway.bootstrap import slurm_execution  # noqa: E402
from gateway.demo import prepare_demo  # noqa: E402
from gateway.execution.slurm import JobSpec  # noqa: E402
from gateway.execution.slurm.oversight import SlurmWatch  # noqa: E402
from gateway.jobs.oversight import JobOversight  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.store.models import Job  # noqa: E402
from gateway.store.oversight_tables import SlurmFindingRow  # noqa: E402
from gateway.store.slurm_tables import SlurmRun  # noqa: E402
from scheduler.model import DEFAULT_CONFIG, QUEUES  # noqa: E402

SCRIPT = "#!/bin/sh\nexec sleep 600\n"


def _as(cluster: LocalCluster, user: str) -> dict[str, Any]:
    e = pwd.getpwnam(user)
    return {"user": e.pw_uid, "group": e.pw_gid, "extra_groups": [], "cwd": str(cluster.workdir),
            "env": {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(cluster.slurm_conf), "LANG": "C.UTF-8"}}


def shell_loop(cluster: LocalCluster, n: int, args: list[str]) -> float:
    body = f"for i in $(seq {n}); do sbatch {' '.join(args)} >/dev/null <<'EOF'\n{SCRIPT}EOF\ndone"
    t0 = time.perf_counter()
    subprocess.run(["bash", "-ec", body], check=True, **_as(cluster, cluster.service_user))
    return time.perf_counter() - t0


def subprocess_loop(cluster: LocalCluster, n: int, args: list[str]) -> float:
    kw = _as(cluster, cluster.service_user)
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(["sbatch", *args], input=SCRIPT, capture_output=True, text=True, check=True, **kw)
    return time.perf_counter() - t0


def client_loop(cluster: LocalCluster, n: int) -> float:
    client = cluster.client()
    t0 = time.perf_counter()
    for i in range(n):
        client.submit(JobSpec(script=SCRIPT, account="vision", partition="batch", name="bench", gpus_per_node=1,
                              time_limit_min=10, comment=f"jobgate:bench-{i}", workdir=str(cluster.workdir),
                              hold=True))
    return time.perf_counter() - t0


def queued(cluster: LocalCluster) -> int:
    out = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(cluster.slurm_conf)})
    return len(out.stdout.split())


class Gate:
    """A gateway in this process on the cluster, as `jobgate up --backend slurm --demo` runs it (its loops too)."""

    def __init__(self, cluster: LocalCluster, data_dir: Path) -> None:
        self.cluster = cluster
        self.settings = Settings(data_dir=data_dir, backend="slurm", slurm_conf=cluster.slurm_conf,
                                 slurm_service_user=cluster.service_user, policy_watch_interval_s=0,
                                 slurm_checkpoint_dir=cluster.workdir / "jobgate")
        prepare_demo(self.settings)
        self.tokens = json.loads((data_dir / "demo-tokens.json").read_text())
        self.client = TestClient(create_app(self.settings, run_scheduler=True, execution=slurm_execution))
        self.client.__enter__()
        self.gw = self.client.app.state.gateway  # type: ignore[attr-defined]

    def close(self) -> None:
        self.client.__exit__(None, None, None)

    def submit(self, who: str, **spec: Any) -> str:
        body = {"name": "bench", "project": "vision", "gpus_per_node": 1, "nodes": 1,
                "command": ["sleep", "600"], **spec}
        r = self.client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {self.tokens[who]}"})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def states(self, job_ids: list[str]) -> dict[str, str]:
        with self.gw.transaction(immediate=False) as session:
            return dict(session.execute(select(Job.id, Job.state).where(Job.id.in_(job_ids))).all())

    def in_slurm(self, job_ids: list[str]) -> int:
        with self.gw.transaction(immediate=False) as session:
            return int(session.scalar(select(func.count(func.distinct(SlurmRun.job_id)))
                                      .where(SlurmRun.job_id.in_(job_ids))) or 0)

    def finding(self, key: str) -> bool:
        with self.gw.transaction(immediate=False) as session:
            return session.get(SlurmFindingRow, f"{self.cluster.cluster}:{key}") is not None


def until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
    return value


def cancel_to_ledger(gate: Gate, cluster: LocalCluster) -> float:
    """Seconds from a root `scancel` of a governed running job to its out_of_band entry."""
    job = gate.submit("alice", name="victim")
    until(lambda: gate.states([job]).get(job) == "running", 60, "the job to run", 0.05)
    with gate.gw.transaction(immediate=False) as session:
        sid = session.scalar(select(SlurmRun.slurm_job_id).where(SlurmRun.job_id == job))
    t0 = time.perf_counter()
    cluster.run_as("root", "scancel", str(sid))
    until(lambda: gate.finding(f"{job}:cancel"), 60, "the out_of_band entry", 0.01)
    return time.perf_counter() - t0


def through_jobgate(cluster: LocalCluster, data_dir: Path, n: int, trials: int) -> dict[str, Any]:
    """Authorised submissions/s through jobgate beside sbatch alone; reconciliation of an out-of-band cancel."""
    args = JobSpec(script=SCRIPT, account="vision", partition="batch", name="bench", gpus_per_node=1,
                   workdir=str(cluster.workdir), comment="jobgate:bench").sbatch_args()
    alone = subprocess_loop(cluster, n, args)
    cluster.cancel_everything()
    gate = Gate(cluster, data_dir / "submissions")
    try:
        t0 = time.perf_counter()
        ids = [gate.submit("alice", queue="batch", name=f"bench-{i}") for i in range(n)]
        decided = time.perf_counter() - t0
        until(lambda: gate.in_slurm(ids) == n, 300, f"{n} jobs in Slurm", 0.02)
        through = time.perf_counter() - t0
    finally:
        gate.close()
    # A fresh gateway for the cancels: the first one's jobs, cancelled here behind its back, are its own business.
    cluster.cancel_everything()
    gate = Gate(cluster, data_dir / "reconciliation")
    try:
        seconds = [cancel_to_ledger(gate, cluster) for _ in range(trials)]
        watch = SlurmWatch(gate.gw.execution.client, cluster.cluster, JobOversight(gate.gw), gate.gw.transaction,
                           clock=gate.gw.clock)
        watch.cycle()
        t2 = time.perf_counter()
        looks = 5
        parts: dict[str, float] = {}
        for _ in range(looks):
            for k, v in watch.cycle().ms.items():
                parts[k] = parts.get(k, 0.0) + v / looks
        look_ms = (time.perf_counter() - t2) * 1000 / looks
        held = len(_slurm_states(cluster, every=True))
    finally:
        gate.close()
    cluster.cancel_everything()
    return {
        "submissions": n,
        "jobgate_decided_per_s": round(n / decided, 1),
        "jobgate_to_slurm_per_s": round(n / through, 1),
        "sbatch_alone_per_s": round(n / alone, 1),
        "jobgate_vs_sbatch_alone": round(alone / through, 3),
        "reconciliation_s": [round(x, 2) for x in seconds],
        "reconciliation_median_s": round(sorted(seconds)[len(seconds) // 2], 2),
        "reconciliation_max_s": round(max(seconds), 2),
        "watch_interval_s": gate.settings.slurm_watch_interval_s,
        "one_look_ms": round(look_ms, 1),
        "one_look_parts_ms": {k: round(v, 1) for k, v in parts.items()},
        "jobs_slurmctld_held_at_the_looks": held,
        "baseline": "sbatch alone: the same sbatch options from Python's subprocess, same user, same cluster; "
                    "reconciliation beside the watch's interval (the wait for the next look) and one look's cost",
    }


def _slurm_states(cluster: LocalCluster, every: bool = False) -> dict[int, str]:
    """Slurm id -> state of the jobs squeue lists (`every`: with those ended less than MinJobAge ago)."""
    out = subprocess.run(["squeue", "-h", "-o", "%A %T", *(["-t", "all"] if every else [])],
                         capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(cluster.slurm_conf)}).stdout
    return {int(a): b for a, b in (ln.split() for ln in out.splitlines() if ln.strip())}


def urgent_on_a_full_cluster(nodes: int, data_dir: Path) -> dict[str, Any]:
    """An urgent 2x8-GPU job on a full cluster: through jobgate, and with Slurm's own preemption alone. The
    baseline's cluster has Slurm's partition preemption on (JOBGATE_SLURM_PREEMPT=slurm); jobgate's, as the
    starter sets it, off (jobgate decides): two clusters of the same size, one after the other."""
    cluster, up_s = start_cluster(nodes, prefix="jobgate-slurm-bench-urgent-", preempt="slurm")
    try:
        # Slurm alone: the fill and the urgent job with sbatch, as jobgate's service user.
        fill = JobSpec(script=SCRIPT, account="vision", partition="normal", name="fill", gpus_per_node=8,
                       workdir=str(cluster.workdir))
        client = cluster.client()
        victims = [int(client.submit(fill)) for _ in range(nodes)]
        until(lambda: sum(1 for v in _slurm_states(cluster).values() if v == "RUNNING") == nodes, 300,
              "the fill running", 0.2)
        t0 = time.perf_counter()
        urgent = int(client.submit(JobSpec(script=SCRIPT, account="vision", partition="urgent", name="urgent",
                                           gpus_per_node=8, nodes=2, workdir=str(cluster.workdir))))
        until(lambda: _slurm_states(cluster).get(urgent) == "RUNNING", 120, "the urgent job running", 0.02)
        slurm_alone = time.perf_counter() - t0
        time.sleep(2)
        states = _slurm_states(cluster)
        slurm_lost = sum(1 for v in victims if states.get(v) not in ("RUNNING", "PENDING", "CONFIGURING"))
        cluster.cancel_everything()
    finally:
        stop_cluster_dir(cluster.env)
    cluster, _ = start_cluster(nodes, prefix="jobgate-slurm-bench-urgent-")
    try:
        # Through jobgate: the same fill and urgent job, submitted through the API; jobgate preempts.
        gate = Gate(cluster, data_dir)
        # A site's choice (Q8's minimum runtime, 600 s for normal by default): the fill may be taken at once.
        gate.gw.scheduler_config = replace(DEFAULT_CONFIG, min_runtime_s={q: 0.0 for q in QUEUES})
        try:
            fill_ids = [gate.submit("alice", name=f"fill-{i}", gpus_per_node=8) for i in range(nodes)]
            until(lambda: list(gate.states(fill_ids).values()).count("running") == nodes, 300,
                  "the fill running in jobgate", 0.2)
            t1 = time.perf_counter()
            job = gate.submit("carol", queue="urgent", name="urgent", gpus_per_node=8, nodes=2)
            until(lambda: gate.states([job]).get(job) == "running", 120, "the urgent job running in jobgate", 0.02)
            jobgate_s = time.perf_counter() - t1
            until(lambda: list(gate.states(fill_ids).values()).count("pending") >= 2, 60,
                  "the victims back in jobgate's queue", 0.1)
            after = gate.states(fill_ids)
            jobgate_lost = sum(1 for s in after.values() if s not in ("running", "pending"))
        finally:
            gate.close()
        cluster.cancel_everything()
        return {
            "nodes": nodes, "gpus_per_node": cluster.gpus_per_node, "bring_up_s": round(up_s, 1),
            "urgent_2x8_through_jobgate_s": round(jobgate_s, 2),
            "urgent_2x8_slurm_preemption_alone_s": round(slurm_alone, 2),
            "jobgate_vs_slurm_alone": round(jobgate_s / slurm_alone, 2),
            "victims_lost_through_jobgate": jobgate_lost,
            "victims_lost_slurm_alone": slurm_lost,
            "baseline": "Slurm's own partition preemption (PreemptMode=REQUEUE, GraceTime=0) of the same fill "
                        "submitted with sbatch, on a cluster of the same size, same run; jobgate's preemption "
                        "includes each victim's prepare signal and window (the fill exits on it at once)",
        }
    finally:
        stop_cluster_dir(cluster.env)


def run(n: int, nodes: int, rounds: int, through: int, trials: int, urgent_nodes: int,
        data_dir: Path) -> dict[str, Any]:
    cluster, up_s = start_cluster(nodes, prefix="jobgate-slurm-bench-")
    try:
        args = JobSpec(script=SCRIPT, account="vision", partition="batch", name="bench", gpus_per_node=1,
                       time_limit_min=10, comment="jobgate:bench", workdir=str(cluster.workdir),
                       hold=True).sbatch_args()
        ways: dict[str, Callable[[int], float]] = {
            "sbatch_shell_loop": lambda k: shell_loop(cluster, k, args),
            "sbatch_subprocess": lambda k: subprocess_loop(cluster, k, args),
            "client": lambda k: client_loop(cluster, k),
        }
        # Interleaved rounds in a rotating order, so that the machine's other load and the growing queue
        # weigh on the three ways alike.
        seconds = dict.fromkeys(ways, 0.0)
        per_round = max(1, n // rounds)
        names = list(ways)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                seconds[name] += ways[name](per_round)
        total = per_round * rounds
        assert queued(cluster) == total * len(ways), f"{queued(cluster)} jobs queued, {total * len(ways)} expected"
        figures: dict[str, Any] = {f"{name}_jobs_per_s": round(total / s, 1) for name, s in seconds.items()}
        client = cluster.client()
        t0 = time.perf_counter()
        seen = client.jobs()
        figures["client_jobs_read_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        t0 = time.perf_counter()
        subprocess.run(["squeue", "--json"], capture_output=True, check=True, **_as(cluster, cluster.service_user))
        figures["squeue_json_alone_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        assert len(seen) == total * len(ways)
        cluster.cancel_everything()
        base = figures["sbatch_shell_loop_jobs_per_s"]
        return {
            "benchmark": "slurm_submission",
            "jobs_per_way": total,
            "queued_when_read": len(seen),
            "nodes": nodes,
            "bring_up_s": round(up_s, 1),
            **figures,
            "client_vs_sbatch_shell_loop": round(figures["client_jobs_per_s"] / base, 3),
            "client_vs_sbatch_subprocess": round(figures["client_jobs_per_s"] / figures["sbatch_subprocess_jobs_per_s"],
                                                 3),
            "baseline": "sbatch_shell_loop: the same sbatch command in a bash loop, same user, same cluster, "
                        f"interleaved with the others in {rounds} rounds",
            "through_jobgate": through_jobgate(cluster, data_dir / "gateway", through, trials) if through else None,
        }
    finally:
        stop_cluster_dir(cluster.env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--through-jobgate", type=int, default=100, help="jobs submitted through jobgate (0: none)")
    ap.add_argument("--trials", type=int, default=5, help="out-of-band cancels timed")
    ap.add_argument("--urgent-nodes", type=int, default=64, help="nodes of the full cluster (0: no urgent run)")
    a = ap.parse_args()
    reason = why_no_slurm()
    if reason:
        print(json.dumps({"benchmark": "slurm_submission", "skipped": reason}))
        return 0
    with tempfile.TemporaryDirectory(prefix="jobgate-bench-slurm-") as tmp:
        out = run(a.jobs, a.nodes, a.rounds, a.through_jobgate, a.trials, a.urgent_nodes, Path(tmp))
        if a.urgent_nodes:
            out["urgent_on_a_full_cluster"] = urgent_on_a_full_cluster(a.urgent_nodes, Path(tmp) / "urgent")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
