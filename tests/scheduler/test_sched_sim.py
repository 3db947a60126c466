"""The simulator replays traces through run_cycle in virtual time; the trace generator is seeded and shaped."""

from __future__ import annotations

from itertools import pairwise

import pytest

from scheduler.model import ProjectId, Quotas, SchedulerConfig, TenantQuota
from scheduler.sim import SimCluster, TraceJob, jain, simulate
from scheduler.tracegen import generate


def test_generator_is_deterministic_and_shaped_like_gpu_cluster_traces() -> None:
    a, b = generate(4000, seed=3), generate(4000, seed=3)
    assert a == b and a != generate(4000, seed=4)
    sizes = [j.gpus_per_node * j.nodes for j in a]
    assert sizes.count(1) / len(sizes) > 0.6  # many single-GPU jobs
    assert 0.02 < sum(1 for s in sizes if s >= 16) / len(sizes) < 0.1  # a heavy tail of big gangs
    assert max(sizes) == 64 and all(j.gpus_per_node <= 8 for j in a)
    durations = sorted(j.duration_s for j in a)
    assert durations[0] < 600 and durations[-1] > 2 * 86400  # minutes to days
    assert all(x.submit_s <= y.submit_s for x, y in pairwise(a))


def job(i: int, at: float, gpus: int, duration: float, *, queue: str = "normal", tenant: str = "a",
        limit: float | None = None) -> TraceJob:
    return TraceJob(f"j{i}", at, tenant, f"{tenant}-u", queue, min(gpus, 8), max(1, gpus // 8), duration, limit)


def test_a_small_trace_runs_to_completion_with_sensible_figures() -> None:
    trace = [job(0, 0, 8, 3600), job(1, 0, 8, 3600), job(2, 60, 8, 600, limit=900)]
    r = simulate(trace, cluster=SimCluster(nodes=2, gpus_per_node=8))
    assert r.finished == 3 and r.preemptions == 0
    assert r.wait_s["all"]["n"] == 3
    assert r.wait_s["queue:normal"]["p95"] >= 3000  # j2 waited for one of the hour-long jobs
    assert 0 < r.utilisation <= 1


def test_urgent_work_preempts_and_the_victim_finishes_later() -> None:
    trace = [job(0, 0, 8, 4 * 3600), job(1, 7200, 8, 600, queue="urgent")]
    config = SchedulerConfig(min_runtime_s={"urgent": 0, "normal": 0, "batch": 0})
    r = simulate(trace, cluster=SimCluster(nodes=1, gpus_per_node=8), config=config)
    assert r.preemptions == 1 and r.finished == 2
    assert r.gpu_hours_lost == pytest.approx(8 * 2.0, rel=0.05)
    assert r.wait_s["queue:urgent"]["mean"] < 300


def test_jain_index() -> None:
    assert jain([1, 1, 1]) == 1.0
    assert jain([3, 0, 0]) == pytest.approx(1 / 3)
    assert jain([]) == 1.0


def test_two_configs_side_by_side_differ_where_they_should() -> None:
    trace = generate(600, seed=11, cluster_gpus=128, load=1.2)
    free = simulate(trace, cluster=SimCluster(nodes=16))
    # tenant01 may never borrow: its jobs above its 16 owned GPUs can never run, the rest wait longer.
    capped = simulate(trace, cluster=SimCluster(nodes=16),
                      quotas=Quotas(tenants={ProjectId("tenant01"): TenantQuota(16, borrow_limit=0)}))
    assert free.finished == 600
    never = sum(1 for j in trace if j.tenant == "tenant01" and j.gpus_per_node * j.nodes > 16)
    assert capped.finished == 600 - never
    assert capped.wait_s["tenant:tenant01"]["mean"] >= free.wait_s["tenant:tenant01"]["mean"]
