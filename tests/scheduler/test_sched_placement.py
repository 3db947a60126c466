"""Rule 2 of run_cycle: gang placement, all or nothing, best fit, lowest GPU indices, alive nodes only."""

from __future__ import annotations

import pytest
from scheduler_builders import NOW, JobBuilder, admitted, job, node, reasons, snap

from scheduler.cycle import run_cycle
from scheduler.model import NodeState

CASES: list[tuple[str, list[NodeState], list[JobBuilder], dict[str, dict[str, tuple[int, ...]]]]] = [
    ("gang fits on two whole nodes",
     [node("a"), node("b")], [job("g").gpus(8).nodes(2)],
     {"g": {"a": tuple(range(8)), "b": tuple(range(8))}}),
    ("gang one node short takes nothing",
     [node("a"), node("b", busy=(0,))], [job("g").gpus(8).nodes(2)],
     {}),
    ("a gang is never split within a node",
     [node("a", busy=range(4)), node("b", busy=range(4))], [job("g").gpus(8)],
     {}),
    ("gang needs distinct nodes, not 2x4 on one",
     [node("a"), node("b", busy=range(5))], [job("g").gpus(4).nodes(2)],
     {}),
    ("best fit picks the fullest node that still fits",
     [node("a"), node("b", busy=range(6)), node("c", busy=range(4))], [job("j").gpus(2)],
     {"j": {"b": (6, 7)}}),
    ("best fit skips nodes too small",
     [node("a"), node("b", busy=range(6)), node("c", busy=range(4))], [job("j").gpus(3)],
     {"j": {"c": (4, 5, 6)}}),
    ("equal free counts: lower node id first",
     [node("c", busy=range(4)), node("b", busy=range(4))], [job("j").gpus(4)],
     {"j": {"b": (4, 5, 6, 7)}}),
    ("lowest GPU indices on a fragmented node",
     [node("a", busy=(0, 1, 4))], [job("j").gpus(2)],
     {"j": {"a": (2, 3)}}),
    ("gang best fit across buckets",
     [node("a"), node("b", busy=range(5)), node("c", busy=range(3)), node("d", busy=range(4))],
     [job("g").gpus(3).nodes(2)],
     {"g": {"b": (5, 6, 7), "d": (4, 5, 6)}}),
    ("admits apply to a working copy: second job sees the first's GPUs gone",
     [node("a", busy=range(4))], [job("x").gpus(3).waited(1), job("y").gpus(3)],
     {"x": {"a": (4, 5, 6)}}),
    ("packing leaves the whole node for the big job behind",
     [node("a"), node("b", busy=range(6))], [job("small").gpus(2).waited(1), job("big").gpus(8)],
     {"small": {"b": (6, 7)}, "big": {"a": tuple(range(8))}}),
    ("dead nodes are never used",
     [node("a", alive=False), node("b", busy=range(6))], [job("j").gpus(4), job("k").gpus(2)],
     {"k": {"b": (6, 7)}}),
    ("a job that needs isolation skips the best-fitting node that cannot isolate it",
     [node("a", busy=range(6), isolated=False), node("b")], [job("ext").gpus(2).isolated_only(), job("j").gpus(2)],
     {"ext": {"b": (0, 1)}, "j": {"a": (6, 7)}}),
    ("a gang that needs isolation uses isolated nodes only",
     [node("a", isolated=False), node("b"), node("c")], [job("g").gpus(8).nodes(2).isolated_only()],
     {"g": {"b": tuple(range(8)), "c": tuple(range(8))}}),
]


@pytest.mark.parametrize(("nodes", "pending", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_placement(nodes: list[NodeState], pending: list[JobBuilder], expected: dict[str, object]) -> None:
    assert admitted(run_cycle(snap(nodes, pending), now=NOW)) == expected


def test_blocked_gang_reason_counts_nodes_that_have_enough() -> None:
    result = run_cycle(snap([node("a"), node("b", busy=(0,))],
                            [job("head").gpus(8).nodes(2).waited(1), job("g").gpus(8).nodes(2)]), now=NOW)
    assert reasons(result)["g"] == "needs 2 nodes with 8 free GPUs each; 1 node has them"


def test_dead_node_makes_gang_impossible_and_it_blocks_no_one() -> None:
    result = run_cycle(snap([node("a"), node("b", alive=False), node("c", 4)],
                            [job("big").gpus(8).nodes(2).queue("urgent"), job("small").gpus(4)]), now=NOW)
    assert reasons(result)["big"] == "needs 2 nodes with 8 GPUs each; only 1 alive node has that many"
    assert admitted(result) == {"small": {"c": (0, 1, 2, 3)}}
    assert result.reservations == ()


def test_a_degraded_node_takes_no_new_work_though_it_has_free_gpus() -> None:
    """Its GPU count is in doubt (its agent reports fewer than its jobs hold): best fit would pick its six idle
    GPUs first, for both jobs; they go to the healthy node, and what does not fit there waits."""
    result = run_cycle(snap([node("a", busy=(6, 7), degraded=True), node("b")],
                            [job("x").gpus(4), job("y").gpus(4), job("z").gpus(2)]), now=NOW)
    assert admitted(result) == {"x": {"b": (0, 1, 2, 3)}, "y": {"b": (4, 5, 6, 7)}}
    # The node it could have had is named, and that its end is not known (the estimate counts nothing on it).
    assert reasons(result)["z"].endswith("; node a is degraded (an agent reports fewer GPUs than its jobs hold) and"
                                         " takes no work until its agent reports as many again, at no known time")


def test_a_job_that_needs_isolation_waits_for_isolated_nodes_and_holds_nothing() -> None:
    """H1: on nodes whose agents run jobs as their own user, a job the policy keeps off them (an external-rights
    job) waits, saying why; it reserves nothing and plans no preemption on them for itself."""
    result = run_cycle(snap([node("a", isolated=False), node("b", busy=range(4))],
                            [job("ext").gpus(8).isolated_only().queue("urgent").waited(1), job("j").gpus(4)]),
                       now=NOW)
    assert admitted(result) == {"j": {"b": (4, 5, 6, 7)}}
    assert reasons(result)["ext"].endswith("(it may run only on nodes that isolate jobs)")
    assert result.reservations == () and result.preemptions == ()
    gang = run_cycle(snap([node("a", isolated=False), node("b")], [job("g").gpus(8).nodes(2).isolated_only()]),
                     now=NOW)
    assert reasons(gang)["g"] == "needs 2 nodes with 8 GPUs each on nodes that isolate jobs; only 1 such node " \
                                 "isolates jobs"


def test_larger_than_any_alive_node() -> None:
    result = run_cycle(snap([node("a", 4)], [job("j").gpus(8)]), now=NOW)
    assert reasons(result)["j"] == "needs 8 GPUs per node; the largest alive node has 4"
