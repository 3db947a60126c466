"""Properties of run_cycle over random clusters: no over-allocation, whole gangs, one answer per job,
determinism, the bucket index agreeing with a full scan, and backfill never delaying the reservation."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_builders import NOW

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

LIMITS = st.one_of(st.none(), st.sampled_from([600.0, 1800.0, 3600.0, 7200.0]))


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes: list[NodeState] = []
    running: list[RunningJob] = []
    for i in range(draw(st.integers(0, 7))):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        busy = draw(st.sets(st.integers(0, gpus - 1)))
        nid = NodeId(f"n{i}")
        alive: bool = draw(st.booleans()) or i == 0  # at least one alive node, most of the time more
        nodes.append(NodeState(nid, gpus, frozenset(range(gpus)) - busy, alive=alive,
                               isolated=draw(st.sampled_from([True, True, False]))))
        if busy and draw(st.booleans()):  # busy GPUs held by a known running job (else by something unknown)
            running.append(RunningJob(
                JobId(f"r{i}"), ProjectId("p"), "u", "normal", 0.0,
                NOW - timedelta(minutes=draw(st.integers(0, 180))),
                (Placement(nid, tuple(sorted(busy))),), draw(LIMITS)))
    pending = [
        PendingJob(JobId(f"j{k}"), ProjectId("p"), "u", draw(st.sampled_from(QUEUES)),
                   gpus_per_node=draw(st.sampled_from([1, 1, 2, 3, 4, 8])), nodes=draw(st.integers(1, 3)),
                   submitted_at=NOW - timedelta(minutes=draw(st.integers(0, 3000))),
                   base_priority=float(draw(st.integers(0, 3)) * 10), runtime_limit_s=draw(LIMITS),
                   needs_isolation=draw(st.sampled_from([False, False, True])))
        for k in range(draw(st.integers(0, 12)))
    ]
    return Snapshot(tuple(nodes), tuple(pending), tuple(running))


CONFIGS = st.builds(SchedulerConfig, reservation_window_s=st.sampled_from([1800.0, 3600.0, 7200.0]),
                    backfill_depth=st.integers(0, 6))


@settings(max_examples=300, deadline=None)
@given(snapshots(), CONFIGS)
def test_no_node_over_allocated_and_gangs_whole(snapshot: Snapshot, config: SchedulerConfig) -> None:
    """Q6 gangs all or nothing, which Q7 rests on: no admit ever takes part of a gang; H1: a job that needs
    isolation is only ever placed on nodes that isolate jobs."""
    result = run_cycle(snapshot, now=NOW, config=config)
    free = {n.id: n.free for n in snapshot.nodes if n.alive}
    isolated = {n.id for n in snapshot.nodes if n.isolated}
    jobs = {j.id: j for j in snapshot.pending}
    taken: set[tuple[str, int]] = set()
    for admit in result.admits:
        spec = jobs[admit.job_id]
        assert len(admit.placement) == spec.nodes
        assert len({p.node for p in admit.placement}) == spec.nodes
        for p in admit.placement:
            assert p.node in isolated or not spec.needs_isolation
            assert len(p.gpus) == len(set(p.gpus)) == spec.gpus_per_node
            assert set(p.gpus) <= free[p.node]
            gpus = {(p.node, g) for g in p.gpus}
            assert not gpus & taken
            taken |= gpus


@settings(max_examples=300, deadline=None)
@given(snapshots(), CONFIGS)
def test_one_answer_per_job_and_positions_per_queue(snapshot: Snapshot, config: SchedulerConfig) -> None:
    result = run_cycle(snapshot, now=NOW, config=config)
    answered = [a.job_id for a in result.admits] + [b.job_id for b in result.blocked]
    assert sorted(answered) == sorted(j.id for j in snapshot.pending)
    queue = {j.id: j.queue for j in snapshot.pending}
    for q in QUEUES:
        assert [b.position for b in result.blocked if queue[b.job_id] == q] == list(
            range(1, 1 + sum(1 for b in result.blocked if queue[b.job_id] == q)))
    assert len(result.reservations) <= 1
    for r in result.reservations:
        assert r.job_id in {b.job_id for b in result.blocked}
        assert r.expected_start >= NOW


@settings(max_examples=200, deadline=None)
@given(snapshots(), CONFIGS, st.randoms(use_true_random=False))
def test_deterministic_whatever_the_input_order(snapshot: Snapshot, config: SchedulerConfig,
                                               rng: random.Random) -> None:
    nodes, pending, run = list(snapshot.nodes), list(snapshot.pending), list(snapshot.running)
    rng.shuffle(nodes)
    rng.shuffle(pending)
    rng.shuffle(run)
    shuffled = Snapshot(tuple(nodes), tuple(pending), tuple(run))
    assert run_cycle(shuffled, now=NOW, config=config) == run_cycle(snapshot, now=NOW, config=config)


@settings(max_examples=300, deadline=None)
@given(snapshots(), CONFIGS)
def test_bucket_index_and_shortcuts_agree_with_full_scan(snapshot: Snapshot, config: SchedulerConfig) -> None:
    assert run_cycle(snapshot, now=NOW, config=config) == _cycle(snapshot, NOW, config, ScanIndex, shortcuts=False)


def _apply(snapshot: Snapshot, result: CycleResult) -> Snapshot:
    """The snapshot one instant later, once the admits have started."""
    jobs = {j.id: j for j in snapshot.pending}
    used: dict[str, set[int]] = {}
    started = []
    for a in result.admits:
        spec = jobs[a.job_id]
        for p in a.placement:
            used.setdefault(p.node, set()).update(p.gpus)
        started.append(RunningJob(spec.id, spec.project, spec.user, spec.queue, a.priority.total, NOW,
                                  a.placement, spec.runtime_limit_s))
    admitted = {a.job_id for a in result.admits}
    return Snapshot(
        tuple(replace(n, free=n.free - used.get(n.id, set())) for n in snapshot.nodes),
        tuple(j for j in snapshot.pending if j.id not in admitted),
        snapshot.running + tuple(started))


@settings(max_examples=400, deadline=None)
@given(snapshots(), CONFIGS)
def test_backfill_never_delays_the_reservation(snapshot: Snapshot, config: SchedulerConfig) -> None:
    """Q6: with every admit of this cycle running, the reserved job still starts no later than promised."""
    first = run_cycle(snapshot, now=NOW, config=config)
    if not first.reservations:
        return
    promised = first.reservations[0]
    again = run_cycle(_apply(snapshot, first), now=NOW, config=config)
    assert [r.job_id for r in again.reservations] == [promised.job_id]
    assert again.reservations[0].expected_start <= promised.expected_start
