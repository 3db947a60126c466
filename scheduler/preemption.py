"""Q5 reclaim and Q8 priority preemption: choose victims for one waiting gang, on a copy of the free GPUs.

Victim order (P2, P4, Q5, Q8), the code below follows it:
  1. only running jobs that are stoppable (R5), not already stopping, and have run at least their queue's
     minimum runtime;
     a reclaim (the lender's job within its owned quota) may take only borrowed jobs of other tenants,
     a priority preemption only jobs of lower effective priority than the preemptor;
  2. borrowed GPUs first, then lowest priority, then least lost work (GPU-seconds run so far), then job id;
  3. victims are taken in that order until the gang fits on free + freed GPUs (and, when the cluster's hard
     quota is what stands in the way, until they free at least what the job needs under it); then every
     victim whose removal still leaves both true is dropped again, last taken first (fewest victims, and the
     cheap ones kept);
  4. the plan is computed on per-node counts copied from the snapshot, never on live state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler.model import JobId, NodeId, NodeState, RunningJob, SchedulerConfig


@dataclass(frozen=True)
class Victim:
    job_id: JobId
    borrowed: bool
    priority: float
    gpus: int
    lost_gpu_s: float


@dataclass(frozen=True)
class Preempt:
    """Stop these victims gracefully so `job_id` can start on the GPUs they free (kind: reclaim | priority)."""

    job_id: JobId
    kind: str
    victims: tuple[Victim, ...]
    reason: str


def eligible(running: Sequence[RunningJob], *, now: datetime, config: SchedulerConfig
             ) -> list[tuple[RunningJob, Victim]]:
    """Rule 1's first half and rule 2's order, for every preemptor of a cycle: running, stoppable, not
    stopping, past its queue's minimum runtime; borrowed first, then lowest priority, least lost work, job id."""
    out: list[tuple[RunningJob, Victim]] = []
    for job in running:
        if job.stop_by is not None or not job.stoppable:
            continue
        ran_s = max(0.0, (now - job.started_at).total_seconds())
        if ran_s < config.min_runtime_s[job.queue]:
            continue
        out.append((job, Victim(job.id, job.borrowed, job.priority, job.gpus, ran_s * job.gpus)))
    out.sort(key=lambda jv: (not jv[1].borrowed, jv[1].priority, jv[1].lost_gpu_s, jv[1].job_id))
    return out


def for_preemptor(pool: Sequence[tuple[RunningJob, Victim]], *, preemptor_priority: float, preemptor_project: str,
                  reclaim: bool) -> list[tuple[RunningJob, Victim]]:
    """Rule 1's second half: a reclaim takes only borrowed jobs of other tenants; a priority preemption only
    jobs of lower effective priority. Keeps the order of `pool`."""
    if reclaim:
        return [jv for jv in pool if jv[0].borrowed and jv[0].project != preemptor_project]
    return [jv for jv in pool if jv[0].priority < preemptor_priority]


def candidates(running: Sequence[RunningJob], *, now: datetime, config: SchedulerConfig, preemptor_priority: float,
               preemptor_project: str, reclaim: bool) -> list[tuple[RunningJob, Victim]]:
    """Rules 1 and 2: eligible victims in the order they are taken."""
    return for_preemptor(eligible(running, now=now, config=config), preemptor_priority=preemptor_priority,
                         preemptor_project=preemptor_project, reclaim=reclaim)


def may_preempt_from(job: RunningJob, config: SchedulerConfig) -> datetime:
    """P2/Q8: when `job` has run its queue's minimum runtime, from which a preemption may take it."""
    return job.started_at + timedelta(seconds=config.min_runtime_s[job.queue])


def by_eligibility(running: Sequence[RunningJob], *, now: datetime, config: SchedulerConfig
                   ) -> list[tuple[datetime, RunningJob]]:
    """Rule 1 but the minimum runtime, in the order jobs pass it: (from when a preemption may take it, the job),
    for every running job that is stoppable and not already stopping. One list serves a cycle's attempts."""
    return sorted(((max(now, may_preempt_from(j, config)), j) for j in running if j.stop_by is None and j.stoppable),
                  key=lambda e: (e[0], e[1].id))


