"""Properties over random clusters with quotas: after any cycles, no quota tier and no node is exceeded,
and every gang is whole (Q4, Q5, Q6); the incremental victim plan equals the naive full-scan plan."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_builders import NOW

from scheduler.cycle import run_cycle
from scheduler.model import (
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
from scheduler.occupancy import frees_at
from scheduler.preemption import Victim, candidates, first_plan, may_preempt_from, plan_victims, plan_victims_naive
from scheduler.quota import QuotaTimeline, usage_of

TENANTS = [ProjectId("t0"), ProjectId("t1"), ProjectId("t2")]
USERS = ["u0", "u1", "u2", "u3"]
LIMIT = st.one_of(st.none(), st.integers(0, 24))


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[NodeState], Quotas, list[list[PendingJob]]]:
    nodes = [NodeState(NodeId(f"n{i}"), g, frozenset(range(g)))
             for i, g in enumerate(draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=6)))]
    tenants = {t: TenantQuota(draw(st.integers(0, 16)), borrow_limit=draw(LIMIT), lend_limit=draw(LIMIT),
                              users={u: draw(st.integers(0, 8)) for u in USERS if draw(st.booleans())})
               for t in TENANTS if draw(st.booleans())}
    users = {u: draw(st.integers(0, 16)) for u in USERS if draw(st.booleans())}
    quotas = Quotas(cluster_gpus=draw(st.one_of(st.none(), st.integers(0, 48))), tenants=tenants, users=users)
    waves = []
    k = 0
    for _ in range(draw(st.integers(1, 3))):
        wave = []
        for _ in range(draw(st.integers(0, 8))):
            wave.append(PendingJob(JobId(f"j{k}"), draw(st.sampled_from(TENANTS)), draw(st.sampled_from(USERS)),
                                   draw(st.sampled_from(["urgent", "normal", "batch"])),
                                   gpus_per_node=draw(st.sampled_from([1, 2, 4, 8])), nodes=draw(st.integers(1, 2)),
                                   submitted_at=NOW - timedelta(minutes=draw(st.integers(0, 600)))))
            k += 1
        waves.append(wave)
    return nodes, quotas, waves


def _check(nodes: list[NodeState], quotas: Quotas, run: list[RunningJob]) -> None:
    owned: dict[str, int] = defaultdict(int)
    borrowed: dict[str, int] = defaultdict(int)
    users: dict[str, int] = defaultdict(int)
    tenant_users: dict[tuple[str, str], int] = defaultdict(int)
    per_node: dict[str, set[int]] = defaultdict(set)
    for r in run:
        (borrowed if r.borrowed else owned)[r.project] += r.gpus
        users[r.user] += r.gpus
        tenant_users[r.project, r.user] += r.gpus
        for p in r.placement:
            assert not per_node[p.node] & set(p.gpus), "a GPU given twice"
            per_node[p.node] |= set(p.gpus)
    capacity = {n.id: n.gpus for n in nodes}
    for node_id, gpus in per_node.items():
        assert max(gpus) < capacity[node_id]
    total = sum(owned.values()) + sum(borrowed.values())
    if quotas.cluster_gpus is not None:
        assert total <= quotas.cluster_gpus
    for t in TENANTS:
        q = quotas.tenant(t)
        assert owned[t] <= q.gpus
        if q.borrow_limit is not None:
            assert borrowed[t] <= q.borrow_limit
        for u, limit in q.users.items():
            assert tenant_users[t, u] <= limit
    for u, limit in quotas.users.items():
        assert users[u] <= limit
    # Borrowed GPUs come from idle owned quota within lend caps, or from capacity nobody owns.
    owned_quota = sum(q.gpus for q in quotas.tenants.values())
    cluster = sum(capacity.values()) if quotas.cluster_gpus is None else min(sum(capacity.values()),
                                                                              quotas.cluster_gpus)
    pool = max(0, cluster - owned_quota) + sum(
        min(q.gpus, q.lend_limit) if q.lend_limit is not None else q.gpus for q in quotas.tenants.values())
    assert sum(borrowed.values()) <= pool


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_tier_or_node_is_ever_exceeded_and_gangs_are_whole(world: tuple[list[NodeState], Quotas,
                                                                             list[list[PendingJob]]]) -> None:
    nodes, quotas, waves = world
    run: list[RunningJob] = []
    pending: list[PendingJob] = []
    for wave in waves:
        pending += wave
        used: dict[str, set[int]] = defaultdict(set)
        for r in run:
            for p in r.placement:
                used[p.node] |= set(p.gpus)
        snapshot = Snapshot(tuple(NodeState(n.id, n.gpus, n.free - used[n.id]) for n in nodes), tuple(pending),
                            tuple(run), quotas=quotas)
        result = run_cycle(snapshot, now=NOW)
        by_id = {j.id: j for j in pending}
        for a in result.admits:
            j = by_id[a.job_id]
            assert len(a.placement) == j.nodes and len({p.node for p in a.placement}) == j.nodes
            assert all(len(p.gpus) == j.gpus_per_node for p in a.placement)
            run.append(RunningJob(j.id, j.project, j.user, j.queue, a.priority.total, NOW, a.placement,
                                  borrowed=a.borrowed))
        admitted = {a.job_id for a in result.admits}
        pending = [j for j in pending if j.id not in admitted]
        _check(nodes, quotas, run)


@st.composite
def victim_cases(draw: st.DrawFn) -> tuple[list[NodeState], list[RunningJob], int, int]:
    nodes: list[NodeState] = []
    run: list[RunningJob] = []
    for i in range(draw(st.integers(1, 6))):
        nid = NodeId(f"n{i}")
        g = 8
        cut = sorted(draw(st.sets(st.integers(1, 7), max_size=3)))
        edges = [0, *cut, draw(st.integers(max(cut, default=0), 8))]
        for k, (a, b) in enumerate(pairwise(edges)):
            if b > a:
                started = NOW - timedelta(hours=draw(st.integers(1, 5)))
                run.append(RunningJob(JobId(f"r{i}-{k}"), TENANTS[k % 3], "u", "normal",
                                      float(draw(st.integers(0, 5))), started,
                                      (Placement(nid, tuple(range(a, b))),), borrowed=draw(st.booleans())))
        nodes.append(NodeState(nid, g, frozenset(range(edges[-1], g))))
    return nodes, run, draw(st.sampled_from([1, 4, 8])), draw(st.integers(1, 4))


@settings(max_examples=200, deadline=None)
@given(victim_cases())
def test_victim_plan_matches_the_naive_full_scan(case: tuple[list[NodeState], list[RunningJob], int, int]) -> None:
    nodes, run, g, n = case
    ordered = candidates(run, now=NOW, config=SchedulerConfig(), preemptor_priority=100.0,
                         preemptor_project="t9", reclaim=False)
    assert plan_victims(nodes, ordered, g, n) == plan_victims_naive(nodes, ordered, g, n)


@settings(max_examples=200, deadline=None)
@given(worlds(), st.lists(st.integers(1, 12), min_size=30, max_size=30))
def test_the_quota_timeline_lets_a_job_in_when_replaying_every_end_would(
        world: tuple[list[NodeState], Quotas, list[list[PendingJob]]], hours: list[int]) -> None:
    """scheduler.estimate rule 5: QuotaTimeline's bisections give the first instant at which QuotaUsage.check
    passes, as replaying the running jobs' ends one instant after another and checking after each does."""
    nodes, quotas, waves = world
    pending = [j for wave in waves for j in wave]
    first = run_cycle(Snapshot(tuple(nodes), tuple(pending), quotas=quotas), now=NOW)
    by_id = {j.id: j for j in pending}
    run = [RunningJob(a.job_id, by_id[a.job_id].project, by_id[a.job_id].user, by_id[a.job_id].queue, 0.0, NOW,
                      a.placement, runtime_limit_s=hours[i % len(hours)] * 3600.0, borrowed=a.borrowed)
           for i, a in enumerate(first.admits)]
    admitted = {a.job_id for a in first.admits}
    used: dict[str, set[int]] = defaultdict(set)
    for r in run:
        for p in r.placement:
            used[p.node] |= set(p.gpus)
    snapshot = Snapshot(tuple(NodeState(n.id, n.gpus, n.free - used[n.id]) for n in nodes),
                        tuple(j for j in pending if j.id not in admitted), tuple(run), quotas=quotas)
    grouped: dict[object, list[RunningJob]] = defaultdict(list)
    for r in run:
        grouped[frees_at(r).at].append(r)
    ends = [grouped[t] for t in sorted(grouped)]  # type: ignore[type-var]
    sizes = sorted(n.gpus for n in nodes)

    def placeable(j: PendingJob) -> bool:
        return sum(1 for s in sizes if s >= j.gpus_per_node) >= j.nodes

    timeline = QuotaTimeline(usage_of(snapshot, placeable), ends)  # type: ignore[arg-type]
    for job in snapshot.pending:
        replay = usage_of(snapshot, placeable)
        assert replay is not None
        expected = 0 if replay.check(job.project, job.user, job.gpus, may_borrow=job.stoppable).ok else None
        for step, jobs in enumerate(ends, start=1):
            if expected is not None:
                break
            for r in jobs:
                replay.remove(r.project, r.user, r.gpus, r.borrowed)
            if replay.check(job.project, job.user, job.gpus, may_borrow=job.stoppable).ok:
                expected = step
        assert timeline.first_step(job.project, job.user, job.gpus, may_borrow=job.stoppable) == expected


