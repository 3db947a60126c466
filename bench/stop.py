"""Emergency-stop benchmark: N light real processes across M local agents, grace 0, two people deciding.

Measures, from the second person's approval to the last job confirmed stopped (evidence in), the total
time and the per-job stop latency (p50/p99, server side: job ended_at - approval time). The baseline,
measured in the same run on the same machine, is the floor: the same number of process groups spawned
and SIGKILLed directly, with no gateway, ledger or agents in between.

    .venv/bin/python bench/stop.py                 # 1,000 jobs over 20 agents (target ≤ 10 s), each job under
                                                   # its own uid and cgroup, beside the same with shared uids
    .venv/bin/python bench/stop.py --jobs 200 --agents 4

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Run as a script, this folder would come first on sys.path and its modules shadow the packages.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path[:0] = [str(_HERE.parent), str(_HERE.parent / "tests"), str(_HERE.parent / "tests" / "e2e")]

from stop_testkit import start_cluster, submit, wait_for  # noqa: E402

TARGET_S = 10.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def baseline(n: int) -> dict[str, float]:
    """Spawn n `sleep` process groups, then SIGKILL each group and reap it: the OS floor for n stops."""
    procs = [subprocess.Popen(["sleep", "100000"], start_new_session=True) for _ in range(n)]
    t0 = time.perf_counter()
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    return {"kill_and_reap_s": round(time.perf_counter() - t0, 4)}


def run(jobs: int, agents: int, work: Path, *, isolated: bool = True) -> dict[str, Any]:
    per_node = -(-jobs // agents)
    # A loaded two-core machine must not mistake slow heartbeats for lost nodes.
    cluster = start_cluster(work, nodes=agents, gpus=per_node, prefix="bn",
                            settings_overrides={"node_heartbeat_timeout_s": 20.0, "scheduler_interval_s": 1.0},
                            agent_args=() if isolated else ("--unsafe-jobs-share-agent-uid",))
    try:
        owners = [cluster.client("alice"), cluster.client("bob")]
        t_submit = time.perf_counter()
        with ThreadPoolExecutor(max_workers=8) as pool:
            ids = list(pool.map(lambda i: submit(owners[i % 2], f"light-{i}", ["sleep", "100000"],
                                                 environment="production", grace_seconds=30), range(jobs)))
        submit_s = time.perf_counter() - t_submit
        dave = cluster.client("dave")

        def all_running() -> bool:
            # GPUs in use, one per job: cheap to ask, unlike listing a thousand jobs.
            return sum(n["gpus_used"] for n in dave.get("/v1/nodes").json()["nodes"]) >= len(ids)

        t_run = time.perf_counter()
        wait_for(all_running, 600, f"{jobs} jobs to run", interval=0.5)
        start_s = time.perf_counter() - t_run
        body = {"scope": {"kind": "environment", "value": "production"}, "trigger": "safety",
                "reason": "benchmark: stop everything in production", "grace_seconds": 0}
        r = dave.post("/v1/emergency-stops", json=body)
        assert r.status_code == 202, r.text
        es = r.json()
        sam = cluster.client("sam")
        t0 = time.perf_counter()
        ok = sam.post(f"/v1/approvals/{es['approval_id']}/approve", json={"comment": "bench"})
        assert ok.status_code == 200, ok.text
        approve_call_s = time.perf_counter() - t0

        def done() -> dict[str, Any] | None:
            got = dave.get(f"/v1/emergency-stops/{es['id']}").json()
            return got if got["state"] == "done" else None

        # Polled gently: the stop latencies are measured server-side (ended_at - approval), not by this loop.
        final = wait_for(done, 300, "every job to be accounted for", interval=0.5)
        observed_s = time.perf_counter() - t0
        latencies = [j["stop_latency_s"] for j in final["jobs"] if j["stop_latency_s"] is not None]
        return {
            "jobs": jobs,
            "agents": agents,
            "grace_seconds": 0,
            "submit_s": round(submit_s, 2),
            "all_running_after_s": round(start_s, 2),
            "approve_call_s": round(approve_call_s, 3),
            "approval_to_last_confirmed_s": final["last_confirmed_after_s"],
            "approval_to_done_observed_s": round(observed_s, 3),
            "per_job_stop_latency_s": {"p50": round(percentile(latencies, 0.5), 3),
                                       "p99": round(percentile(latencies, 0.99), 3),
                                       "max": round(max(latencies), 3) if latencies else None,
                                       "mean": round(statistics.fmean(latencies), 3) if latencies else None},
            "summary": final["summary"],
            "target_s": TARGET_S,
            "meets_target": bool(final["last_confirmed_after_s"] is not None
                                 and final["last_confirmed_after_s"] <= TARGET_S),
        }
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--isolated-only", action="store_true",
                        help="skip the second run with jobs sharing the agents' uid (today's figure before H1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobgate-bench-stop-") as tmp:
        result = run(args.jobs, args.agents, Path(tmp) / "var")
    if os.geteuid() == 0 and not args.isolated_only:
        # Today's figure beside it: the same stop with the agents running jobs as their own user, as before H1's
        # per-job uids and cgroups (not root, the agents can only do that, and the figure above is that one).
        with tempfile.TemporaryDirectory(prefix="jobgate-bench-stop-") as tmp:
            shared = run(args.jobs, args.agents, Path(tmp) / "var", isolated=False)
        result["jobs_sharing_the_agents_uid"] = {k: shared[k] for k in (
            "approval_to_last_confirmed_s", "per_job_stop_latency_s", "submit_s", "summary")}
    result["isolation"] = "uid+cgroup per job" if os.geteuid() == 0 else "none (not root)"
    result["baseline_direct_killpg"] = baseline(args.jobs)
    # Other processes share these cores; the load average says how much.
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()]}
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
