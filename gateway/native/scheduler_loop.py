"""Runs the pure scheduler core against the business DB: snapshot → run_cycle → placements, start and
preemption commands, and the per-job explanation (position, priority parts, reason, estimated start). Part of
jobgate's own execution (gateway/native/execution.py); a placement's rows are written by gateway/jobs/placement.py."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import orjson
from sqlalchemy import Row, Table, bindparam, select, text, update
from sqlalchemy.orm import Session, defer

from gateway.decisions.notifications import notify
from gateway.decisions.pipeline import record_outcome
from gateway.jobs import placement, preemption, priority_history
from gateway.jobs.quotas import load_quotas
from gateway.jobs.records import lock_jobs
from gateway.jobs.runtime_limits import stop_overrunning
from gateway.jobs.sched_view import WaitingFacts, pending_job, running_job
from gateway.jobs.scheduler_config import scheduler_config
from gateway.jobs.stops import escalate_unconfirmed_stops, ledger_transition
from gateway.metrics import SCHEDULER_CYCLE_SECONDS
from gateway.native.commands import enqueue
from gateway.native.deps import Native
from gateway.native.node_health import mark_lost_nodes
from gateway.store.models import Allocation, Job, Node, NodeCommand
from gateway.store.scheduler_tables import SchedJob, TenantUsage
from gateway.store.states import ACTIVE_STATES, ENDED_STATES, WITHHELD_STATES
from scheduler import reasons
from scheduler.cycle import Admit, CycleResult, Preempt, run_cycle
from scheduler.estimate import after_admits, estimate_starts, quota_starts
from scheduler.model import (
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

log = logging.getLogger("jobgate.scheduler")


def _past_validity(job: WaitingFacts, now: datetime | None) -> bool:
    return bool(now is not None and job.auto_offline and job.valid_until is not None and job.valid_until <= now)


@dataclass(frozen=True)
class UnisolatedNodesTake:
    """Which jobs a node that cannot isolate them may take (policies/data.json `isolation.unisolated_nodes_take`,
    H1): external-rights jobs or not, and jobs of which projects."""

    external_rights: bool = False
    projects: frozenset[str] = frozenset({"*"})

    @classmethod
    def of(cls, data: dict[str, Any]) -> UnisolatedNodesTake:
        take = data.get("isolation", {}).get("unisolated_nodes_take", {})
        return cls(bool(take.get("external_rights", False)), frozenset(take.get("projects", ["*"])))

    def needs_isolation(self, job: WaitingFacts) -> bool:
        return (job.external_rights and not self.external_rights) or \
            ("*" not in self.projects and job.project not in self.projects)


# Job columns neither the plan nor the explanation of a job holding GPUs reads: deferred, not refused (a job the
# cycle stops reads its own when it needs them).
_UNPLANNED = (Job.command, Job.env, Job.dependencies, Job.downstream, Job.labels, Job.submitted_via, Job.evidence,
              Job.history)

# What the plan and the explanation read of a waiting job and of its scheduler row (`scheduled` is None until it
# has one): plain rows, not ORM objects. Loading 1,000 waiting jobs as objects of both tables (their JSON
# decoded) and writing the explanation back through the unit of work were two thirds of a cycle, which runs up
# to every second and, on SQLite, holds the write lock all along.
_WAITING = (
    select(Job.id, Job.project, Job.owner, Job.queue, Job.gpus_per_node, Job.nodes, Job.submitted_at,
           Job.base_priority, Job.runtime_limit_s, Job.stoppable, Job.external_rights, Job.auto_offline,
           Job.valid_until, Job.state_reason, SchedJob.job_id.label("scheduled"), SchedJob.queued_at,
           SchedJob.contribution, SchedJob.wait_credit_s, SchedJob.compensation, SchedJob.manual,
           SchedJob.priority, SchedJob.recorded_priority, SchedJob.restart_notice_pending)
    .join(SchedJob, SchedJob.job_id == Job.id, isouter=True).where(Job.state == "pending"))

# A waiting job's row as the snapshot read it (_WAITING), by id.
WaitingRows = dict[JobId, Row[*tuple[Any, ...]]]


def _read_snapshot(session: Session, now: datetime | None,
                   take: UnisolatedNodesTake | None) -> tuple[Snapshot, WaitingRows]:
    """A frozen copy of nodes, waiting and GPU-holding jobs, quotas in effect and decayed usage (`take` says which
    waiting jobs may run only on nodes that isolate jobs), and the waiting jobs' rows it read: the cycle explains
    each of them from these, where it used to read every waiting job's rows a second time."""
    used: dict[str, set[int]] = defaultdict(set)
    # A job holds what its unreleased allocations hold, not its whole placement: one gang member may have
    # exited or stopped (released on the node's evidence) while the others still run.
    held: dict[str, list[Placement]] = defaultdict(list)
    for job_id, node_id, gpus in session.execute(
        select(Allocation.job_id, Allocation.node, Allocation.gpus).where(Allocation.released.is_(False))
        .order_by(Allocation.job_id, Allocation.node)
    ).all():
        used[node_id].update(gpus)
        held[job_id].append(Placement(node=NodeId(node_id), gpus=tuple(gpus)))
    nodes = tuple(_node_state(n, used[n.id]) for n in session.scalars(select(Node).order_by(Node.id)).all())
    pending: list[PendingJob] = []
    waiting: WaitingRows = {}
    for w in session.execute(_WAITING).all():
        if _past_validity(w, now):
            continue  # R4: housekeeping reclaims it; started now, it would only be stopped again
        waiting[JobId(w.id)] = w
        pending.append(pending_job(w, w if w.scheduled is not None else None,
                                   needs_isolation=take is not None and take.needs_isolation(w)))
    running: list[RunningJob] = []
    withheld: list[RunningJob] = []
    for j, s in session.execute(
        select(Job, SchedJob).join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
        .where(Job.state.in_((*ACTIVE_STATES, *WITHHELD_STATES)))
        .options(*(defer(c) for c in _UNPLANNED), defer(SchedJob.mounts), defer(SchedJob.datasets))).all():
        (withheld if j.state in WITHHELD_STATES else running).append(running_job(
            j, priority=s.priority if s else j.base_priority, placement=held.get(j.id, ()),
            borrowed=bool(s and s.borrowed), occupancy_since=preemption.occupancy_since(j, s) if s else None))
    quotas = load_quotas(session, now) if now is not None else None
    usage = {ProjectId(u.project): u.gpu_hours for u in session.scalars(select(TenantUsage)).all()}
    return Snapshot(nodes=nodes, pending=tuple(pending), running=tuple(running), quotas=quotas, usage=usage,
                    withheld=tuple(withheld)), waiting


