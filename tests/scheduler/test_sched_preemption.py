"""Rule 6 of run_cycle and scheduler.preemption (Q5 reclaim, Q8, P2): who is preempted, in what order,
never below minimum runtime; requeued jobs keep priority and wait; no deadlock between gangs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from scheduler_builders import NOW, JobBuilder, admitted, at, job, node, reasons, running, snap

from scheduler.cycle import run_cycle
from scheduler.model import JobId, ProjectId, Quotas, RunningJob, SchedulerConfig, Snapshot, TenantQuota
from scheduler.priority import effective_priority

V, S = ProjectId("vision"), ProjectId("speech")
TWO = [node("a"), node("b")]
URGENT = job("u").gpus(8).queue("urgent")


def victims(result_snapshot: Snapshot) -> list[str]:
    result = run_cycle(result_snapshot, now=NOW)
    return [v.job_id for p in result.preemptions for v in p.victims]


CASES: list[tuple[str, JobBuilder, list[RunningJob], Quotas | None, list[str]]] = [
    ("lowest priority first", URGENT,
     [running("hi", {"a": range(8)}, started=at(-2), priority=600),
      running("lo", {"b": range(8)}, started=at(-2), priority=500)], None, ["lo"]),
    ("borrowed before owned, even at higher priority", URGENT,
     [running("own", {"a": range(8)}, started=at(-2), priority=500),
      running("brw", {"b": range(8)}, started=at(-2), priority=600, borrowed=True)], None, ["brw"]),
    ("least lost work breaks a priority tie", URGENT,
     [running("old", {"a": range(8)}, started=at(-5), priority=500),
      running("new", {"b": range(8)}, started=at(-1), priority=500)], None, ["new"]),
    ("job id breaks a full tie", URGENT,
     [running("r2", {"a": range(8)}, started=at(-1), priority=500),
      running("r1", {"b": range(8)}, started=at(-1), priority=500)], None, ["r1"]),
    ("never below a victim's minimum runtime", URGENT,
     [running("young", {"a": range(8)}, started=at(minutes=-5), priority=500),
      running("grown", {"b": range(8)}, started=at(-1), priority=550)], None, ["grown"]),
    ("nobody old enough: no plan", URGENT,
     [running("y1", {"a": range(8)}, started=at(minutes=-5)),
      running("y2", {"b": range(8)}, started=at(minutes=-5))], None, []),
    ("never a job of equal or higher priority", URGENT,
     [running("u1", {"a": range(8)}, started=at(-2), priority=1000, queue="urgent"),
      running("u2", {"b": range(8)}, started=at(-2), priority=1200, queue="urgent")], None, []),
    ("lowest priority first even when that takes two jobs", URGENT,
     [running("h1", {"a": range(4)}, started=at(-2), priority=100),
      running("h2", {"a": range(4, 8)}, started=at(-2), priority=100),
      running("w", {"b": range(8)}, started=at(-2), priority=200)], None, ["h1", "h2"]),
    ("a normal job does not preempt by priority", job("n").gpus(8),
     [running("lo", {"a": range(8)}, started=at(-2), priority=0),
      running("lo2", {"b": range(8)}, started=at(-2), priority=0)], None, []),
    ("a batch job does not preempt by priority", job("b").gpus(8).queue("batch"),
     [running("lo", {"a": range(8)}, started=at(-2), priority=0),
      running("lo2", {"b": range(8)}, started=at(-2), priority=0)], None, []),
    ("reclaim: the lender's job takes back borrowed GPUs only", job("v").gpus(8),
     [running("s-own", {"a": range(8)}, project="speech", started=at(-2), priority=100),
      running("s-brw", {"b": range(8)}, project="speech", started=at(-2), priority=900, borrowed=True)],
     Quotas(tenants={V: TenantQuota(8), S: TenantQuota(8, borrow_limit=8)}), ["s-brw"]),
    ("reclaim never takes the lender's own borrowed jobs", job("v").gpus(8),
     [running("v-brw", {"a": range(8)}, started=at(-2), borrowed=True),
      running("s-own", {"b": range(8)}, project="speech", started=at(-2))],
     Quotas(tenants={V: TenantQuota(16), S: TenantQuota(8)}), []),
    ("never a job declared not stoppable (R5), however low its priority", URGENT,
     [running("blind", {"a": range(8)}, started=at(-2), priority=0, stoppable=False),
      running("lo", {"b": range(8)}, started=at(-2), priority=500)], None, ["lo"]),
    ("reclaim never takes a borrowed job declared not stoppable", job("v").gpus(8),
     [running("s-own", {"a": range(8)}, project="speech", started=at(-2)),
      running("s-blind", {"b": range(8)}, project="speech", started=at(-2), borrowed=True, stoppable=False)],
     Quotas(tenants={V: TenantQuota(8), S: TenantQuota(8, borrow_limit=8)}), []),
]


@pytest.mark.parametrize(("preemptor", "run", "q", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_victim_choice(preemptor: JobBuilder, run: list[RunningJob], q: Quotas | None, expected: list[str]) -> None:
    """Q2: only the urgent queue holds the preemption right (normal and batch jobs wait); Q8 victim order."""
    assert sorted(victims(snap(TWO, [preemptor], run, quotas=q))) == sorted(expected)


def test_fewest_victims_prefers_one_node_of_two_halves_when_that_node_is_cheaper() -> None:
    # Freeing node a needs both halves; node b is one job of higher priority. Lowest priority first wins:
    # h1 then h2 (together enough) — the plan never adds w, and pruning keeps both halves.
    run = [running("h1", {"a": range(4)}, started=at(-2), priority=100),
           running("h2", {"a": range(4, 8)}, started=at(-2), priority=100),
           running("w", {"b": range(8)}, started=at(-2), priority=200)]
    result = run_cycle(snap(TWO, [URGENT], run), now=NOW)
    assert [v.job_id for v in result.preemptions[0].victims] == ["h1", "h2"]
    assert result.preemptions[0].kind == "priority"
    assert "preempting" in reasons(result)["u"]


def test_pruning_drops_a_victim_that_is_not_needed() -> None:
    # Order takes c (lowest) first, but c alone frees only 4 of node a; then b frees node b entirely,
    # which is enough on its own: c is dropped again.
    run = [running("c", {"a": range(4)}, started=at(-2), priority=100),
           running("x", {"a": range(4, 8)}, started=at(-2), priority=900, queue="urgent"),
           running("b", {"b": range(8)}, started=at(-2), priority=200)]
    result = run_cycle(snap(TWO, [URGENT], run), now=NOW)
    assert [v.job_id for v in result.preemptions[0].victims] == ["b"]


def test_a_victim_on_a_degraded_node_frees_nothing_a_plan_may_count_on() -> None:
    """A degraded node takes no new work, so stopping its job makes no room for the preemptor: the cheaper
    victim there would be stopped for nothing, and the urgent job would still wait. Nor is a start held there."""
    run = [running("cheap", {"a": range(8)}, started=at(-2), priority=100),
           running("dear", {"b": range(8)}, started=at(-2), priority=200)]
    result = run_cycle(snap([node("a", degraded=True), node("b")], [URGENT], run), now=NOW)
    assert [v.job_id for p in result.preemptions for v in p.victims] == ["dear"]
    assert all(r.nodes == ("b",) for r in result.reservations)


def test_no_new_plan_while_stopping_jobs_will_free_enough() -> None:
    run = [running("going", {"a": range(8)}, started=at(-2), stop_by=at(minutes=1)),
           running("lo", {"b": range(8)}, started=at(-2))]
    result = run_cycle(snap(TWO, [URGENT], run), now=NOW)
    assert result.preemptions == ()
    # ... and the GPUs coming back are held for the urgent job.
    assert [r.job_id for r in result.reservations] == ["u"]
    assert result.reservations[0].expected_start == at(minutes=1)


def test_at_most_one_plan_per_cycle() -> None:
    run = [running("lo1", {"a": range(8)}, started=at(-2)), running("lo2", {"b": range(8)}, started=at(-2))]
    result = run_cycle(snap(TWO, [URGENT, job("u2").gpus(8).queue("urgent")], run), now=NOW)
    assert len(result.preemptions) == 1
    # The other is told its preemption waits for the next cycle, and why.
    (waiting,) = [b for b in result.blocked if b.job_id != result.preemptions[0].job_id]
    assert waiting.reason.endswith("; its preemption is tried next cycle: this cycle already preempts for another"
                                   " job (one plan a cycle)"), waiting.reason


def test_requeued_job_keeps_its_wait_and_gets_compensation() -> None:
    fresh = job("fresh").waited(1).build()
    back = job("back").requeued(waited_before_h=3, compensation=50).build()  # re-entered the queue just now
    p_fresh, p_back = effective_priority(fresh, NOW), effective_priority(back, NOW)
    assert p_back.aging == pytest.approx(30.0) and p_fresh.aging == pytest.approx(10.0)
    assert p_back.compensation == 50 and p_back.total == p_fresh.total + 20 + 50
    result = run_cycle(snap([node("a", 1)], [fresh, back]), now=NOW)
    assert admitted(result) == {"back": {"a": (0,)}}


def test_the_preemptor_is_subject_to_the_same_rule() -> None:
    # P2: once running, the urgent job is itself a victim for a higher-priority urgent job (after its minimum).
    config = SchedulerConfig()
    run = [running("u-old", {"a": range(8)}, started=at(-2), priority=1000, queue="urgent"),
           running("other", {"b": range(8)}, started=at(-2), priority=1100, queue="urgent")]
    hi = job("u-hi").gpus(8).queue("urgent").priority(500)
    result = run_cycle(snap(TWO, [hi], run), now=NOW, config=config)
    assert [v.job_id for v in result.preemptions[0].victims] == ["u-old"]


def test_a_deadlock_attempt_forms_none() -> None:
    """Q7: two 2-node gangs and a stream of small jobs on two nodes: gangs never hold part of a node while
    waiting (no partial allocation), there is at most one reservation, and every job finishes."""
    nodes = [node("a"), node("b")]
    pending: list[JobBuilder] = [job("g1").gpus(6).nodes(2).limit(1), job("g2").gpus(6).nodes(2).limit(1)]
    pending += [job(f"s{i}").gpus(3).limit(0.5).waited(0.01 * i) for i in range(6)]
    run: list[RunningJob] = [running("r", {"a": range(4)}, limit_h=0.5), running("q", {"b": range(4)}, limit_h=1)]
    now = NOW
    done: set[str] = set()
    waiting = {j.build().id: j for j in pending}
    for _ in range(40):
        running_now = [r for r in run if r.started_at + timedelta(seconds=r.runtime_limit_s or 0) > now]
        done |= {r.id for r in run} - {r.id for r in running_now}
        run = running_now
        snapshot = snap(nodes, waiting.values(), run)
        result = run_cycle(snapshot, now=now)
        assert len(result.reservations) <= 1
        for a in result.admits:
            b = waiting.pop(a.job_id).build()
            assert len(a.placement) == b.nodes and all(len(p.gpus) == b.gpus_per_node for p in a.placement)
            run.append(RunningJob(a.job_id, b.project, b.user, b.queue, a.priority.total, now, a.placement,
                                  b.runtime_limit_s))
        if not waiting and not run:
            break
        now += timedelta(minutes=15)
    assert not waiting, f"never started: {sorted(waiting)}"
    assert {JobId("g1"), JobId("g2")} <= done | {r.id for r in run}


V, S = ProjectId("vision"), ProjectId("speech")
CAPPED = [running("s-own", {"a": range(8)}, project="speech", started=at(-2)),
          running("s-lent", {"b": range(8)}, project="speech", started=at(-2), borrowed=True)]


@pytest.mark.parametrize(("preemptor", "cap"), [
    (job("v1").gpus(8), None), (job("v1").gpus(8), 16),
    (job("u1").gpus(8).queue("urgent"), 16),
], ids=["reclaim-no-cap", "reclaim-cap-at-cluster-size", "urgent-cap-at-cluster-size"])
def test_a_full_cluster_hard_quota_does_not_stop_a_reclaim_or_an_urgent_job(preemptor: JobBuilder,
                                                                            cap: int | None) -> None:
    # The cluster tier refused these before any plan: with a hard cap at the cluster's size, no lender got its
    # GPUs back and no urgent job ran until the running jobs ended on their own.
    q = Quotas(cluster_gpus=cap, tenants={V: TenantQuota(8), S: TenantQuota(8, borrow_limit=8)})
    nodes = [node("a"), node("b")]
    result = run_cycle(snap(nodes, [preemptor], CAPPED, quotas=q), now=NOW)
    assert [[v.job_id for v in p.victims] for p in result.preemptions] == [["s-lent"]]


def test_under_a_cap_below_capacity_a_reclaim_frees_what_the_cap_needs_though_the_gang_fits() -> None:
    # 12 of 16 GPUs may be used; all 12 are. Four idle GPUs fit vision's job, but the cap does not: the borrowed
    # job must go. Once it is stopping, no second plan is made.
    q = Quotas(cluster_gpus=12, tenants={V: TenantQuota(8), S: TenantQuota(8, borrow_limit=8)})
    run = [running("s-own", {"a": range(8)}, project="speech", started=at(-2)),
           running("s-lent", {"b": range(4)}, project="speech", started=at(-2), borrowed=True)]
    result = run_cycle(snap([node("a"), node("b")], [job("v1").gpus(4)], run, quotas=q), now=NOW)
    assert not result.admits
    assert [[v.job_id for v in p.victims] for p in result.preemptions] == [["s-lent"]]
    stopping = [run[0], running("s-lent", {"b": range(4)}, project="speech", started=at(-2), borrowed=True,
                                stop_by=at(minutes=1))]
    result = run_cycle(snap([node("a"), node("b")], [job("v1").gpus(4)], stopping, quotas=q), now=NOW)
    assert not result.admits and not result.preemptions
    assert "cluster quota" in reasons(result)["v1"]


def test_a_job_that_may_not_preempt_still_waits_on_a_full_cluster_quota() -> None:
    q = Quotas(cluster_gpus=16, tenants={V: TenantQuota(8), S: TenantQuota(8, borrow_limit=8)})
    result = run_cycle(snap([node("a"), node("b")], [job("s2", project="speech").gpus(8)], CAPPED, quotas=q),
                       now=NOW)
    assert not result.preemptions and "cluster quota" in reasons(result)["s2"]
    assert result.blocked[0].quota_tier == "cluster"


def _later(minutes: float, seconds: float = 0) -> str:
    return (at(minutes=minutes) + timedelta(seconds=seconds)).isoformat()


# P2 meets Q8/Q5: no victim has run its queue's minimum runtime yet. The wait names that rule, its value and when
# it ends, and the cycle's expected start counts it (plus the victims' grace windows). Issue 30: an urgent job
# was told "2026-12-02 ... beyond the 1h reservation window" and ran ten minutes later.
LATER: list[tuple[str, JobBuilder, list[RunningJob], Quotas | None, str, object]] = [
    ("the issue's case: normal victims within their 10 min", job("u").gpus(6).queue("urgent"),
     [running("s1", {"a": range(8)}, project="speech", priority=500, grace_s=30),
      running("s2", {"b": range(8)}, project="speech", started=at(minutes=-2), priority=500, grace_s=30)], None,
     f"urgent: lower-priority job s2 may be preempted from {_later(8)}, once it has run the minimum runtime before a "
     f"preemption (min_runtime_s: normal 10 min); expected to start at about {_later(8, 30)}, after its grace window",
     at(minutes=8) + timedelta(seconds=30)),
    ("batch victims: their 5 min", URGENT,
     [running("b1", {"a": range(8)}, queue="batch", started=at(minutes=-1)),
      running("b2", {"b": range(8)}, queue="batch", started=at(minutes=-1), priority=50)], None,
     f"lower-priority job b1 may be preempted from {_later(4)}", at(minutes=4)),
    ("a gang that needs two victims waits for the later one", job("u").gpus(8).nodes(2).queue("urgent"),
     [running("early", {"a": range(8)}, started=at(minutes=-8), grace_s=10),
      running("late", {"b": range(8)}, started=at(minutes=-3), grace_s=60)], None,
     f"lower-priority jobs late, early may be preempted from {_later(7)}, once they have run", at(minutes=8)),
    ("a reclaim waits for the borrowed job's minimum runtime", job("v").gpus(8),
     [running("s-own", {"a": range(8)}, project="speech", started=at(-2)),
      running("s-brw", {"b": range(8)}, project="speech", started=at(minutes=-5), borrowed=True)],
     Quotas(tenants={V: TenantQuota(8), S: TenantQuota(8, borrow_limit=8)}),
     f"reclaiming its tenant's quota: borrowed job s-brw may be preempted from {_later(5)}", at(minutes=5)),
    ("never: victims of higher priority", URGENT,
     [running("u1", {"a": range(8)}, queue="urgent", priority=5000),
      running("u2", {"b": range(8)}, queue="urgent", priority=5000)], None, "beyond the 1h reservation window", None),
    ("a plan now: started once the victims' grace windows end", URGENT,
     [running("old", {"a": range(8)}, started=at(-2), grace_s=45),
      running("busy", {"b": range(8)}, started=at(-2), priority=900)], None,
     f"urgent: gracefully preempting lower-priority job old; starts when they have stopped, at about {_later(0, 45)}"
     " (their grace windows)", at(minutes=0.75)),
]


@pytest.mark.parametrize(("preemptor", "run", "q", "said", "start"), [c[1:] for c in LATER],
                         ids=[c[0] for c in LATER])
def test_a_wait_for_the_minimum_runtime_is_named_with_its_end_and_counted(
        preemptor: JobBuilder, run: list[RunningJob], q: Quotas | None, said: str, start: object) -> None:
    result = run_cycle(snap(TWO, [preemptor], run, quotas=q), now=NOW)
    (blocked,) = result.blocked
    assert said in blocked.reason, blocked.reason
    assert blocked.expected_start == start
