"""Rule 3 of run_cycle and Q6: the blocked head job gets GPUs held for it; backfill only if it cannot delay it.
Q7: a gang holds nothing until all of it starts, and one reservation per pool, so no circular wait forms."""

from __future__ import annotations

import pytest
from scheduler_builders import NOW, JobBuilder, admitted, at, job, node, reasons, running, snap

from scheduler.cycle import Reserve, run_cycle
from scheduler.model import JobId, NodeId, NodeState, RunningJob, SchedulerConfig, Snapshot
from scheduler.sim import SimCluster, TraceJob, simulate

# Nodes a and b, 8 GPUs each. `r1` holds all of a until NOW+1h. The urgent head wants both whole nodes,
# so it is blocked now and expected to start at NOW+1h on a and b; b's free GPUs are held for it.
# r1 is itself urgent and of higher priority, so the head can never preempt it (rule 6).
NODES = [node("a"), node("b")]
R1 = running("r1", {"a": range(8)}, started=at(-0.5), limit_h=1.5, queue="urgent", priority=5000)
HEAD = job("head").gpus(8).nodes(2).queue("urgent")


def cluster(*pending: JobBuilder, nodes: list[NodeState] | None = None, run: list[RunningJob] | None = None
            ) -> Snapshot:
    return snap(NODES if nodes is None else nodes, [HEAD, *pending], [R1] if run is None else run)


def test_head_job_gets_the_reservation() -> None:
    result = run_cycle(cluster(), now=NOW)
    assert result.admits == ()
    assert result.reservations == (Reserve(JobId("head"), at(1), (NodeId("a"), NodeId("b"))),)
    assert reasons(result)["head"] == ("needs 2 nodes with 8 free GPUs each; 1 node has them now; "
                                      "GPUs are held for it from 2026-03-02T13:00:00+00:00")


BACKFILL = [
    ("finishes before the reserved start: backfills onto held GPUs",
     job("short").gpus(4).limit(0.5), {"short": {"b": (0, 1, 2, 3)}}),
    ("finishes exactly at the reserved start: allowed",
     job("edge").gpus(4).limit(1), {"edge": {"b": (0, 1, 2, 3)}}),
    ("would run past the reserved start: refused", job("long").gpus(4).limit(2), {}),
    ("no runtime limit: never backfills into held GPUs", job("open").gpus(4), {}),
    ("declared not stoppable: its limit cannot be enforced, so never onto held GPUs",
     job("kept").gpus(4).limit(0.5).not_stoppable(), {}),
]


@pytest.mark.parametrize(("pending", "expected"), [c[1:] for c in BACKFILL], ids=[c[0] for c in BACKFILL])
def test_backfill_into_held_gpus(pending: JobBuilder, expected: dict[str, object]) -> None:
    result = run_cycle(cluster(pending), now=NOW)
    assert admitted(result) == expected
    assert [r.job_id for r in result.reservations] == ["head"]


REFUSALS = [
    ("long", job("long").gpus(4).limit(2),
     "would fit now only on GPUs held for job head, which starts at 2026-03-02T13:00:00+00:00; "
     "its 2h runtime limit runs past that"),
    ("open", job("open").gpus(4),
     "would fit now only on GPUs held for job head, which starts at 2026-03-02T13:00:00+00:00; "
     "it has no runtime limit"),
    ("kept", job("kept").gpus(4).limit(0.5).not_stoppable(),
     "would fit now only on GPUs held for job head, which starts at 2026-03-02T13:00:00+00:00; "
     "it is declared not stoppable, so its runtime limit cannot be enforced"),
]