def _node_state(node: Node, used: set[int]) -> NodeState:
    """The node as the scheduler sees it. One whose agent reports fewer GPUs than its unreleased allocations
    reach (a GPU fell off the bus, a misconfigured agent; gateway/native/agents.py alerts on-call) is degraded: sized
    to cover them, so the snapshot stays consistent and the rest of the cluster keeps scheduling, and closed to
    new work until its jobs fit what it reports. Its free GPUs are only ever among those it reports."""
    gpus = max(node.gpus, max(used, default=-1) + 1)
    return NodeState(id=NodeId(node.id), gpus=gpus, free=frozenset(set(range(node.gpus)) - used),
                     alive=node.state == "alive", degraded=gpus > node.gpus, isolated=node.isolation != "none")


def decay_usage(session: Session, now: datetime, half_life_s: float) -> None:
    """Q3: usage(t) = usage × 2^(-dt / half-life) + GPUs held × dt, per tenant."""
    held: dict[str, int] = defaultdict(int)
    for project, g, n in session.execute(
            select(Job.project, Job.gpus_per_node, Job.nodes)
            .where(Job.state.in_((*ACTIVE_STATES, *WITHHELD_STATES)))).all():
        held[project] += g * n
    rows = {u.project: u for u in session.scalars(select(TenantUsage)).all()}
    for project in set(rows) | set(held):
        row = rows.get(project)
        if row is None:
            row = TenantUsage(project=project, gpu_hours=0.0, updated_at=now)
            session.add(row)
        dt = max(0.0, (now - row.updated_at).total_seconds())
        row.gpu_hours = row.gpu_hours * 2.0 ** (-dt / half_life_s) + held.get(project, 0) * dt / 3600.0
        row.updated_at = now


