"""jobgate's own preemption on an executor that places jobs itself (Slurm): Q8, P2, P4.

Natively the scheduler loop plans placements and preemptions in one run of the pure core. On Slurm, Slurm places,
but jobgate alone decides who is preempted (the starter turns Slurm's own preemption off, deploy/slurm): the loop
names the governed jobs Slurm says wait for resources and what it sees running, and this module asks the same pure
core (scheduler.cycle.run_cycle) whether a preemption plan exists, on a snapshot of that view:
- nodes: the executor's nodes in the store; on each, the GPUs the governed jobs jobgate holds placed there use, then
  those that jobs jobgate does not govern (submitted straight to Slurm) use. Those ungoverned jobs are never
  victims: jobgate has no record, no owner to notify and no right it granted to stop them (R5).
- running: the governed jobs placed, stopping or not (a stopping job's GPUs count as freed at its window's end, so
  no second plan is made while a first one is being carried out).
- waiting: only the jobs the executor says wait for resources (its placement is the executor's, not jobgate's).
Priorities are on jobgate's scale, as natively: the queue's baseline plus the job's own parts (a victim's number
is what it would have had waiting, without aging). Slurm's priority numbers order Slurm's queue, not this choice.
A plan found is carried out as natively (preemption.execute: the decision ledgered first, then each victim's
stop with its prepare signal and grace window, requeued afterwards keeping its priority and wait). What the core
says of the rest (admits, reservations) is not acted on: Slurm places.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.jobs import preemption
from gateway.jobs.deps import Jobs
from gateway.jobs.records import lock_jobs
from gateway.jobs.sched_view import pending_job, running_job
from gateway.jobs.scheduler_config import scheduler_config
from gateway.store.models import Allocation, Job, Node
from gateway.store.scheduler_tables import SchedJob
from gateway.store.states import ACTIVE_STATES
from scheduler.cycle import run_cycle
from scheduler.model import (
    NodeId,
    NodeState,
    PendingJob,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)


def snapshot(session: Session, waiting: Sequence[str], ungoverned: Mapping[str, int],
             config: SchedulerConfig) -> Snapshot:
    """The module docstring's snapshot. `ungoverned`: node -> GPUs that jobs jobgate does not govern use there."""
    held: dict[str, list[tuple[str, int]]] = defaultdict(list)  # node -> (job, GPUs) of governed jobs
    for job_id, node, gpus in session.execute(
            select(Allocation.job_id, Allocation.node, Allocation.gpus).where(Allocation.released.is_(False))
            .order_by(Allocation.job_id, Allocation.node)):
        held[node].append((job_id, len(gpus)))
    # The executor names GPUs its own way (every job on a node reports 0..n-1): numbered afresh here, node by
    # node, so that no two jobs share one and the core's consistency check holds.
    placements: dict[str, list[Placement]] = defaultdict(list)
    nodes: list[NodeState] = []
    for node in session.scalars(select(Node).order_by(Node.id)):
        nxt = 0
        for job_id, count in held.get(node.id, []):
            placements[job_id].append(Placement(node=NodeId(node.id), gpus=tuple(range(nxt, nxt + count))))
            nxt += count
        nxt += ungoverned.get(node.id, 0)
        size = max(node.gpus, nxt)
        nodes.append(NodeState(id=NodeId(node.id), gpus=size, free=frozenset(range(nxt, size)),
                               alive=node.state == "alive", degraded=False, isolated=True))
    pending: list[PendingJob] = []
    running: list[RunningJob] = []
    rows = session.execute(select(Job, SchedJob).join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
                           .where(Job.id.in_(list(waiting)) | Job.state.in_(ACTIVE_STATES))).all()
    for j, s in rows:
        own = j.base_priority + (s.contribution + s.compensation + s.manual if s else 0.0)
        if j.state == "pending":
            pending.append(pending_job(j, s))
        elif j.state in ACTIVE_STATES and placements.get(j.id):
            running.append(running_job(j, priority=config.queue_baseline[j.queue] + own,
                                       placement=placements[j.id], borrowed=False, occupancy_since=None))
    return Snapshot(nodes=tuple(nodes), pending=tuple(pending), running=tuple(running), quotas=None, usage={})


def may_preempt(gw: Jobs, session: Session, waiting: Sequence[str]) -> bool:
    """Whether one of the waiting jobs is of a preempting queue (urgent): only such a job preempts here."""
    config = scheduler_config(gw)
    return session.scalar(select(Job.id).where(Job.id.in_(list(waiting)), Job.state == "pending",
                                               Job.queue.in_(config.preempting_queues)).limit(1)) is not None


def preempt_for(gw: Jobs, session: Session, waiting: Sequence[str], ungoverned: Mapping[str, int]) -> list[int]:
    """At most one plan (the core's rule 6) for the waiting jobs, carried out. Returns the decisions' ledger seqs.
    Quotas are Slurm's associations on this backend (Q4), so the core is given none: only a preempting queue's
    job (urgent) preempts, lower-priority stoppable jobs past their queue's minimum runtime, as natively."""
    config = scheduler_config(gw)
    if not may_preempt(gw, session, waiting):
        return []
    now = gw.clock()
    snap = snapshot(session, waiting, ungoverned, config)
    result = run_cycle(snap, now=now, config=config)
    lock_jobs(session, [v.job_id for plan in result.preemptions for v in plan.victims])
    seqs = []
    for plan in result.preemptions:
        seq = preemption.execute(gw, session, plan, now)
        if seq is not None:
            seqs.append(seq)
    return seqs