@pytest.mark.parametrize(("pending", "reason"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_refused_backfill_says_why(pending: JobBuilder, reason: str) -> None:
    assert reasons(run_cycle(cluster(pending), now=NOW))[pending.build().id] == reason


def test_long_job_backfills_on_gpus_the_reservation_does_not_need() -> None:
    result = run_cycle(cluster(job("long").gpus(4).limit(5), nodes=[*NODES, node("c", 4)]), now=NOW)
    assert admitted(result) == {"long": {"c": (0, 1, 2, 3)}}


def test_held_gpus_are_exactly_the_ones_it_will_start_on() -> None:
    # b has 2 GPUs busy for good; the head needs 6 per node, so b's GPUs 2..7 are held and 0,1 are not.
    run = [R1, running("forever", {"b": (0, 1)})]
    head6 = job("head").gpus(6).nodes(2).queue("urgent")
    result = run_cycle(snap(NODES, [head6, job("open").gpus(2)], run), now=NOW)
    assert result.reservations[0].nodes == ("a", "b")
    assert reasons(result)["open"].startswith("would fit now only on GPUs held for job head")


def test_short_backfill_prefers_unheld_gpus_on_a_reserved_node() -> None:
    # b: 8 GPUs, head needs 6 per node -> b's GPUs 0..5 held, 6 and 7 free and unheld.
    head6 = job("head").gpus(6).nodes(2).queue("urgent")
    result = run_cycle(snap(NODES, [head6, job("short").gpus(3).limit(0.5)], [R1]), now=NOW)
    assert admitted(result) == {"short": {"b": (0, 6, 7)}}


def test_expected_start_waits_for_enough_releases() -> None:
    run = [running("r1", {"a": range(4)}, started=at(-1), limit_h=2),
           running("r2", {"a": range(4, 8)}, started=at(-1), limit_h=4)]
    result = run_cycle(snap(NODES, [HEAD], run), now=NOW, config=SchedulerConfig(reservation_window_s=4 * 3600))
    assert result.reservations[0].expected_start == at(3)


def test_overdue_job_counts_as_freeing_now() -> None:
    result = run_cycle(cluster(run=[running("r1", {"a": range(8)}, started=at(-5), limit_h=2)]), now=NOW)
    assert result.reservations[0].expected_start == NOW


def test_this_cycles_admits_count_as_releases() -> None:
    # The urgent 'first' takes b for 30 min; head (normal, behind it) is then expected at NOW+1h (r1 on a).
    head = job("head").gpus(8).nodes(2)
    first = job("first").gpus(8).queue("urgent").limit(0.5)
    result = run_cycle(snap(NODES, [first, head], [R1]), now=NOW)
    assert list(admitted(result)) == ["first"]
    assert result.reservations == (Reserve(JobId("head"), at(1), (NodeId("a"), NodeId("b"))),)


def test_beyond_window_holds_nothing_and_others_run() -> None:
    far = [running("r1", {"a": range(8)}, started=at(-0.5), limit_h=2.5, queue="urgent", priority=5000)]
    result = run_cycle(cluster(job("open").gpus(4), run=far), now=NOW)
    assert result.reservations == ()
    assert admitted(result) == {"open": {"b": (0, 1, 2, 3)}}
    # The rule named with its value, and when it stops holding the job back: an hour before its start.
    assert reasons(result)["head"] == (
        "needs 2 nodes with 8 free GPUs each; 1 node has them now; expected to start at "
        "2026-03-02T14:00:00+00:00, beyond the 1h reservation window (reservation_window_s), so no GPUs are held "
        "for it yet; they are from 2026-03-02T13:00:00+00:00, when its start is within the window or it has waited "
        "that long")


def test_wider_window_reserves_the_same_case() -> None:
    far = [running("r1", {"a": range(8)}, started=at(-1), limit_h=3)]
    result = run_cycle(cluster(job("open").gpus(4), run=far), now=NOW,
                       config=SchedulerConfig(reservation_window_s=3 * 3600))
    assert [r.expected_start for r in result.reservations] == [at(2)]
    assert admitted(result) == {}


GUESS = (" (a guess: some of those GPUs are held by jobs without a runtime limit, taken to run 24h"
         " (default_runtime_s))")
HELD_FROM = "; they are from 2026-03-02T13:00:00+00:00, when its start is within the window or it has waited that long"


def test_gpus_held_by_an_unlimited_job_are_expected_back_after_the_default_run_time() -> None:
    """r1 (urgent, of higher priority: not preemptible) declared no limit: it is taken to run default_runtime_s
    (24 h), which is past the window, so nothing is held yet and `open` runs on b; the reason says the start is a
    guess."""
    unlimited = [running("r1", {"a": range(8)}, started=at(-0.5), queue="urgent", priority=5000)]
    result = run_cycle(cluster(job("open").gpus(4), run=unlimited), now=NOW)
    assert result.reservations == ()
    assert admitted(result) == {"open": {"b": (0, 1, 2, 3)}}
    assert reasons(result)["head"] == (
        "needs 2 nodes with 8 free GPUs each; 1 node has them now; expected to start at 2026-03-03T11:30:00+00:00,"
        " beyond the 1h reservation window (reservation_window_s), so no GPUs are held for it yet" + HELD_FROM
        + GUESS)


def test_a_head_that_waited_a_window_behind_an_unlimited_job_gets_its_hold() -> None:
    """Before, a job whose GPUs an unlimited job held had no start time and so never a hold: every GPU that came
    free went to whoever came next. Having waited a window, it is now held for like any other head."""
    unlimited = [running("r1", {"a": range(8)}, started=at(-0.5), queue="urgent", priority=5000)]
    head = job("head").gpus(8).nodes(2).queue("urgent").waited(1)
    result = run_cycle(snap(NODES, [head, job("open").gpus(4)], unlimited), now=NOW)
    assert result.reservations == (Reserve(JobId("head"), at(23.5), (NodeId("a"), NodeId("b"))),)
    assert admitted(result) == {}
    assert reasons(result)["head"].endswith("GPUs are held for it from 2026-03-03T11:30:00+00:00" + GUESS)


def test_an_unlimited_job_admitted_this_cycle_counts_as_running_the_default_too() -> None:
    """`first` takes b with no limit declared: the head's start is b's guessed end, 24 h from now."""
    first = job("first").gpus(8).queue("urgent")
    result = run_cycle(snap(NODES, [first, HEAD], [R1]), now=NOW, config=SchedulerConfig(reservation_window_s=86400))
    assert list(admitted(result)) == ["first"]
    assert result.reservations == (Reserve(JobId("head"), at(24), (NodeId("a"), NodeId("b"))),)
    assert reasons(result)["head"].endswith(GUESS)


def test_gpus_that_are_withheld_give_no_start_time() -> None:
    """A job on a lost node, or whose stop nobody confirmed, frees its GPUs at no known time, guessed or not."""
    lost = running("r1", {"a": range(8)}, started=at(-1), limit_h=2)
    nodes = [NodeState(NodeId("a"), 8, frozenset(), True), NodeState(NodeId("b"), 8, frozenset(range(8)), True)]
    result = run_cycle(Snapshot(nodes=tuple(nodes), pending=(HEAD.build(),), withheld=(lost,)), now=NOW)
    assert result.reservations == ()
    assert reasons(result)["head"] == ("needs 2 nodes with 8 free GPUs each; 1 node has them now; start time unknown:"
                                      " the GPUs it needs are withheld (a lost node, or a stop nobody could confirm)")


def test_running_jobs_on_dead_nodes_free_nothing() -> None:
    nodes = [node("a", alive=False), node("b"), node("c")]
    run = [running("r1", {"a": range(8)}, started=at(-1), limit_h=1.5),
           running("r3", {"c": range(8)}, started=at(-1), limit_h=3)]
    result = run_cycle(snap(nodes, [HEAD], run), now=NOW, config=SchedulerConfig(reservation_window_s=4 * 3600))
    assert result.reservations == (Reserve(JobId("head"), at(2), (NodeId("b"), NodeId("c"))),)


def test_only_one_reservation_per_pool() -> None:
    """Q7: one reservation per pool, so no two reservations can wait on each other's GPUs."""
    second = job("second").gpus(8).nodes(2)
    result = run_cycle(cluster(second), now=NOW)
    assert [r.job_id for r in result.reservations] == ["head"]
    assert reasons(result)["second"] == ("needs 2 nodes with 8 free GPUs each; no node has them; "
                                         "1 more is held for job head")


def test_gangs_that_fit_only_in_part_hold_nothing_and_start_whole_in_turn() -> None:
    """Q7: no circular wait between partial reservations. Two 2-node gangs find one node of three free:
    neither takes part of it, and only the first has GPUs held for it (two gangs each holding part of what
    the other waits for would be a deadlock). A short job backfills the free node meanwhile, and the gangs
    start whole, one after the other."""
    nodes = [*NODES, node("c")]
    g1 = job("g1").gpus(8).nodes(2).limit(1).submitted(at(minutes=-2))
    g2 = job("g2").gpus(8).nodes(2).limit(1).submitted(at(minutes=-1))
    short = job("short").gpus(4).limit(0.5)
    busy = [running("rb", {"b": range(8)}, limit_h=1), running("rc", {"c": range(8)}, limit_h=1)]
    first = run_cycle(snap(nodes, [g1, g2, short], busy), now=NOW)
    assert admitted(first) == {"short": {"a": (0, 1, 2, 3)}}
    assert first.reservations == (Reserve(JobId("g1"), at(1), (NodeId("a"), NodeId("b"))),)
    whole = {"a": tuple(range(8)), "b": tuple(range(8))}
    second = run_cycle(snap(nodes, [g1, g2]), now=at(1))
    assert admitted(second) == {"g1": whole}
    assert [r.job_id for r in second.reservations] == ["g2"]
    third = run_cycle(snap(nodes, [g2]), now=at(2))
    assert admitted(third) == {"g2": whole}


def test_backfill_depth_bounds_the_jobs_tried_behind_the_head() -> None:
    pending = [job(f"s{i}").gpus(1).limit(0.5).submitted(at(minutes=i)) for i in range(3)]
    result = run_cycle(cluster(*pending), now=NOW, config=SchedulerConfig(backfill_depth=2))
    assert list(admitted(result)) == ["s0", "s1"]
    assert reasons(result)["s2"] == ("needs 1 node with 1 free GPU; 1 node has them now; not tried this cycle: "
                                     "only 2 waiting jobs behind job head are tried per cycle")


def test_a_head_that_waited_a_whole_window_gets_its_hold_even_beyond_the_window() -> None:
    """Q6: the same case as above once the head has waited an hour: its GPUs are held, and `open` (no limit)
    may not take them, or the next such job would push the head's start out of the window again."""
    far = [running("r1", {"a": range(8)}, started=at(-0.5), limit_h=2.5, queue="urgent")]
    head = job("head").gpus(8).nodes(2).queue("urgent").waited(1)
    result = run_cycle(snap(NODES, [head, job("open").gpus(4)], far), now=NOW)
    assert result.reservations == (Reserve(JobId("head"), at(2), (NodeId("a"), NodeId("b"))),)
    assert admitted(result) == {}


def test_a_stream_of_small_jobs_with_limits_past_the_window_does_not_starve_a_whole_cluster_gang() -> None:
    """Q6: 1-GPU jobs with 2 h limits arrive as fast as GPUs free, for three days. The gang that needs the whole
    cluster was never held for (its start was always about 2 h away, past the 1 h window) and waited until the
    stream ended; now it waits at most the window plus one small job's limit."""
    small = [TraceJob(f"s{i:04d}", i * 450.0, "small", "s", "normal", 1, 1, 7200.0, 7200.0) for i in range(576)]
    gang = TraceJob("gang", 60.0, "big", "b", "normal", 8, 2, 3600.0, 3600.0)
    report = simulate([*small, gang], cluster=SimCluster(nodes=2, gpus_per_node=8),
                      config=SchedulerConfig(fairshare_weight=0))
    assert report.wait_s["tenant:big"]["mean"] <= 3600 + 7200 + 120  # window + a limit + two 60 s ticks


def test_a_stream_of_small_jobs_without_runtime_limits_does_not_starve_a_whole_cluster_gang() -> None:
    """Q6: the same stream with no runtime limits declared (each still runs 2 h). Nothing said when their GPUs
    would come back, so the gang was never held for and waited until the stream ended, three days. Each is now
    taken to run default_runtime_s: the gang is held for once it has waited a window, and starts when the
    small jobs then running have ended."""
    small = [TraceJob(f"s{i:04d}", i * 450.0, "small", "s", "normal", 1, 1, 7200.0) for i in range(576)]
    gang = TraceJob("gang", 60.0, "big", "b", "normal", 8, 2, 3600.0, 3600.0)
    report = simulate([*small, gang], cluster=SimCluster(nodes=2, gpus_per_node=8),
                      config=SchedulerConfig(fairshare_weight=0))
    assert report.wait_s["tenant:big"]["mean"] <= 3600 + 7200 + 120  # window + a small job's run + two ticks