def run_once(gw: Native, planner: Planner | None = None) -> int:
    """One scheduling cycle. Returns the number of jobs admitted.

    PostgreSQL: one transaction, every job it may change locked first. SQLite, where a write transaction holds the
    one write lock and every request that writes waits for it: the plan is made in a read transaction, with the
    write lock free, and written in short transactions of its own. A whole cycle under the write lock (with 1,750
    jobs waiting, ~190 ms on this machine, two fifths of it the explanation's write) kept every approval and stop
    waiting for it: approvals at a person's pace had a p99 of 172-269 ms with the loop running, 29-34 ms without it
    (bench/gateway.py --with-scheduler); planned apart, 72-107 ms (57-70 ms with gil_switch_interval_s at 1 ms).
    `planner` makes the plan where `jobgate up` has one (gateway/native/planner_process.py), else this thread.
    """
    if gw.db.is_sqlite:
        return _run_planned_apart(gw, planner)
    with gw.transaction() as session:
        # Every job the cycle may change, locked at once in id order (as a stop or a batch locks them): its
        # steps used to lock theirs one round after another, holding some while waiting for others, which
        # deadlocked with a request holding one of those and waiting for one the cycle held. Only their ids are
        # read: loading whole rows (each waiting job's command, env and history as JSON) was a fifth of a cycle's
        # CPU, and each step below reads what it needs, after the lock.
        session.execute(select(Job.id).where(Job.state.not_in(ENDED_STATES)).order_by(Job.id).with_for_update())
        now, config = _chores(gw, session)
        snapshot, waiting = _read_snapshot(session, now, UnisolatedNodesTake.of(gw.policy_set.data))
        result = run_cycle(snapshot, now=now, config=config)
        # Read again under their locks, so that _admit and preemption.execute skip a job that is no longer waiting
        # or running rather than write over a change (lock_jobs).
        lock_jobs(session, [a.job_id for a in result.admits]
                  + [v.job_id for plan in result.preemptions for v in plan.victims])
        _apply(gw, session, result.admits, result.preemptions, now)
        explanation = _explain(snapshot, waiting, result, now, config)
        _write_marks(session, explanation, now)
        _write_explanations(session, explanation.rows, now)
        return len(result.admits)


# How many waiting jobs' explanations one SQLite write transaction writes: each holds the write lock for a few ms.
EXPLAINED_PER_TRANSACTION = 200


def _run_planned_apart(gw: Native, planner: Planner | None) -> int:
    """run_once on SQLite: the chores, then the plan in a read transaction (by `planner`, else in this thread), then
    its admissions, preemptions and marks in one write transaction and the explanation in short ones
    (EXPLAINED_PER_TRANSACTION jobs each).

    Requests may commit between the read and the writes: a job stopped, paused or reprioritised meanwhile. The
    writes therefore check what they change, as the PostgreSQL cycle does after it locks: _admit admits only a job
    still waiting, preemption.execute stops only victims still running and only for a preemptor still waiting, and
    an explanation (with its aging entry) is written only onto a job still waiting and not reprioritised since.
    Only this loop places jobs, so no GPUs the plan hands out can have been taken meanwhile; a node lost meanwhile
    gets a start it never takes up, which requeue_undelivered_starts answers as for any start a node did not
    take."""
    with gw.transaction() as session:
        now, config = _chores(gw, session)
    take = UnisolatedNodesTake.of(gw.policy_set.data)
    plan = planner(now, config, take) if planner is not None else None
    if plan is None:
        with gw.transaction(immediate=False) as session:
            plan = make_plan(session, now, config, take)
    with gw.transaction() as session:
        _apply(gw, session, plan.admits, plan.preemptions, now)
        _write_marks(session, plan.explanation, now)
    rows = plan.explanation.rows
    for i in range(0, len(rows), EXPLAINED_PER_TRANSACTION):
        with gw.transaction() as session:
            _write_explanations(session, rows[i:i + EXPLAINED_PER_TRANSACTION], now)
    return len(plan.admits)


