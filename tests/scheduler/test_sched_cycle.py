"""Rule 4 of run_cycle (reasons, positions), determinism, and refusal of inconsistent snapshots."""

from __future__ import annotations

from datetime import datetime

import pytest
from scheduler_builders import NOW, admitted, job, node, running, snap

from scheduler.cycle import Blocked, run_cycle
from scheduler.errors import InconsistentSnapshot, InvalidRecord
from scheduler.model import JobId, NodeId, NodeState, PendingJob, Placement, ProjectId, RunningJob, Snapshot


def test_positions_count_waiting_jobs_per_queue_in_priority_order() -> None:
    pending = [job("u1").queue("urgent").gpus(8), job("n-old").gpus(8).waited(5), job("n-new").gpus(8),
               job("b1").queue("batch").gpus(8), job("fits").gpus(1).queue("urgent").limit(0.1)]
    result = run_cycle(snap([node("a", busy=range(7))], pending), now=NOW)
    assert admitted(result) == {"fits": {"a": (7,)}}
    assert [(b.job_id, b.position) for b in result.blocked] == [
        ("u1", 1), ("n-old", 1), ("n-new", 2), ("b1", 1)]


def test_every_waiting_job_gets_exactly_one_answer() -> None:
    pending = [job(f"j{i}").gpus(1 + i % 8).nodes(1 + i % 3).waited(i) for i in range(40)]
    result = run_cycle(snap([node("a"), node("b", busy=range(3)), node("c", 4)], pending), now=NOW)
    answered = [a.job_id for a in result.admits] + [b.job_id for b in result.blocked]
    assert sorted(answered) == sorted(f"j{i}" for i in range(40))
    assert all(b.reason for b in result.blocked)


def test_same_snapshot_in_any_order_gives_the_same_result() -> None:
    nodes = [node("a", busy=(1,)), node("b", busy=range(4)), node("c")]
    pending = [job(f"j{i}").gpus(1 + i % 4).nodes(1 + i % 2) for i in range(10)]
    run = [running("r", {"a": (1,), "b": range(4)}, limit_h=0.5)]
    forward = snap(nodes, pending, run)
    backward = Snapshot(tuple(reversed(forward.nodes)), tuple(reversed(forward.pending)), forward.running)
    assert run_cycle(forward, now=NOW) == run_cycle(backward, now=NOW)


def test_empty_snapshot() -> None:
    result = run_cycle(Snapshot(nodes=(), pending=()), now=NOW)
    assert (result.admits, result.reservations, result.blocked) == ((), (), ())


def test_blocked_is_frozen() -> None:
    b = Blocked(JobId("j"), "why", 1)
    with pytest.raises(AttributeError):
        b.position = 2  # type: ignore[misc]


def _pending(job_id: str, submitted: datetime = NOW) -> PendingJob:
    return PendingJob(JobId(job_id), ProjectId("p"), "u", "normal", 1, 1, submitted)


NAIVE = datetime(2026, 3, 2, 12, 0)
INCONSISTENT = [
    ("duplicate node", Snapshot((node("a"), node("a")), ()), "duplicate node ids: ['a']"),
    ("duplicate job", Snapshot((node("a"),), (_pending("j"), _pending("j"))), "duplicate job ids: ['j']"),
    ("pending and running share an id",
     Snapshot((node("a", busy=(0,)),), (_pending("j"),), (running("j", {"a": (0,)}),)), "duplicate job ids: ['j']"),
    ("naive submitted_at", Snapshot((node("a"),), (_pending("j", NAIVE),)),
     "job j: submitted_at must be timezone-aware"),
    ("running GPUs listed free", Snapshot((node("a"),), (), (running("r", {"a": (0, 1)}),)),
     "job r runs on GPUs [0, 1] of node a, which are also listed as free"),
    ("running GPUs a node lacks", Snapshot((node("a", 2, busy=(0, 1)),), (), (running("r", {"a": (5,)}),)),
     "job r runs on GPUs [5] that node a lacks"),
]


@pytest.mark.parametrize(("snapshot", "problem"), [c[1:] for c in INCONSISTENT], ids=[c[0] for c in INCONSISTENT])
def test_inconsistent_snapshot_is_refused(snapshot: Snapshot, problem: str) -> None:
    with pytest.raises(InconsistentSnapshot) as e:
        run_cycle(snapshot, now=NOW)
    assert e.value.problem == problem


def test_naive_now_is_refused() -> None:
    with pytest.raises(InconsistentSnapshot, match="now must be timezone-aware"):
        run_cycle(Snapshot((), ()), now=NAIVE)


def test_running_job_on_unknown_node_is_ignored() -> None:
    run = RunningJob(JobId("r"), ProjectId("p"), "u", "normal", 0.0, NOW, (Placement(NodeId("gone"), (0,)),), 60.0)
    assert admitted(run_cycle(Snapshot((node("a"),), (_pending("j"),), (run,)), now=NOW)) == {"j": {"a": (0,)}}


BAD_RECORDS = [
    ("zero gpus", lambda: PendingJob(JobId("j"), ProjectId("p"), "u", "normal", 0, 1, NOW), "gpus_per_node"),
    ("zero nodes", lambda: PendingJob(JobId("j"), ProjectId("p"), "u", "normal", 1, 0, NOW), "nodes must"),
    ("unknown queue", lambda: PendingJob(JobId("j"), ProjectId("p"), "u", "gold", 1, 1, NOW), "unknown queue"),
    ("zero limit", lambda: PendingJob(JobId("j"), ProjectId("p"), "u", "batch", 1, 1, NOW, runtime_limit_s=0),
     "runtime_limit_s"),
    ("free GPU out of range", lambda: NodeState(NodeId("n"), 2, frozenset({2})), "outside 0..1"),
    ("negative GPU count", lambda: NodeState(NodeId("n"), -1, frozenset()), "negative GPU count"),
]


@pytest.mark.parametrize(("make", "problem"), [c[1:] for c in BAD_RECORDS], ids=[c[0] for c in BAD_RECORDS])
def test_invalid_record_cannot_be_built(make: object, problem: str) -> None:
    with pytest.raises(InvalidRecord, match=problem):
        make()  # type: ignore[operator]
