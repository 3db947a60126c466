"""Scheduler cycle on the reference state: 1,000 nodes x 8 GPUs, 5,000 running jobs, 10,000 waiting.

Times run_cycle (bucket index, early stop) beside the naive baseline (every fit check sorts and scans all
nodes, no early stop) in the same run, on the same seeded snapshot, and checks both decide the same.
Prints one JSON object.  Usage: .venv/bin/python bench/scheduler.py [--runs N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Run as `python bench/scheduler.py`, this folder leads sys.path and this file would shadow the package.
sys.path.remove(str(Path(__file__).resolve().parent))  # only ever run as a script, which puts it there

from scheduler.cycle import CycleResult, _cycle, run_cycle
from scheduler.model import (
    QUEUES,
    JobId,
    NodeId,
    NodeState,
    PendingJob,
    Placement,
    ProjectId,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)
from scheduler.placement import ScanIndex

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODES, GPUS, RUNNING, PENDING, DEAD = 1000, 8, 5000, 10_000, 10
# (gpus_per_node, nodes, weight): mostly small jobs, some whole nodes, a few multi-node gangs.
RUNNING_SHAPES = [(1, 1, 78), (2, 1, 12), (4, 1, 6), (8, 1, 3), (8, 2, 1)]
PENDING_SHAPES = [(1, 1, 50), (2, 1, 20), (4, 1, 12), (8, 1, 10), (8, 2, 5), (8, 4, 2), (8, 16, 1)]
LIMITS_H = [None, 1, 2, 4, 8, 12, 24, 48]


def _shape(rng: random.Random, shapes: list[tuple[int, int, int]]) -> tuple[int, int]:
    g, n, _ = rng.choices(shapes, weights=[w for _, _, w in shapes])[0]
    return g, n


def reference_state(seed: int) -> Snapshot:
    rng = random.Random(seed)
    free = {i: list(range(GPUS)) for i in range(NODES)}
    running: list[RunningJob] = []
    while len(running) < RUNNING:
        g, n = _shape(rng, RUNNING_SHAPES)
        fitting = [i for i in rng.sample(range(NODES), 40) if len(free[i]) >= g]
        if len(fitting) < n:
            g, n = 1, 1
            fitting = [i for i in range(NODES) if free[i]][:1]
        placement = []
        for i in fitting[:n]:
            take, free[i] = free[i][:g], free[i][g:]
            placement.append(Placement(NodeId(f"node-{i:04d}"), tuple(take)))
        limit = rng.choice(LIMITS_H)
        running.append(RunningJob(
            JobId(f"run-{len(running):05d}"), ProjectId(f"p{rng.randrange(40)}"), f"u{rng.randrange(300)}",
            rng.choice(QUEUES), 0.0, NOW - timedelta(minutes=rng.randrange(0, 24 * 60)), tuple(placement),
            None if limit is None else limit * 3600.0))
    dead = set(rng.sample(range(NODES), DEAD))
    nodes = tuple(NodeState(NodeId(f"node-{i:04d}"), GPUS, frozenset(free[i]), alive=i not in dead)
                  for i in range(NODES))
    pending = []
    for k in range(PENDING):
        g, n = _shape(rng, PENDING_SHAPES)
        limit = rng.choice(LIMITS_H)
        pending.append(PendingJob(
            JobId(f"job-{k:05d}"), ProjectId(f"p{rng.randrange(40)}"), f"u{rng.randrange(300)}",
            rng.choices(QUEUES, weights=[5, 60, 35])[0], g, n,
            NOW - timedelta(minutes=rng.randrange(0, 72 * 60)), float(rng.randrange(0, 50)),
            None if limit is None else limit * 3600.0))
    return Snapshot(nodes, tuple(pending), tuple(running))


def timed(fn: Callable[[], CycleResult], runs: int) -> tuple[dict[str, float], CycleResult]:
    times = []
    result = fn()  # warm-up, and the result compared below
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return {"p50_ms": round(statistics.median(times), 2), "p95_ms": round(p95, 2), "runs": runs}, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20260302)
    args = parser.parse_args()
    snapshot = reference_state(args.seed)
    config = SchedulerConfig()
    fast, fast_result = timed(lambda: run_cycle(snapshot, now=NOW, config=config), args.runs)
    naive, naive_result = timed(lambda: _cycle(snapshot, NOW, config, ScanIndex, shortcuts=False), args.runs)
    free = sum(len(n.free) for n in snapshot.nodes if n.alive)
    print(json.dumps({
        "bench": "scheduler.run_cycle",
        "python": platform.python_version(),
        "state": {"nodes": NODES, "gpus_per_node": GPUS, "dead_nodes": DEAD, "running": len(snapshot.running),
                  "pending": len(snapshot.pending), "free_gpus": free, "seed": args.seed},
        "run_cycle": fast,
        "naive_scan_baseline": naive,
        "speedup_p50": round(naive["p50_ms"] / fast["p50_ms"], 1),
        "same_decisions": fast_result == naive_result,
        "decisions": {"admits": len(fast_result.admits), "reservations": len(fast_result.reservations),
                      "blocked": len(fast_result.blocked)},
    }, indent=2))


if __name__ == "__main__":
    main()