@dataclass(frozen=True)
class Plan:
    """What a SQLite cycle planned from one read of the database: the jobs to start, the preemptions, and what to
    write about the jobs left waiting."""

    admits: tuple[Admit, ...]
    preemptions: tuple[Preempt, ...]
    explanation: Explanation


# Makes a cycle's plan (make_plan) at (now, config, take) from the database as it is then, or None to leave it to the
# loop's thread; run_once on SQLite asks one where it has one (gateway/native/planner_process.py: a process of its
# own).
Planner = Callable[[datetime, SchedulerConfig, UnisolatedNodesTake], Plan | None]


def make_plan(session: Session, now: datetime, config: SchedulerConfig, take: UnisolatedNodesTake) -> Plan:
    """The snapshot read in `session`, the cycle run on it and the waiting jobs explained: reads only."""
    snapshot, waiting = _read_snapshot(session, now, take)
    result = run_cycle(snapshot, now=now, config=config)
    return Plan(result.admits, result.preemptions, _explain(snapshot, waiting, result, now, config))


def _chores(gw: Native, session: Session) -> tuple[datetime, SchedulerConfig]:
    """What a cycle does before it plans: node health, stop escalation, runtime limits, partial holds, undelivered
    starts, usage decay, occupancy (P3). Returns the cycle's time and configuration."""
    now = gw.clock()
    cycle_chores(gw, session, now)  # node health, stop escalation, runtime limits
    break_partial_holds(gw, session)  # Q7
    requeue_undelivered_starts(gw, session, now)
    config = scheduler_config(gw)
    decay_usage(session, now, config.fairshare_half_life_s)
    preemption.check_occupancy(gw, session, now, config)  # P3
    return now, config


def _apply(gw: Native, session: Session, admits: Sequence[Admit], preemptions: Sequence[Preempt],
           now: datetime) -> None:
    _admit(gw, session, admits, now)
    for plan in preemptions:
        preemptor = session.get(Job, plan.job_id)
        if preemptor is not None and preemptor.state == "pending":  # not stopped or paused since the plan
            preemption.execute(gw, session, plan, now)


def break_partial_holds(gw: Native, session: Session) -> list[str]:
    """Q7, detect and break: a waiting job holds no GPUs. A gang's allocations are written in the transaction
    that starts it and removed in the one that requeues it, so none should exist; one found anyway (a manual
    repair, a half-restored backup) could join a circular wait with another gang waiting for what it holds.
    Its allocations are removed, as a requeue removes a gang's old parts (one allocation per job and node),
    and the release is ledgered, naming what it held. Returns the jobs' ids."""
    held: dict[str, list[Allocation]] = defaultdict(list)
    for part in session.scalars(select(Allocation).join(Job, Job.id == Allocation.job_id)
                                .where(Allocation.released.is_(False), Job.state == "pending")
                                .order_by(Allocation.job_id, Allocation.node)).all():
        held[part.job_id].append(part)
    for job_id, parts in held.items():
        record_outcome(gw, "schedule", {
            "job_id": job_id, "result": "partial_hold_released", "rule": "Q7",
            "reason": "a waiting job held GPUs; a gang holds nothing until all of it starts",
            "held": [{"node": p.node, "gpus": list(p.gpus)} for p in parts]})
        log.warning("Q7: released the GPUs waiting job %s held on %s", job_id, ", ".join(p.node for p in parts))
        for p in parts:
            session.delete(p)
    return sorted(held)


# States of a placed job that may never have started: placed, or placed and then its node was lost.
NEVER_STARTED = ("starting", "lost")


