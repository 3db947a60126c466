"""Q10 estimated start times: the queue simulated forward with declared runtime limits."""

from __future__ import annotations

import pytest
from scheduler_builders import NOW, at, job, node, running, snap

from scheduler.cycle import run_cycle
from scheduler.estimate import QuotaWait, after_admits, estimate_starts, quota_starts
from scheduler.model import ProjectId, Quotas, RunningJob, SchedulerConfig, TenantQuota


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


def test_a_start_the_cycle_knows_comes_first_and_takes_no_simulated_gpus() -> None:
    """Rule 4: a job waiting for a preemption (its victims' minimum runtime) starts then, on its victims' GPUs; the
    job behind it is not pushed back by a simulated run of it."""
    s = snap([node("a")], [job("u").gpus(8).queue("urgent"), job("n").gpus(8)],
             [running("r", {"a": range(8)}, started=at(-1), limit_h=3)])
    order = list(s.pending)
    assert estimate_starts(s, order, now=NOW) == {"u": at(2), "n": at(2 + 24)}
    assert estimate_starts(s, order, now=NOW, known={order[0].id: at(minutes=10)}) == {"u": at(minutes=10),
                                                                                      "n": at(2)}


@pytest.mark.parametrize(("stoppable", "expected"), [(True, at(1.5, minutes=1)), (False, at(23))],
                         ids=["stopped at its occupancy end", "not stoppable: never stopped for it"])
def test_a_job_past_its_maximum_occupancy_frees_its_gpus_when_it_ends_unless_renewed(stoppable: bool,
                                                                                     expected: object) -> None:
    """P3: with max_occupancy_s a job without a runtime limit is stopped at the end of its renewal window (then its
    grace), not taken to run the 24 h default."""
    config = SchedulerConfig(max_occupancy_s=2 * 3600, renewal_window_s=1800)
    s = snap([node("a")], [job("p").gpus(8)],
             [running("long", {"a": range(8)}, started=at(-1), grace_s=60, stoppable=stoppable)])
    assert estimate_starts(s, list(s.pending), now=NOW, config=config) == {s.pending[0].id: expected}


QUOTA = Quotas(tenants={ProjectId("vision"): TenantQuota(8, borrow_limit=0), ProjectId("speech"): TenantQuota(8)})


@pytest.mark.parametrize(
    ("run", "expected"),
    [([running("mine", {"a": range(8)}, started=at(-1), limit_h=2)], QuotaWait(at(1), ("mine",), at(1), 1)),
     ([running("mine", {"a": range(4)}, started=at(-1), limit_h=2),
       running("theirs", {"b": range(8)}, project="speech", started=at(-1), limit_h=4),
       running("also", {"a": range(4, 8)}, project="speech", started=at(-1), limit_h=4)],
      QuotaWait(at(1), ("mine",), at(3), 1))],
    ids=["allowed when the tenant's job ends", "allowed then, but the GPUs free only later"])
def test_a_job_a_quota_holds_back_starts_when_running_jobs_ends_allow_it(run: list[RunningJob],
                                                                      expected: QuotaWait) -> None:
    """Rule 5: the quota tier's wait ends when jobs of the tenant end (their limits), then its gang needs GPUs."""
    s = snap([node("a"), node("b")], [job("held").gpus(8)], run, quotas=QUOTA)
    result = run_cycle(s, now=NOW)
    assert [b.quota_tier for b in result.blocked] == ["tenant"]
    assert quota_starts(s, list(s.pending), now=NOW) == {s.pending[0].id: expected}
