"""One scheduling cycle: a pure function from a snapshot and a clock to admits, one reservation, and a
reason for every job left waiting (Q2, Q3, Q6, Q7; after kueue's `scheduler.go` and Slurm's backfill)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import accumulate

from scheduler import reasons
from scheduler.errors import InconsistentSnapshot
from scheduler.model import (
    DEFAULT_CONFIG,
    JobId,
    NodeId,
    NodeState,
    PendingJob,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)
from scheduler.occupancy import frees_at
from scheduler.placement import FreeIndex
from scheduler.preemption import (
    Preempt,
    Victim,
    by_eligibility,
    eligible,
    first_plan,
    for_preemptor,
    may_preempt_from,
    plan_victims,
)
from scheduler.priority import LazyParts, PriorityParts, effective_priority, fair_share_points, priority_totals
from scheduler.quota import QuotaUsage, usage_of
from scheduler.reservation import Release, earliest_start

__all__ = ["Admit", "Blocked", "CycleResult", "Preempt", "PriorityParts", "Reserve", "effective_priority",
           "run_cycle"]


@dataclass(frozen=True)
class Admit:
    """Start this job now on exactly these GPUs."""

    job_id: JobId
    placement: tuple[Placement, ...]
    priority: PriorityParts
    # Q5: on GPUs borrowed from other tenants' idle quota (False: within the tenant's own quota).
    borrowed: bool = False


@dataclass(frozen=True)
class Reserve:
    """GPUs on these nodes are held for this job, which is expected to start at expected_start."""

    job_id: JobId
    expected_start: datetime
    nodes: tuple[NodeId, ...]


@dataclass(frozen=True)
class Blocked:
    """A job that stays waiting: why, in a sentence for its owner, and its 1-based place in its queue."""

    job_id: JobId
    reason: str
    position: int
    # The quota tier that holds it back (cluster | user | tenant | borrow), "" when it waits for GPUs: such a
    # job holds nothing and starts when the tier allows, so an estimate of when GPUs are free says nothing of it.
    quota_tier: str = ""
    # When this cycle already knows it starts: a preemption made for it now, or one that becomes possible once
    # its victims have run their queue's minimum runtime, plus their grace windows. None: the estimate says.
    expected_start: datetime | None = None


@dataclass(frozen=True)
class CycleResult:
    admits: tuple[Admit, ...]
    reservations: tuple[Reserve, ...]
    blocked: tuple[Blocked, ...]
    preemptions: tuple[Preempt, ...] = ()
    # Effective priority and its parts of every waiting job this cycle (Q3 basis, Q10 explain).
    priorities: Mapping[JobId, PriorityParts] = field(default_factory=dict)


def run_cycle(snapshot: Snapshot, *, now: datetime, config: SchedulerConfig = DEFAULT_CONFIG) -> CycleResult:
    """Decide which waiting jobs start now, which one GPUs are held for, and why the others wait.

    1. Order waiting jobs by effective priority (queue baseline + contribution + capped aging),
       highest first, then by submitted_at, then by job id, so the result is deterministic.
    2. Gang placement, in that order: a job needs `nodes` distinct alive nodes each with at least
       `gpus_per_node` free GPUs, all or nothing; a degraded node takes nothing, and rules 3 and 6 count on
       nothing it frees (its GPUs still count in the quotas' capacity). Best fit against fragmentation: the
       nodes with the fewest free GPUs that are still enough (ties by node id), the lowest GPU indices on each.
       Each admit is applied to a working copy of the free GPUs before the next job is tried.
       A job that needs more than the alive nodes could ever offer is skipped (it blocks nobody).
    3. Head of line: the first job that does not fit gets the pool's one reservation: the earliest
       time running jobs free enough GPUs (started_at + runtime_limit_s, this cycle's admits
       included; with max_occupancy_s, a stoppable job's occupancy end if earlier: scheduler.occupancy
       frees_at), and the GPUs it will take then are held. A job that declared no runtime limit is taken
       to run default_runtime_s (Slurm's DefaultTime): without a guess, a gang whose GPUs such jobs hold
       would never be held for, and a stream of them would starve it. The reservation is made when that
       time is within reservation_window_s, or once the job has waited that long: without the second rule,
       backfilled jobs whose limits run past the window keep pushing a large gang's start out of it, and it
       never gets one. Later jobs backfill onto unheld GPUs, or onto held ones only if their runtime limit
       ends by the reservation's start (Slurm's rule), a limit the gateway then enforces; a job without a
       runtime limit, or declared not stoppable (its limit cannot be enforced), never uses held GPUs.
       At most backfill_depth jobs behind the head are tried; once no node could fit the smallest
       remaining request, placement stops.
    4. Every job not admitted gets a Blocked with a reason and its position among its queue's
       waiting jobs (1-based, in the order of rule 1).
    5. Quotas (Q4, Q5), when the snapshot has them: before placement a job must fit the cluster, user
       and tenant tiers; it is admitted owned within its tenant's quota, else borrowed within its
       borrow limit and the idle GPUs others lend; never borrowed if it cannot be stopped (R5: no
       reclaim could take those GPUs back). A job refused by a quota waits without holding
       anything (it blocks nobody and gets no reservation). One refused only by the cluster's hard quota
       that may preempt (rule 6) tries a plan whose victims also free what it exceeds that quota by.
       Waiting jobs keep their tenant's idle owned quota from being lent, unless the alive nodes could not
       hold them anyway.
    6. Preemption (Q5, Q8), at most one plan per cycle, tried for at most max_preemption_attempts
       jobs that pass their quotas but do not fit, in priority order: a job within its tenant's
       owned quota reclaims borrowed GPUs of other tenants; a job of a preempting queue (urgent)
       preempts lower-priority jobs. Victims are chosen by
       scheduler.preemption on a copy of the free GPUs; no new plan is made while jobs already being
       stopped would free enough. GPUs of stopping jobs count as released at their stop deadline.
       A job with a plan starts once its victims' grace windows end (Blocked.expected_start). One without, where
       the plan is only missing victims that have not yet run their queue's minimum runtime, is told when the
       first plan will exist and starts then plus the grace windows; that replaces what rule 3 said of it
       unless rule 3 found an earlier start (beside a reservation it holds, both are said).
    7. Every reason names the rule that holds the job back with its value and when it ends: the quota tier
       (its numbers), the reservation window and when GPUs will be held, the minimum runtime, the preemption
       bounds of rule 6 (max_preemption_attempts, one plan a cycle), degraded nodes the job could use.

    Raises InconsistentSnapshot for duplicate ids, naive datetimes, or a running job on GPUs that the
    snapshot also lists as free.
    """
    return _cycle(snapshot, now, config, FreeIndex)


def _cycle(snapshot: Snapshot, now: datetime, config: SchedulerConfig,
           make_index: Callable[[Sequence[NodeState]], FreeIndex], *, shortcuts: bool = True) -> CycleResult:
    """run_cycle with a pluggable index, so the naive ScanIndex can be checked and timed against it.

    shortcuts=False tries every placement in full (no count pre-check, no early stop); the decisions
    and reasons are the same, only slower.
    """
    _check(snapshot, now)
    # Only these take work; one degraded node must not stop the cycle, nor be counted on by it.
    schedulable = sorted((n for n in snapshot.nodes if n.schedulable), key=lambda n: n.id)
    index = make_index(schedulable)
    rank_of = {n.id: r for r, n in enumerate(schedulable)}
    largest_alive = max((n.gpus for n in schedulable), default=0)
    # ever_fitting[g]: schedulable nodes with at least g GPUs in all, busy or not.
    ever_fitting = [0] * (largest_alive + 2)
    for node in schedulable:
        ever_fitting[node.gpus] += 1
    ever_fitting = list(accumulate(reversed(ever_fitting)))[::-1]
    # H1: nodes whose agent cannot keep jobs apart; a job that needs isolation is never placed there.
    unisolated = frozenset(r for r, node in enumerate(schedulable) if not node.isolated)
    isolated_fitting = [0] * (largest_alive + 2)
    for node in schedulable:
        isolated_fitting[node.gpus] += node.isolated
    isolated_fitting = list(accumulate(reversed(isolated_fitting)))[::-1]

    # Rule 1: order.
    share = fair_share_points(snapshot, config) if config.fairshare_weight else {}
    totals = priority_totals(snapshot.pending, now, config, share)
    parts = LazyParts({job.id: job for job in snapshot.pending}, now, config, share)
    quota = usage_of(snapshot, lambda j: ever_fitting[min(j.gpus_per_node, largest_alive + 1)] >= j.nodes)
    stopping = [job for job in snapshot.running if job.stop_by is not None]
    # Alive nodes closed to new work, by size: a job they could hold is told they wait to be whole again.
    degraded = sorted((n.gpus, n.id) for n in snapshot.nodes if n.alive and n.degraded)

    def degraded_note(g: int) -> str:
        return reasons.degraded([node for size, node in degraded if size >= g]) if degraded else ""

    preemptions: list[Preempt] = []
    attempts = 0
    victim_pool: list[tuple[RunningJob, Victim]] | None = None  # built on the first attempt, once per cycle
    in_order: list[tuple[datetime, RunningJob]] = []  # rule 6 with P2: built on the first failed attempt
    ordered = sorted(snapshot.pending, key=lambda j: (-totals[j.id], j.submitted_at, j.id))
    # smallest_after[i]: the smallest per-node request among ordered[i:], for the early stop in rule 3.
    smallest_after = list(accumulate(reversed([j.gpus_per_node for j in ordered]), min))[::-1]

    releases = [Release(at=max(now, freed.at), job_id=job.id, rank=rank_of[p.node], gpus=p.gpus,
                        assumed=freed.assumed)
                for job in snapshot.running for freed in (frees_at(job, config),) for p in job.placement
                if p.node in rank_of]
    running_by_id = {job.id: job for job in snapshot.running}

    admits: list[Admit] = []
    reservation: Reserve | None = None
    head: PendingJob | None = None
    tried_behind_head = 0
    exhausted = False
    why: dict[JobId, str] = {}
    tier_of: dict[JobId, str] = {}
    starts: dict[JobId, datetime] = {}  # Blocked.expected_start

    for i, job in enumerate(ordered):
        g, n = job.gpus_per_node, job.nodes
        exclude = unisolated if job.needs_isolation else frozenset()
        possible = (isolated_fitting if exclude else ever_fitting)[min(g, largest_alive + 1)]
        if possible < n:
            why[job.id] = (reasons.needs_isolation(n, g, possible) if exclude
                           else reasons.impossible(n, g, possible, largest_alive) + degraded_note(g))
            continue
        # Rule 5: quotas before placement.
        borrowed = False
        over_cap, cap_reason = 0, ""
        if quota is not None:
            verdict = quota.check(job.project, job.user, job.gpus, may_borrow=job.stoppable)
            if not verdict.ok and verdict.tier == "cluster":
                # The cluster's hard quota is taken by running jobs: a job that may preempt some of them (rule 6)
                # must not stop at it, or with a cap at the cluster's size no lender ever got its GPUs back and no
                # urgent job ever ran until others ended on their own. It tries a plan that frees enough.
                rest = quota.check(job.project, job.user, job.gpus, may_borrow=job.stoppable, cluster=False)
                if rest.ok and _may_preempt(job, rest.borrowed, quota, snapshot, config):
                    over_cap = quota.total + job.gpus - quota.cluster_limit()
                    cap_reason = verdict.reason
                    verdict = rest
            if not verdict.ok:
                why[job.id], tier_of[job.id] = verdict.reason, verdict.tier
                continue
            borrowed = verdict.borrowed
        if over_cap:
            planned: Preempt | None = None
            later: _Later | None = None
            tried = not preemptions and attempts < config.max_preemption_attempts
            if tried:
                attempts += 1
                if victim_pool is None:
                    victim_pool = eligible(snapshot.running, now=now, config=config)
                planned = _plan_preemption(job, totals[job.id], borrowed, quota, snapshot, stopping, schedulable,
                                           index, victim_pool, config, min_freed=over_cap)
                if planned is None:
                    in_order = in_order or by_eligibility(snapshot.running, now=now, config=config)
                    later = _plan_later(job, totals[job.id], borrowed, quota, snapshot, stopping, schedulable, index,
                                        config, now, in_order, min_freed=over_cap)
            if planned is not None:
                preemptions.append(planned)
                starts[job.id] = _stopped_by(planned.victims, running_by_id, now)
            # Like any job a quota holds back, it holds nothing meanwhile and blocks nobody (rule 5).
            why[job.id] = (planned.reason + reasons.stopped_by(starts[job.id]) if planned is not None
                           else later.reason if later is not None
                           else cap_reason + ("" if tried else reasons.not_tried_preemption(
                               config.max_preemption_attempts, bool(preemptions))))
            tier_of[job.id] = "" if planned is not None or later is not None else "cluster"
            if later is not None:
                starts[job.id] = later.start
            continue
        # Rule 3: held GPUs are open to a job only if it is done by the time the reservation starts: one whose
        # limit the system will keep (gateway/jobs/runtime_limits.py), never one declared not stoppable (R5).
        ends = None if job.runtime_limit_s is None else now + timedelta(seconds=job.runtime_limit_s)
        use_held = (reservation is not None and ends is not None and ends <= reservation.expected_start
                    and job.stoppable)
        exhausted = exhausted or index.max_available(use_held=True) < smallest_after[i]
        if head is not None and tried_behind_head >= config.backfill_depth and not exhausted:
            fitting = index.count_fitting(g, use_held)
            why[job.id] = reasons.not_tried(n, g, fitting, config.backfill_depth, head.id)
            continue
        if head is not None:
            tried_behind_head += 1
        # Rule 2: gang placement, all or nothing; skipped once nothing left can fit (rule 3's early stop).
        if not shortcuts or (not exhausted and index.count_fitting(g, use_held, exclude) >= n):
            ranks = index.best_fit(g, n, use_held, exclude)
        else:
            ranks = None
        if ranks is not None:
            placement = index.allocate(ranks, g, use_held)
            admits.append(Admit(job_id=job.id, placement=placement, priority=parts[job.id], borrowed=borrowed))
            if quota is not None:
                quota.add(job.project, job.user, job.gpus, borrowed)
            end = ends if ends is not None else now + timedelta(seconds=config.default_runtime_s)
            releases += [Release(at=end, job_id=job.id, rank=rank_of[p.node], gpus=p.gpus, assumed=ends is None)
                         for p in placement]
            continue
        fitting = index.count_fitting(g, use_held, exclude)
        if exclude:
            # Neither a reservation nor a preemption plan can be limited to the nodes that isolate jobs, so such a
            # job takes neither: it waits until isolated nodes have room, and holds nothing meanwhile.
            why[job.id] = reasons.waiting(n, g, fitting) + reasons.ISOLATED_ONLY
            continue
        planned = None
        later = None
        may_preempt = _may_preempt(job, borrowed, quota, snapshot, config)
        tried = may_preempt and not preemptions and attempts < config.max_preemption_attempts
        if tried:
            attempts += 1
            if victim_pool is None:
                victim_pool = eligible(snapshot.running, now=now, config=config)
            planned = _plan_preemption(job, totals[job.id], borrowed, quota, snapshot, stopping, schedulable, index,
                                       victim_pool, config)
            if planned is not None:
                preemptions.append(planned)
            else:
                in_order = in_order or by_eligibility(snapshot.running, now=now, config=config)
                later = _plan_later(job, totals[job.id], borrowed, quota, snapshot, stopping, schedulable, index,
                                    config, now, in_order)
        natural: datetime | None = None  # the head's start by running jobs ending, without a preemption
        if head is None:
            # Rule 3: head of line.
            head = job
            plan = earliest_start(index, releases, g, n)
            natural = plan.start if plan is not None else None
            if plan is None:
                why[job.id] = reasons.start_unknown(n, g, fitting)
            elif (plan.start > now + timedelta(seconds=config.reservation_window_s)
                  and _waited_s(job, now) < config.reservation_window_s):
                # Held from when the start comes within the window, or once it has waited that long: the earlier.
                held_from = min(plan.start - timedelta(seconds=config.reservation_window_s),
                                now + timedelta(seconds=config.reservation_window_s - _waited_s(job, now)))
                why[job.id] = reasons.beyond_window(n, g, fitting, plan.start, config.reservation_window_s, held_from)
            else:
                index.hold(plan.gpus_by_rank)
                reservation = Reserve(job_id=job.id, expected_start=plan.start,
                                      nodes=tuple(schedulable[r].id for r in sorted(plan.gpus_by_rank)))
                why[job.id] = reasons.reserved(n, g, fitting, plan.start)
            if plan is not None and plan.assumed:
                why[job.id] += reasons.guessed_start(config.default_runtime_s, config.max_occupancy_s)
        elif reservation is not None and not use_held and index.count_fitting(g, use_held=True) >= n:
            why[job.id] = reasons.behind_reservation(reservation.job_id, reservation.expected_start,
                                                     job.runtime_limit_s, stoppable=job.stoppable)
        elif reservation is not None and not use_held:
            held = index.count_fitting(g, use_held=True) - fitting
            why[job.id] = reasons.waiting(n, g, fitting, held=held, held_for=reservation.job_id)
        else:
            why[job.id] = reasons.waiting(n, g, fitting)
        if planned is not None:
            starts[job.id] = _stopped_by(planned.victims, running_by_id, now)
            why[job.id] = planned.reason + reasons.stopped_by(starts[job.id])
        elif later is not None and (natural is None or later.start < natural):
            # A preemption once its victims pass their minimum runtime comes first: said beside a reservation
            # held meanwhile, instead of anything else.
            held_now = reservation is not None and reservation.job_id == job.id
            why[job.id] = f"{why[job.id]}; {later.reason}" if held_now else later.reason
            starts[job.id] = later.start
        elif may_preempt and not tried:
            why[job.id] += reasons.not_tried_preemption(config.max_preemption_attempts, bool(preemptions))
        if planned is None:
            why[job.id] += degraded_note(g)

    # Rule 4: positions among each queue's waiting jobs.
    position: Counter[str] = Counter()
    blocked: list[Blocked] = []
    for job in ordered:
        if job.id in why:
            position[job.queue] += 1
            blocked.append(Blocked(job_id=job.id, reason=why[job.id], position=position[job.queue],
                                   quota_tier=tier_of.get(job.id, ""), expected_start=starts.get(job.id)))
    return CycleResult(admits=tuple(admits), reservations=() if reservation is None else (reservation,),
                       blocked=tuple(blocked), preemptions=tuple(preemptions), priorities=parts)


def _waited_s(job: PendingJob, now: datetime) -> float:
    """Seconds the job has waited in the queue, earlier stints included (as aging counts them)."""
    return max(0.0, (now - job.submitted_at).total_seconds()) + job.wait_credit_s


def _stopped_by(victims: Iterable[Victim], running: Mapping[JobId, RunningJob], now: datetime) -> datetime:
    """P4: when victims asked to stop at `now` have freed their GPUs: the longest of their grace windows."""
    return now + timedelta(seconds=max((running[v.job_id].grace_s for v in victims if v.job_id in running),
                                       default=0.0))


def _reclaims(job: PendingJob, borrowed: bool, quota: QuotaUsage | None, snapshot: Snapshot) -> bool:
    return quota is not None and not borrowed and any(
        r.borrowed and r.project != job.project and r.stop_by is None for r in snapshot.running)


def _may_preempt(job: PendingJob, borrowed: bool, quota: QuotaUsage | None, snapshot: Snapshot,
                 config: SchedulerConfig) -> bool:
    return job.queue in config.preempting_queues or _reclaims(job, borrowed, quota, snapshot)


def _plan_preemption(job: PendingJob, priority: float, borrowed: bool, quota: QuotaUsage | None,
                     snapshot: Snapshot, stopping: Sequence[RunningJob], schedulable: Sequence[NodeState],
                     index: FreeIndex, pool: Sequence[tuple[RunningJob, Victim]],
                     config: SchedulerConfig, *, min_freed: int = 0) -> Preempt | None:
    """Rule 6: a reclaim or a priority preemption for a job that passed its quotas but does not fit, or that
    only the cluster's hard quota holds back (min_freed: what it exceeds that quota by)."""
    reclaim = _reclaims(job, borrowed, quota, snapshot)
    by_priority = job.queue in config.preempting_queues
    # Rule 4 of scheduler.preemption: counts copied from this cycle's working index, not live state.
    copy = [NodeState(n.id, n.gpus, frozenset(index.free[r]), n.alive) for r, n in enumerate(schedulable)]
    kind = "reclaim" if reclaim else "priority"
    ordered = for_preemptor(pool, preemptor_priority=priority, preemptor_project=job.project, reclaim=reclaim)
    victims = plan_victims(copy, ordered, job.gpus_per_node, job.nodes, coming_free=stopping, min_freed=min_freed)
    if not victims and reclaim and by_priority:
        kind = "priority"
        ordered = for_preemptor(pool, preemptor_priority=priority, preemptor_project=job.project, reclaim=False)
        victims = plan_victims(copy, ordered, job.gpus_per_node, job.nodes, coming_free=stopping,
                               min_freed=min_freed)
    if not victims:
        return None
    reason = reasons.preempting(kind, [v.job_id for v in victims])
    return Preempt(job_id=job.id, kind=kind, victims=victims, reason=reason)


@dataclass(frozen=True)
class _Later:
    """Rule 6 with P2: no plan now, one at `at` (when its last victim passes its queue's minimum runtime)."""

    at: datetime
    start: datetime  # `at` plus the victims' grace windows
    reason: str


def _plan_later(job: PendingJob, priority: float, borrowed: bool, quota: QuotaUsage | None, snapshot: Snapshot,
                stopping: Sequence[RunningJob], schedulable: Sequence[NodeState], index: FreeIndex,
                config: SchedulerConfig, now: datetime, in_order: list[tuple[datetime, RunningJob]], *,
                min_freed: int = 0) -> _Later | None:
    """Rule 6 when it found no plan: the first time one exists because lower-priority (or borrowed) jobs reach
    their queue's minimum runtime (config.min_runtime_s), so the job's wait and its estimate say so."""
    copy = [NodeState(n.id, n.gpus, frozenset(index.free[r]), n.alive) for r, n in enumerate(schedulable)]
    kinds = ([True] if _reclaims(job, borrowed, quota, snapshot) else []) + (
        [False] if job.queue in config.preempting_queues else [])
    found: list[tuple[datetime, tuple[Victim, ...], bool]] = []
    for reclaim in kinds:
        first = first_plan(copy, snapshot.running, job.gpus_per_node, job.nodes, now=now, config=config,
                           preemptor_priority=priority, preemptor_project=job.project, reclaim=reclaim,
                           coming_free=stopping, min_freed=min_freed, in_order=in_order)
        if first is not None:
            found.append((first[0], first[1], reclaim))
    if not found:
        return None
    at, victims, reclaim = min(found, key=lambda f: f[0])
    by_id = {r.id: r for r in snapshot.running}
    start = _stopped_by(victims, by_id, at)
    waits = [(v.job_id, by_id[v.job_id].queue, may_preempt_from(by_id[v.job_id], config)) for v in victims]
    return _Later(at=at, start=start, reason=reasons.preempting_later(
        "reclaim" if reclaim else "priority", waits, {q: config.min_runtime_s[q] for _, q, _ in waits}, start))


def _check(snapshot: Snapshot, now: datetime) -> None:
    """Raises InconsistentSnapshot; checks only what crosses records (each record checked itself)."""
    if now.utcoffset() is None:
        raise InconsistentSnapshot("now must be timezone-aware")
    nodes = {n.id: n for n in snapshot.nodes}
    if len(nodes) != len(snapshot.nodes):
        raise InconsistentSnapshot(f"duplicate node ids: {_dupes(n.id for n in snapshot.nodes)}")
    ids = [j.id for j in snapshot.pending] + [j.id for j in (*snapshot.running, *snapshot.withheld)]
    if len(set(ids)) != len(ids):
        raise InconsistentSnapshot(f"duplicate job ids: {_dupes(ids)}")
    for p in snapshot.pending:
        if p.submitted_at.utcoffset() is None:
            raise InconsistentSnapshot(f"job {p.id}: submitted_at must be timezone-aware")
    for r in snapshot.running:
        if r.started_at.utcoffset() is None:
            raise InconsistentSnapshot(f"job {r.id}: started_at must be timezone-aware")
        for pl in r.placement:
            node = nodes.get(pl.node)
            # A running job on an unknown node frees nothing usable; it does not stop the pool.
            if node is None:
                continue
            clash = node.free.intersection(pl.gpus)
            if clash:
                raise InconsistentSnapshot(f"job {r.id} runs on GPUs {sorted(clash)} of node {node.id}, "
                                           "which are also listed as free")
            # A node reporting fewer GPUs than its jobs hold must come sized to cover them and marked degraded.
            stray = [x for x in pl.gpus if not 0 <= x < node.gpus]
            if stray:
                raise InconsistentSnapshot(f"job {r.id} runs on GPUs {stray} that node {node.id} lacks")


def _dupes(ids: Iterable[str]) -> list[str]:
    seen = Counter(ids)
    return sorted(str(k) for k, c in seen.items() if c > 1)