def requeue_undelivered_starts(gw: Native, session: Session, now: datetime) -> list[str]:
    """A starting job none of whose nodes ever fetched its start command before the command expired goes back to
    the queue. An expired command is never handed out again, so such a job stayed `starting` for ever, holding its
    GPUs and its quota, and its owner read only where it had been placed. Never delivered means no agent saw it,
    so no process can exist; a job one of whose commands was delivered is left to its nodes' reports. It keeps
    its place in the queue: its wait never stopped. Ledgered; the owner is told. Returns the jobs' ids.

    So does one marked `lost` before any node fetched its start (its node died first): it withheld GPUs that hold
    nothing, and when the node came back the job was reported `failed` though it never ran."""
    latest: dict[tuple[str, str], NodeCommand] = {}
    for cmd in session.scalars(select(NodeCommand).join(Job, Job.id == NodeCommand.job_id)
                               .where(Job.state.in_(NEVER_STARTED), NodeCommand.kind == "start")
                               .order_by(NodeCommand.created_at)).all():
        latest[cmd.job_id, cmd.node] = cmd  # this run's start: the last one sent to that node
    parts: dict[str, list[Allocation]] = defaultdict(list)
    for part in session.scalars(select(Allocation).join(Job, Job.id == Allocation.job_id)
                                .where(Job.state.in_(NEVER_STARTED))).all():
        parts[part.job_id].append(part)
    requeued = []
    for job_id, held in sorted(parts.items()):
        sent = [latest.get((job_id, p.node)) for p in held]
        if not all(c is not None and c.delivered_at is None and c.expires_at <= now and p.state == "starting"
                   for c, p in zip(sent, held, strict=True)):
            continue
        job = session.get(Job, job_id)
        if job is None:
            continue
        nodes = sorted(p.node for p in held)
        for p in held:
            session.delete(p)
        session.flush()  # gone before this cycle may place the job again, on the same node (one row per node)
        job.placement = []
        priority_history.ensure(session, job).borrowed = False  # it holds nothing, owned or borrowed
        reason = (f"its start command expired before node {', '.join(nodes)} fetched it; nothing ran, and it is "
                  "back in the queue in its place")
        ledger_transition(gw, job, "pending", now, by="scheduler", reason=reason, nodes=nodes)
        notify(session, job.owner, "start_not_delivered", {"job_id": job.id, "nodes": nodes, "reason": reason}, now)
        requeued.append(job_id)
    return requeued


def _admit(gw: Native, session: Session, admits: Sequence[Admit], now: datetime) -> None:
    """The cycle's admissions: each job's rows (gateway/jobs/placement.py), then a signed start per part."""
    for admit in admits:
        job = session.get(Job, admit.job_id)
        if job is None or job.state != "pending":
            continue
        parts = [(str(p.node), list(p.gpus)) for p in admit.placement]
        placement.admit(gw, session, job, parts, borrowed=admit.borrowed, priority=admit.priority.as_dict(), now=now)
        for node, gpus in parts:
            enqueue(gw, session, node, job.id, "start", {
                "argv": list(job.command), "gpus": gpus, "grace_seconds": job.grace_seconds,
                "stop_signal": job.stop_signal, "env": dict(job.env),
                # H1: a node that maps people to Unix accounts runs the job as its submitter's account.
                "run_as": job.creator if job.creator_kind == "person" else None})


@dataclass
class Explanation:
    """What a cycle writes about the jobs left waiting (Q10, Q3, Q9), made from the plan before anything is written.

    `rows`: per job, its id, the manual part the plan read, its priority, parts, position, reason and estimated
    start; `reasons`: the jobs whose state_reason changed; `aged`: (last recorded priority, parts) of each job whose
    priority moved by AGING_STEP since its last history entry; `notices`: jobs whose owner awaits their expected
    restart (Q9), with what to tell; `unscheduled`: jobs submitted before the scheduler kept a row for each, and
    their first row; `read`: what the plan read of the scheduler row of each job in those four, (its job id, its
    manual part), (None, None) where it had none: a row that no longer reads so was reprioritised since (A2, A3),
    and keeps what that wrote."""

    rows: list[dict[str, Any]]
    reasons: dict[str, str]
    aged: dict[str, tuple[float, dict[str, float]]]
    notices: dict[str, tuple[str, dict[str, Any]]]
    unscheduled: dict[str, dict[str, Any]]
    read: dict[str, tuple[str | None, float | None]]


