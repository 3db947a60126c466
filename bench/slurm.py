"""Slurm submission benchmark: jobs/s through the typed client beside `sbatch` alone, same cluster, same run.

Starts a local cluster with deploy/slurm (4 nodes x 8 GPUs; needs root on Debian and MariaDB on
127.0.0.1:3306), then submits N held jobs (held, so that the machine measures submission, not running)
as jobgate's service user three ways, interleaved in rounds:

- `sbatch_shell_loop`: the baseline, a bash loop of `sbatch --parsable --hold` (Slurm's own cost);
- `sbatch_subprocess`: the same command from Python's subprocess, nothing else;
- `client`: SlurmClient.submit(JobSpec(...)), which checks the spec, runs sbatch and parses its id.

Then one `SlurmClient.jobs()` (squeue --json, parsed) with the 3 x N jobs queued, and `squeue --json` alone.

    .venv/bin/python bench/slurm.py              # 300 jobs
    .venv/bin/python bench/slurm.py --jobs 100

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pwd
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script, this folder would come first on sys.path and its modules shadow the packages.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path[:0] = [str(_HERE.parent), str(_HERE.parent / "tests" / "gateway" / "execution" / "slurm")]

from slurm_testkit import LocalCluster, start_cluster, stop_cluster_dir, why_no_slurm  # noqa: E402

from gateway.execution.slurm import JobSpec  # noqa: E402

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


def run(n: int, nodes: int, rounds: int) -> dict[str, Any]:
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
        }
    finally:
        stop_cluster_dir(cluster.env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    reason = why_no_slurm()
    if reason:
        print(json.dumps({"benchmark": "slurm_submission", "skipped": reason}))
        return 0
    print(json.dumps(run(a.jobs, a.nodes, a.rounds), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
