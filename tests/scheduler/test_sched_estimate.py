"""Q10 estimated start times: the queue simulated forward with declared runtime limits."""

from __future__ import annotations

from scheduler_builders import NOW, at, job, node, running, snap

from scheduler.cycle import run_cycle
from scheduler.estimate import after_admits, estimate_starts
from scheduler.model import SchedulerConfig


def test_jobs_start_as_running_jobs_end_in_priority_order() -> None:
    s = snap([node("a"), node("b")], [job("p1").gpus(8).limit(2), job("p2").gpus(8).limit(1),
                                       job("p3").gpus(16), job("huge").gpus(8).nodes(3)],
             [running("r1", {"a": range(8)}, started=at(-1), limit_h=2),
              running("r2", {"b": range(8)}, started=at(-1), limit_h=3)])
    order = [j for j in s.pending]
    est = estimate_starts(s, order, now=NOW)
    assert est[order[0].id] == at(1)  # r1 ends
    assert est[order[1].id] == at(2)  # r2 ends
    assert est[order[2].id] is None  # no node has 16 GPUs
    assert est[order[3].id] is None  # only two nodes


def test_no_runtime_limit_uses_the_configured_default_and_stopping_jobs_their_deadline() -> None:
    s = snap([node("a"), node("b")], [job("p").gpus(8), job("q").gpus(8)],
             [running("open", {"a": range(8)}, started=at(-1)),
              running("going", {"b": range(8)}, started=at(-1), stop_by=at(minutes=2))])
    est = estimate_starts(s, list(s.pending), now=NOW, config=SchedulerConfig(default_runtime_s=4 * 3600))
    assert est[s.pending[0].id] == at(minutes=2)
    assert est[s.pending[1].id] == at(3)


def test_no_start_is_estimated_on_a_degraded_node() -> None:
    """Its job ends in an hour, but it takes no new work until it is whole again: the wait is for the healthy
    node's job, not a start on GPUs the node may no longer have."""
    s = snap([node("a", degraded=True), node("b")], [job("p").gpus(8)],
             [running("soon", {"a": range(8)}, started=at(-1), limit_h=2),
              running("later", {"b": range(8)}, started=at(-1), limit_h=3)])
    assert estimate_starts(s, list(s.pending), now=NOW) == {s.pending[0].id: at(2)}


def test_an_idle_cluster_starts_now() -> None:
    s = snap([node("a")], [job("p").gpus(2)])
    assert estimate_starts(s, list(s.pending), now=NOW) == {s.pending[0].id: NOW}


def test_estimates_after_a_cycle_count_the_gpus_it_gave_away() -> None:
    """Q10: a job left waiting behind this cycle's admits cannot start before they end."""
    s = snap([node("a")], [job("first").gpus(8).limit(2).waited(1), job("second").gpus(8).limit(2)])
    result = run_cycle(s, now=NOW)
    assert [a.job_id for a in result.admits] == ["first"]
    left = after_admits(s, result.admits, now=NOW)
    assert [j.id for j in left.pending] == ["second"] and left.nodes[0].free == frozenset()
    assert estimate_starts(left, list(left.pending), now=NOW) == {"second": at(2)}