def _explain(snapshot: Snapshot, waiting: WaitingRows, result: CycleResult, now: datetime,
             config: SchedulerConfig) -> Explanation:
    """Q10: each waiting job's position, priority parts, reason and estimated start (cached per cycle); Q3: the
    priority changes to record (moved by at least AGING_STEP); Q9: the restart notices due."""
    blocked = {b.job_id: b for b in result.blocked}
    # A job a quota holds back takes no GPUs in the simulation of the others: that says when GPUs are free, so it
    # told such a job it would start now, and pushed the jobs behind it back. It is estimated on its own, below.
    order = sorted((j for j in snapshot.pending if j.id in blocked and not blocked[j.id].quota_tier),
                   key=lambda j: (-result.priorities[j.id].total, j.submitted_at, j.id))
    after = after_admits(snapshot, result.admits, now=now)
    known = {b.job_id: b.expected_start for b in result.blocked if b.expected_start is not None}
    estimates = estimate_starts(after, order, now=now, config=config, known=known)
    # Those a quota holds back: when running jobs' ends let the quota allow them (rule 5 of scheduler.estimate).
    held = quota_starts(after, [j for j in snapshot.pending if j.id in blocked and blocked[j.id].quota_tier],
                        now=now, config=config)
    reason_of = {b.job_id: b.reason for b in result.blocked}
    for job_id, wait in held.items():
        estimates[job_id] = wait.start
        reason_of[job_id] += reasons.quota_allows(wait.allowed_at, wait.ending, wait.start, wait.ending_count)
    # From the rows the snapshot read, not read again. Those the cycle started are not among the blocked.
    out = Explanation(rows=[], reasons={}, aged={}, notices={}, unscheduled={}, read={})
    for job_id, w in waiting.items():
        b = blocked.get(job_id)
        if b is None:
            continue
        parts = result.priorities[job_id].as_dict()
        reason = reason_of[job_id]
        last = w.recorded_priority if w.recorded_priority is not None else w.priority
        if w.scheduled is not None and abs(parts["total"] - last) >= priority_history.AGING_STEP:
            out.aged[w.id] = (last, parts)
        if w.state_reason != reason:
            out.reasons[w.id] = reason
        start = estimates.get(job_id)
        if w.scheduled is None:  # a job submitted before the scheduler kept a row for each
            out.unscheduled[w.id] = {"queued_at": w.submitted_at, "contribution": w.base_priority,
                                     "priority": parts["total"], "parts": parts, "position": b.position,
                                     "blocked_reason": reason, "estimated_start": start, "estimated_at": now}
        else:
            out.rows.append({"id": w.id, "read_manual": w.manual, "priority": parts["total"], "parts": parts,
                             "position": b.position, "reason": reason, "estimated_start": start})
        if w.restart_notice_pending:  # Q9: tell a preempted job's owner when it is expected to run again
            out.notices[w.id] = (w.owner, {
                "job_id": w.id, "position": b.position, "queue": w.queue, "reason": reason,
                "expected_restart": start.isoformat() if start else None})
        if w.id in out.aged or w.id in out.reasons or w.id in out.unscheduled or w.id in out.notices:
            out.read[w.id] = (w.scheduled, w.manual)  # what _write_marks checks before it writes these
    return out


_SCHED_TABLE, _JOB_TABLE = cast(Table, SchedJob.__table__), cast(Table, Job.__table__)
_SCHED, _JOB = _SCHED_TABLE.c, _JOB_TABLE.c
_REASON = (update(_JOB_TABLE).where(_JOB.id == bindparam("b_id"), _JOB.state == "pending")
           .values(state_reason=bindparam("b_reason")))
_RECORDED = (update(_SCHED_TABLE).where(_SCHED.job_id == bindparam("b_job_id"))
             .values(recorded_priority=bindparam("b_recorded")))
