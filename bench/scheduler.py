"""Scheduler benchmarks on the reference state: 1,000 nodes x 8 GPUs, 5,000 running jobs, 10,000 waiting,
50 tenants with quotas and borrowing, 500 users. Every figure is printed beside a naive baseline measured
in the same run on the same seeded data, with a check that both decide the same.

  cycle        full run_cycle (aging, fair share, ordering, quotas, gang placement, reservation,
               backfill over the top 500, one victim search) vs the full sort-and-scan twin
  victims      victim selection for one 64-GPU urgent gang vs a full cluster rescan after every step
  estimates    start estimates for all waiting jobs vs a sort-and-scan estimator (same subset timed)
  stretch      4,000 nodes / 50,000 waiting in a child process: cycle time and peak RSS
  simulator    a seeded trace replayed in virtual time (5,000 jobs; --big: 100,000) vs the naive cycle

Prints one JSON object.  Usage: .venv/bin/python bench/scheduler.py [--runs N] [--seed S] [--big]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# Run as `python bench/scheduler.py`, this folder leads sys.path and this file would shadow the package.
sys.path.remove(str(Path(__file__).resolve().parent))  # only ever run as a script, which puts it there

from scheduler.cycle import _cycle, run_cycle
from scheduler.estimate import estimate_starts
from scheduler.model import (
    QUEUES,
    JobId,
    NodeId,
    NodeState,
    PendingJob,
    Placement,
    ProjectId,
    Quotas,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    TenantQuota,
)
from scheduler.placement import ScanIndex
from scheduler.preemption import candidates, plan_victims, plan_victims_naive
from scheduler.priority import effective_priority
from scheduler.sim import SimCluster, simulate
from scheduler.tracegen import generate

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPUS, DEAD_PER_1000, TENANTS, USERS = 8, 10, 50, 500
# (gpus_per_node, nodes, weight): mostly small jobs, some whole nodes, a few multi-node gangs.
RUNNING_SHAPES = [(1, 1, 78), (2, 1, 12), (4, 1, 6), (8, 1, 3), (8, 2, 1)]
PENDING_SHAPES = [(1, 1, 50), (2, 1, 20), (4, 1, 12), (8, 1, 10), (8, 2, 5), (8, 4, 2), (8, 16, 1)]
LIMITS_H = [None, 1, 2, 4, 8, 12, 24, 48]


def _shape(rng: random.Random, shapes: list[tuple[int, int, int]]) -> tuple[int, int]:
    g, n, _ = rng.choices(shapes, weights=[w for _, _, w in shapes])[0]
    return g, n


def reference_state(seed: int, nodes: int = 1000, running_n: int = 5000, pending_n: int = 10_000) -> Snapshot:
    """A seeded cluster with quotas: 80 % of the GPUs are owned by 50 tenants, each may borrow 64."""
    rng = random.Random(seed)
    free = {i: list(range(GPUS)) for i in range(nodes)}
    capacity = nodes * GPUS
    quota = capacity * 8 // 10 // TENANTS
    tenants = {ProjectId(f"p{t}"): TenantQuota(quota, borrow_limit=64 + quota,
                                               lend_limit=None if t % 3 else quota // 2) for t in range(TENANTS)}
    owned: dict[str, int] = {}
    running: list[RunningJob] = []
    while len(running) < running_n:
        g, n = _shape(rng, RUNNING_SHAPES)
        fitting = [i for i in rng.sample(range(nodes), 40) if len(free[i]) >= g]
        if len(fitting) < n:
            g, n = 1, 1
            fitting = [i for i in range(nodes) if free[i]][:1]
        placement = []
        for i in fitting[:n]:
            take, free[i] = free[i][:g], free[i][g:]
            placement.append(Placement(NodeId(f"node-{i:04d}"), tuple(take)))
        project = ProjectId(f"p{rng.randrange(TENANTS)}")
        borrowed = owned.get(project, 0) + g * n > quota
        if not borrowed:
            owned[project] = owned.get(project, 0) + g * n
        limit = rng.choice(LIMITS_H)
        running.append(RunningJob(
            JobId(f"run-{len(running):05d}"), project, f"u{rng.randrange(USERS)}", rng.choice(QUEUES),
            float(rng.randrange(100, 900)), NOW - timedelta(minutes=rng.randrange(30, 24 * 60)), tuple(placement),
            None if limit is None else limit * 3600.0, borrowed=borrowed))
    dead = set(rng.sample(range(nodes), nodes * DEAD_PER_1000 // 1000))
    node_states = tuple(NodeState(NodeId(f"node-{i:04d}"), GPUS, frozenset(free[i]), alive=i not in dead)
                        for i in range(nodes))
    pending = []
    for k in range(pending_n):
        g, n = _shape(rng, PENDING_SHAPES)
        limit = rng.choice(LIMITS_H)
        pending.append(PendingJob(
            JobId(f"job-{k:05d}"), ProjectId(f"p{rng.randrange(TENANTS)}"), f"u{rng.randrange(USERS)}",
            rng.choices(QUEUES, weights=[5, 60, 35])[0], g, n,
            NOW - timedelta(minutes=rng.randrange(0, 72 * 60)), float(rng.randrange(0, 50)),
            None if limit is None else limit * 3600.0))
    usage = {ProjectId(f"p{t}"): float(rng.randrange(0, 5000)) for t in range(TENANTS)}
    return Snapshot(node_states, tuple(pending), tuple(running), quotas=Quotas(tenants=tenants), usage=usage)


def timed(fn: Callable[[], Any], runs: int) -> tuple[dict[str, float], Any]:
    """Wall-clock p50/p95, and the median CPU time of this process (less sensitive to a loaded machine)."""
    times, cpu = [], []
    result = fn()  # warm-up, and the result compared below
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return {"p50_ms": round(statistics.median(times), 2), "p95_ms": round(p95, 2),
            "cpu_p50_ms": round(statistics.median(cpu), 2), "runs": runs}, result


def bench_cycle(snapshot: Snapshot, runs: int) -> dict[str, Any]:
    config = SchedulerConfig()
    fast, fast_result = timed(lambda: run_cycle(snapshot, now=NOW, config=config), runs)
    naive, naive_result = timed(lambda: _cycle(snapshot, NOW, config, ScanIndex, shortcuts=False), max(1, runs // 3))
    plain = Snapshot(snapshot.nodes, snapshot.pending, snapshot.running)
    no_quotas, _ = timed(lambda: run_cycle(plain, now=NOW, config=config), runs)
    return {"run_cycle": fast, "naive_scan_baseline": naive, "run_cycle_without_quotas": no_quotas,
            "speedup_p50": round(naive["p50_ms"] / fast["p50_ms"], 1), "same_decisions": fast_result == naive_result,
            "decisions": {"admits": len(fast_result.admits), "borrowed": sum(a.borrowed for a in fast_result.admits),
                          "reservations": len(fast_result.reservations), "blocked": len(fast_result.blocked),
                          "preemption_plans": len(fast_result.preemptions)},
            "targets": {"p50_ms": 200, "p95_ms": 500}}


def bench_victims(snapshot: Snapshot, runs: int) -> dict[str, Any]:
    config = SchedulerConfig()
    gang = PendingJob(JobId("urgent-64"), ProjectId("p0"), "u0", "urgent", 8, 8, NOW)
    prio = effective_priority(gang, NOW, config).total

    def plan(fn: Callable[..., Any]) -> Any:
        ordered = candidates(snapshot.running, now=NOW, config=config, preemptor_priority=prio,
                             preemptor_project=gang.project, reclaim=False)
        return fn(snapshot.nodes, ordered, gang.gpus_per_node, gang.nodes)

    fast, fast_plan = timed(lambda: plan(plan_victims), runs)
    naive, naive_plan = timed(lambda: plan(plan_victims_naive), max(1, runs // 3))
    return {"gang": "8 nodes x 8 GPUs, urgent", "plan_victims": fast, "naive_rescan_baseline": naive,
            "speedup_p50": round(naive["p50_ms"] / fast["p50_ms"], 1), "same_plan": fast_plan == naive_plan,
            "victims": len(fast_plan or ()), "target_ms": 50}


def naive_estimates(snapshot: Snapshot, order: Sequence[PendingJob], config: SchedulerConfig) -> dict[JobId, Any]:
    """Sort-and-scan estimator: every fit check rebuilds and sorts the per-node free list."""
    free = {n.id: len(n.free) for n in snapshot.nodes if n.alive}
    events = sorted((max(0.0, ((r.stop_by or r.started_at + timedelta(seconds=r.runtime_limit_s
                                                                       or config.default_runtime_s)) - NOW)
                          .total_seconds()), p.node, len(p.gpus))
                    for r in snapshot.running for p in r.placement if p.node in free)
    out: dict[JobId, Any] = {}
    t = 0.0
    for job in order:
        def fitting(g: int = job.gpus_per_node) -> list[NodeId]:
            return [n for c, n in sorted((c, n) for n, c in free.items()) if c >= g]
        while len(fitting()) < job.nodes and events:
            at, node, gpus = events.pop(0)
            t = max(t, at)
            free[node] += gpus
        chosen = fitting()[:job.nodes]
        if len(chosen) < job.nodes:
            out[job.id] = None
            continue
        out[job.id] = NOW + timedelta(seconds=t)
        end = t + (job.runtime_limit_s or config.default_runtime_s)
        for node in chosen:
            free[node] -= job.gpus_per_node
            events.append((end, node, job.gpus_per_node))
        events.sort()
    return out


def bench_estimates(snapshot: Snapshot, runs: int) -> dict[str, Any]:
    config = SchedulerConfig()
    result = run_cycle(snapshot, now=NOW, config=config)
    waiting = {b.job_id for b in result.blocked}
    order = sorted((j for j in snapshot.pending if j.id in waiting),
                   key=lambda j: (-result.priorities[j.id].total, j.submitted_at, j.id))
    fast, est = timed(lambda: estimate_starts(snapshot, order, now=NOW, config=config), runs)
    subset = order[:300]
    fast_sub, est_sub = timed(lambda: estimate_starts(snapshot, subset, now=NOW, config=config), runs)
    naive_sub, naive_est = timed(lambda: naive_estimates(snapshot, subset, config), 1)
    return {"jobs": len(order), "estimate_starts_all": fast, "target_ms": 1000,
            "subset_jobs": len(subset), "estimate_starts_subset": fast_sub, "naive_sort_scan_subset": naive_sub,
            "speedup_p50_subset": round(naive_sub["p50_ms"] / max(fast_sub["p50_ms"], 0.01), 1),
            "same_estimates_subset": est_sub == naive_est, "with_estimate": sum(v is not None for v in est.values())}


def bench_stretch(seed: int) -> dict[str, Any]:
    """Runs in a child so its peak RSS is its own."""
    child = subprocess.run([sys.executable, __file__, "--only-stretch", "--seed", str(seed)], capture_output=True,
                           text=True, timeout=1800, check=True)
    return dict(json.loads(child.stdout))


def stretch_child(seed: int) -> None:
    snapshot = reference_state(seed, nodes=4000, running_n=20_000, pending_n=50_000)
    config = SchedulerConfig()
    fast, result = timed(lambda: run_cycle(snapshot, now=NOW, config=config), 3)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    _cycle(snapshot, NOW, config, ScanIndex, shortcuts=False)  # one run: it is slow
    naive = {"p50_ms": round((time.perf_counter() - t0) * 1000, 2), "runs": 1}
    print(json.dumps({"state": {"nodes": 4000, "running": 20_000, "pending": 50_000}, "run_cycle": fast,
                      "naive_scan_baseline_single_run": naive, "peak_rss_mib": round(rss_mib, 1),
                      "speedup": round(naive["p50_ms"] / fast["p50_ms"], 1), "admits": len(result.admits),
                      "targets": {"cycle_ms": 2000, "rss_mib": 1024}}))


def bench_simulator(seed: int, jobs: int) -> dict[str, Any]:
    cluster = SimCluster(nodes=64, gpus_per_node=8)
    trace = generate(jobs, seed=seed, cluster_gpus=512, load=0.85)
    t0, c0 = time.perf_counter(), time.process_time()
    report = simulate(trace, cluster=cluster)
    fast_s, fast_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    small = trace[:500]
    t0 = time.perf_counter()
    fast_small = simulate(small, cluster=cluster)
    fast_small_s = time.perf_counter() - t0

    def naive_cycle(snap: Snapshot, *, now: datetime, config: SchedulerConfig) -> Any:
        return _cycle(snap, now, config, ScanIndex, shortcuts=False)

    t0 = time.perf_counter()
    naive_small = simulate(small, cluster=cluster, cycle=naive_cycle)
    naive_small_s = time.perf_counter() - t0
    return {"jobs": jobs, "cluster": "64 nodes x 8 GPUs", "wall_s": round(fast_s, 2), "cpu_s": round(fast_cpu_s, 2),
            "target_s_for_100k": 600,
            "virtual_days": round(report.makespan_s / 86400, 1), "cycles": report.cycles,
            "utilisation": round(report.utilisation, 3), "preemptions": report.preemptions,
            "subset_500_jobs": {"wall_s": round(fast_small_s, 2), "naive_cycle_wall_s": round(naive_small_s, 2),
                                "same_report": fast_small.as_dict() == naive_small.as_dict()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20260302)
    parser.add_argument("--big", action="store_true", help="simulate the 100,000-job trace (minutes)")
    parser.add_argument("--sim-jobs", type=int, default=None, help="simulated trace length (default 5,000)")
    parser.add_argument("--skip-stretch", action="store_true", help="leave out the 4,000-node stretch")
    parser.add_argument("--only-sim", action="store_true", help="run only the simulator benchmark")
    parser.add_argument("--only-stretch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only_stretch:
        stretch_child(args.seed)
        return
    if args.only_sim:
        jobs = args.sim_jobs or (100_000 if args.big else 5000)
        print(json.dumps({"bench": "scheduler.simulator", "load_average_at_start": list(os.getloadavg()),
                          "simulator": bench_simulator(args.seed, jobs)}, indent=2))
        return
    snapshot = reference_state(args.seed)
    out: dict[str, Any] = {
        "bench": "scheduler",
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 1) for x in os.getloadavg()],
        "state": {"nodes": 1000, "gpus_per_node": GPUS, "running": len(snapshot.running),
                  "pending": len(snapshot.pending), "tenants": TENANTS, "users": USERS, "seed": args.seed,
                  "free_gpus": sum(len(n.free) for n in snapshot.nodes if n.alive),
                  "borrowed_running": sum(r.borrowed for r in snapshot.running)},
        "cycle": bench_cycle(snapshot, args.runs),
        "victims": bench_victims(snapshot, args.runs),
        "estimates": bench_estimates(snapshot, max(1, args.runs // 2)),
    }
    if not args.skip_stretch:
        out["stretch"] = bench_stretch(args.seed)
    out["simulator"] = bench_simulator(args.seed, args.sim_jobs or (100_000 if args.big else 5000))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