def first_plan(nodes: Sequence[NodeState], running: Sequence[RunningJob], gpus_per_node: int, nodes_needed: int,
               *, now: datetime, config: SchedulerConfig, preemptor_priority: float, preemptor_project: str,
               reclaim: bool, coming_free: Sequence[RunningJob] = (), min_freed: int = 0,
               in_order: Sequence[tuple[datetime, RunningJob]] | None = None
               ) -> tuple[datetime, tuple[Victim, ...]] | None:
    """When no plan exists now: the first time one will, as running jobs pass their queue's minimum runtime
    (rule 1), and its victims then. None when even every candidate past its minimum runtime is not enough.

    A plan exists at t exactly when all the candidates eligible at t together free enough (rule 3 takes them
    until they do), whatever their order; so the candidates are added in the order they become eligible until
    they are enough, and rules 2-4 then choose the victims among those eligible at that time.
    """
    # What a plan could ever take (as for_preemptor filters), in the order they may be taken.
    order = by_eligibility(running, now=now, config=config) if in_order is None else in_order
    pool = [e for e in order if (e[1].borrowed and e[1].project != preemptor_project if reclaim
                                 else e[1].priority < preemptor_priority)]
    room = _Room(nodes, gpus_per_node, nodes_needed, min_freed)
    for job in coming_free:
        room.give(job, +1)
    found: datetime | None = None
    for when, job in pool:
        room.give(job, +1)
        if room.enough():
            found = when
            break
    if found is None or found <= now:  # never; or now, which plan_victims answers
        return None
    ordered = candidates([j for when, j in pool if when <= found], now=found, config=config,
                         preemptor_priority=preemptor_priority, preemptor_project=preemptor_project, reclaim=reclaim)
    victims = plan_victims(nodes, ordered, gpus_per_node, nodes_needed, coming_free=coming_free, min_freed=min_freed)
    return (found, victims) if victims else None


class _Room:
    """Free GPUs per schedulable node as jobs are given back (or taken again), with the count of nodes that fit
    the gang and the GPUs freed in all, kept up to date job by job (O(its nodes), not a scan of the cluster)."""

    def __init__(self, nodes: Sequence[NodeState], gpus_per_node: int, nodes_needed: int, min_freed: int) -> None:
        self.free: dict[NodeId, int] = {n.id: len(n.free) for n in nodes if n.schedulable}
        self.gpus_per_node, self.nodes_needed, self.min_freed = gpus_per_node, nodes_needed, min_freed
        self.fitting = sum(1 for c in self.free.values() if c >= gpus_per_node)
        self.freed = 0

    def enough(self) -> bool:
        return self.fitting >= self.nodes_needed and self.freed >= self.min_freed

    def give(self, job: RunningJob, sign: int) -> None:
        self.freed += sign * job.gpus
        for p in job.placement:
            before = self.free.get(p.node)
            if before is None:  # a dead, degraded or unknown node frees nothing usable
                continue
            after = before + sign * len(p.gpus)
            self.free[p.node] = after
            self.fitting += (after >= self.gpus_per_node) - (before >= self.gpus_per_node)


def plan_victims(nodes: Sequence[NodeState], ordered: Sequence[tuple[RunningJob, Victim]],
                 gpus_per_node: int, nodes_needed: int, *, coming_free: Sequence[RunningJob] = (),
                 min_freed: int = 0) -> tuple[Victim, ...] | None:
    """Rules 3 and 4. None when even every candidate is not enough; () when stopping jobs already suffice.

    min_freed: GPUs the victims (with the stopping jobs) must free in all, wherever they are: what the job
    exceeds the cluster's hard quota by. Every GPU a job holds counts against that quota, on any node.
    The number of nodes with at least gpus_per_node free is kept up to date victim by victim, so a plan
    costs O(victims tried × their nodes), not a scan of the cluster per step.
    """
    room = _Room(nodes, gpus_per_node, nodes_needed, min_freed)
    for job in coming_free:
        room.give(job, +1)
    if room.enough():
        return ()
    taken: list[tuple[RunningJob, Victim]] = []
    for job, victim in ordered:
        room.give(job, +1)
        taken.append((job, victim))
        if room.enough():
            break
    else:
        return None
    kept: list[Victim] = []
    for job, victim in reversed(taken):
        room.give(job, -1)
        if not room.enough():
            room.give(job, +1)
            kept.append(victim)
    return tuple(reversed(kept))


def plan_victims_naive(nodes: Sequence[NodeState], ordered: Sequence[tuple[RunningJob, Victim]],
                       gpus_per_node: int, nodes_needed: int, *, coming_free: Sequence[RunningJob] = ()
                       ) -> tuple[Victim, ...] | None:
    """The same plan with a full scan of the cluster after every step: the benchmark's baseline."""
    base = {n.id: len(n.free) for n in nodes if n.schedulable}

    def fits(chosen: Sequence[RunningJob]) -> bool:
        free = dict(base)
        for job in [*coming_free, *chosen]:
            for p in job.placement:
                if p.node in free:
                    free[p.node] += len(p.gpus)
        return sum(1 for c in free.values() if c >= gpus_per_node) >= nodes_needed

    if fits([]):
        return ()
    taken: list[tuple[RunningJob, Victim]] = []
    for item in ordered:
        taken.append(item)
        if fits([j for j, _ in taken]):
            break
    else:
        return None
    for item in reversed(list(taken)):
        rest = [j for j, _ in taken if j is not item[0]]
        if fits(rest):
            taken.remove(item)
    return tuple(v for _, v in taken)