_NOTIFIED = (update(_SCHED_TABLE).where(_SCHED.job_id == bindparam("b_job_id"))
             .values(restart_notice_pending=False))


# The explanation rows, written by one statement from one JSON parameter: the database unpacks the rows in C, where
# SQLAlchemy's executemany bound each row's seven parameters in Python (parts as JSON, the start as text): with 1,750
# jobs waiting that was 36 ms of a cycle holding the interpreter, now about 6 (SQLite's own 15 ms of updates run
# without it). An explanation is written only onto a job
# still waiting and not reprioritised since the plan read it (`manual` as read: a float read back from JSON is the
# same double in both databases): on SQLite the plan was read in a transaction before this one, and a job stopped,
# paused or given a priority since keeps what that wrote.
_EXPLAIN_ASSIGNMENTS = """priority = r.priority, parts = r.parts, position = r.position, blocked_reason = r.reason,
    estimated_start = r.estimated_start, estimated_at = :at"""
_EXPLAIN_GUARDS = """sched_jobs.job_id = r.id AND sched_jobs.manual = r.read_manual
    AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = r.id AND jobs.state = 'pending')"""
_EXPLAIN_SQLITE = text(f"""UPDATE sched_jobs SET {_EXPLAIN_ASSIGNMENTS}
FROM (SELECT value ->> '$.id' AS id, value ->> '$.read_manual' AS read_manual, value ->> '$.priority' AS priority,
             value -> '$.parts' AS parts, value ->> '$.position' AS position, value ->> '$.reason' AS reason,
             value ->> '$.estimated_start' AS estimated_start
      FROM json_each(:rows)) AS r
WHERE {_EXPLAIN_GUARDS}""").bindparams(bindparam("at", type_=_SCHED.estimated_at.type))
# json, not jsonb: jsonb would reorder the keys of `parts`, which the API shows as written.
_EXPLAIN_POSTGRES = text(f"""UPDATE sched_jobs SET {_EXPLAIN_ASSIGNMENTS}
FROM json_to_recordset(CAST(:rows AS json)) AS r(id text, read_manual float8, priority float8, parts json,
                                                 position integer, reason text, estimated_start timestamptz)
WHERE {_EXPLAIN_GUARDS}""").bindparams(bindparam("at", type_=_SCHED.estimated_at.type))


def _write_explanations(session: Session, rows: list[dict[str, Any]], at: datetime) -> None:
    """The explanation rows (Explanation.rows), estimated at `at`, in one statement."""
    if not rows:
        return
    connection = session.connection()
    if connection.dialect.name == "sqlite":
        # As SQLAlchemy stores a datetime on SQLite (text it parses back), so the rows read back as the ORM wrote them.
        stored = _SCHED.estimated_start.type.dialect_impl(connection.dialect).bind_processor(connection.dialect)
        assert stored is not None
        rows = [{**r, "estimated_start": stored(r["estimated_start"])} if r["estimated_start"] else r for r in rows]
        statement = _EXPLAIN_SQLITE
    else:
        statement = _EXPLAIN_POSTGRES
    connection.execute(statement, {"rows": orjson.dumps(rows).decode(), "at": at})