@settings(max_examples=200, deadline=None)
@given(victim_cases(), st.lists(st.integers(-20, 0), min_size=24, max_size=24))
def test_the_first_plan_comes_when_checking_every_later_instant_would_find_one(
        case: tuple[list[NodeState], list[RunningJob], int, int], minutes: list[int]) -> None:
    """Rule 6 with P2: first_plan's time is the first instant a victim passes its minimum runtime at which a
    plan exists, as trying plan_victims at each of those instants finds, with the same victims."""
    nodes, run, g, n = case
    run = [replace(r, started_at=NOW + timedelta(minutes=minutes[i % len(minutes)])) for i, r in enumerate(run)]
    config = SchedulerConfig()

    def plan_at(t: datetime) -> tuple[Victim, ...] | None:
        return plan_victims(nodes, candidates(run, now=t, config=config, preemptor_priority=100.0,
                                              preemptor_project="t9", reclaim=False), g, n)

    if plan_at(NOW) is not None:
        return  # a plan now: first_plan is asked only when there is none
    later = sorted({t for r in run if (t := may_preempt_from(r, config)) > NOW})
    expected = next(((t, plan_at(t)) for t in later if plan_at(t)), None)
    assert first_plan(nodes, run, g, n, now=NOW, config=config, preemptor_priority=100.0, preemptor_project="t9",
                      reclaim=False) == expected