def _write_marks(session: Session, ex: Explanation, now: datetime) -> None:
    """What must be written together, for the jobs still waiting: the priority history entries and the priority
    they were recorded at (Q3), the restart notices and their pending marks cleared (Q9), the first scheduler row of
    an older job, and each changed reason."""
    ids = set(ex.aged) | set(ex.notices) | set(ex.unscheduled) | set(ex.reasons)
    if not ids:
        return
    now_read = session.execute(select(Job.id, SchedJob.job_id, SchedJob.manual)
                               .join(SchedJob, SchedJob.job_id == Job.id, isouter=True)
                               .where(Job.id.in_(ids), Job.state == "pending"))
    still = {job_id for job_id, scheduled, manual in now_read if (scheduled, manual) == ex.read[job_id]}
    aged = {job_id: v for job_id, v in ex.aged.items() if job_id in still}
    _record_aging(session, aged, now)
    for job_id, (owner, body) in ex.notices.items():
        if job_id in still:
            notify(session, owner, "expected_restart", body, now)
    if aged:
        session.connection().execute(_RECORDED, [{"b_job_id": job_id, "b_recorded": parts["total"]}
                                                 for job_id, (_, parts) in aged.items()])
    if notified := [{"b_job_id": job_id} for job_id in ex.notices if job_id in still]:
        session.connection().execute(_NOTIFIED, notified)
    for job_id, row in ex.unscheduled.items():
        if job_id in still:
            session.add(SchedJob(job_id=job_id, **row))
    reasons_changed = [{"b_id": job_id, "b_reason": r} for job_id, r in ex.reasons.items() if job_id in still]
    if reasons_changed:
        session.connection().execute(_REASON, reasons_changed)


def _record_aging(session: Session, aged: dict[str, tuple[float, dict[str, float]]], now: datetime) -> None:
    """Q3: a priority entry for each job whose priority moved by AGING_STEP since its last one, named for the
    part that moved the most; the old parts are read only for these."""
    if not aged:
        return
    old: dict[str, dict[str, Any]] = {
        job_id: parts for job_id, parts in session.execute(
            select(SchedJob.job_id, SchedJob.parts).where(SchedJob.job_id.in_(list(aged))))}
    for job_id, (last, parts) in aged.items():
        priority_history.record(session, job_id, now, priority_history.basis_of_change(old.get(job_id) or {}, parts),
                                last, parts)


class SchedulerLoop(threading.Thread):
    """Runs a cycle every interval, or sooner when something changed (submit, release, new node), but never so
    often that cycles take more than `scheduler_max_share` of the time. A kick used to start a cycle at once, so
    a burst of submissions ran them back to back: with 1,000 jobs waiting on PostgreSQL each took ~100 ms, and
    together two thirds of the replica's CPU, which its requests then lacked. Like Slurm's `sched_min_interval`,
    but sized from the last cycle: on a short queue a submitted job still starts within milliseconds."""

    def __init__(self, gw: Native, *, leads: Callable[[], bool] = lambda: True, planner: Planner | None = None) -> None:
        super().__init__(name="jobgate-scheduler", daemon=True)
        self.gw = gw
        self.planner = planner  # SQLite: who makes the plans (run_once)
        self.leads = leads  # the cycle is the leader's (gateway/leadership.py): a follower's loop only waits
        self._stop_event = threading.Event()

    def run(self) -> None:
        settings = self.gw.settings
        ready_at = 0.0  # monotonic time before which no cycle starts: the rest after the last one
        while not self._stop_event.is_set():
            self.gw.scheduler_kick.wait(settings.scheduler_interval_s)
            rest = ready_at - time.monotonic()
            if rest > 0 and self._stop_event.wait(rest):
                break
            self.gw.scheduler_kick.clear()  # after the rest: the kicks during it are served by this one cycle
            if self._stop_event.is_set():
                break
            if not self.leads():
                continue
            began = time.monotonic()
            try:
                run_once(self.gw, self.planner)
            except Exception:  # the loop must outlive one bad cycle; the error is logged with its trace
                log.exception("scheduler cycle failed")
            took = time.monotonic() - began
            SCHEDULER_CYCLE_SECONDS.observe(took)
            ready_at = began + took / settings.scheduler_max_share

    def stop(self) -> None:
        self._stop_event.set()
        self.gw.scheduler_kick.set()
        self.join(timeout=10)


def cycle_chores(gw: Native, session: Session, now: datetime) -> None:
    """Called once per scheduler cycle, in its transaction: node health, stop escalation and runtime limits
    (seconds matter).
    Retention, R4 auto-offline and purges run in the slower housekeeping loop (gateway/jobs/lifecycle.py)."""
    mark_lost_nodes(gw, session, now)
    escalate_unconfirmed_stops(gw, session, now)
    stop_overrunning(gw, session, now)  # Q6: a reservation counts on declared runtime limits being kept
