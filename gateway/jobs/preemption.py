"""Carries out a preemption plan of the scheduler core (Q5 reclaim, Q8 priority, P2, P4, Q9).

1. Ledger a `preempt` decision by the system actor with the whole plan, before anything changes.
2. Each victim: stop_requested with its grace window, signed stop commands to its nodes, a preemptions
   row (GPU-hours lost), and a notice to its owner (reason, expected restart, checkpoint state).
3. When the agents report the victim stopped, `requeue` puts it back to `pending`, keeping its
   pre-preemption priority and accumulated wait, plus compensation; the owner gets a second notice.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from gateway.decisions.notifications import alert, notify
from gateway.decisions.pipeline import decide, record_outcome
from gateway.decisions.verdict import refuse_unless_allowed
from gateway.errors import Conflict, PolicyDenied
from gateway.identity.auth import Caller
from gateway.jobs import priority_history
from gateway.jobs.deps import Jobs
from gateway.jobs.records import load_job, lock_jobs, run_began, transition
from gateway.jobs.scheduler_config import scheduler_config
from gateway.store.models import Allocation, Job
from gateway.store.scheduler_tables import PreemptionRow, SchedJob
from scheduler.model import SchedulerConfig
from scheduler.occupancy import occupancy
from scheduler.preemption import Preempt

RULES = {"reclaim": "Q5.reclaim_borrowed", "priority": "Q8.priority_preemption"}


def execute(gw: Jobs, session: Session, plan: Preempt, now: datetime) -> int | None:
    """Rules 1 and 2. Returns the decision's ledger seq, or None when no victim is still running."""
    victims = [j for v in plan.victims if (j := session.get(Job, v.job_id)) is not None
               and j.state in ("starting", "running")]
    if not victims:
        return None
    request_id = "req-" + secrets.token_hex(8)
    body = {
        "request_id": request_id,
        "actor": {"id": "scheduler", "kind": "system", "real_identity": "scheduler"},
        "input": {"action": "job.preempt", "preemptor": plan.job_id, "kind": plan.kind,
                  "targets": [v.job_id for v in plan.victims]},
        "decision": {"effect": "allow", "reasons": [plan.reason], "rules": [RULES[plan.kind]]},
        "plan": {"preemptor": plan.job_id, "kind": plan.kind,
                 "victims": [{"job_id": v.job_id, "borrowed": v.borrowed, "priority": v.priority, "gpus": v.gpus,
                              "lost_gpu_hours": round(v.lost_gpu_s / 3600.0, 4)} for v in plan.victims]},
    }
    seq = record_outcome(gw, "decision", body)
    preemptor = session.get(Job, plan.job_id)
    for job in victims:
        why = "reclaim of lent GPUs" if plan.kind == "reclaim" else "urgent"
        reason = (f"preempted by job {plan.job_id} ({why}); graceful window {job.grace_seconds:g} s to checkpoint, "
                  "then requeued")
        _stop_and_requeue_later(gw, session, job, request_id=request_id, seq=seq, preemptor=plan.job_id,
                                preemptor_project=preemptor.project if preemptor else None, kind=plan.kind,
                                reason=reason, now=now)
    return seq


def executor_preempted(gw: Jobs, session: Session, job: Job, *, preemptor: str | None, reason: str) -> int:
    """An executor's own scheduler preempted `job` and stopped it already (Slurm's partition preemption): the
    decision is ledgered as the system's, naming the executor's rule, and the job is marked a preemption's victim
    (no stop is sent: it is over), so that its `stopped` report requeues it with its priority and wait (P2)."""
    now = gw.clock()
    request_id = "req-" + secrets.token_hex(8)
    seq = record_outcome(gw, "decision", {
        "request_id": request_id,
        "actor": {"id": "executor", "kind": "system", "real_identity": "executor's scheduler"},
        "input": {"action": "job.preempt", "preemptor": preemptor, "kind": "executor", "targets": [job.id]},
        "decision": {"effect": "allow", "reasons": [reason], "rules": ["Q8.executor_preemption"]},
    })
    preemptor_job = session.get(Job, preemptor) if preemptor else None
    _stop_and_requeue_later(gw, session, job, request_id=request_id, seq=seq, preemptor=preemptor,
                            preemptor_project=preemptor_job.project if preemptor_job else None, kind="priority",
                            reason=reason, now=now, ask_executor=False)
    return seq


def _stop_and_requeue_later(gw: Jobs, session: Session, job: Job, *, request_id: str, seq: int,
                            preemptor: str | None, preemptor_project: str | None, kind: str, reason: str,
                            now: datetime, ask_executor: bool = True) -> None:
    row = priority_history.ensure(session, job)
    ran_h = max(0.0, (now - (job.started_at or now)).total_seconds()) / 3600.0
    gpus = job.gpus_per_node * job.nodes
    before = job.state
    job.stop_request = {"by": "scheduler", "reason": reason, "ticket": None, "at": now.isoformat(),
                        "request_id": request_id, "decision_seq": seq,
                        "preemption": {"preemptor": preemptor, "kind": kind}}
    transition(job, "stop_requested", now, by="scheduler", reason=reason)
    for part in job.placement if ask_executor else ():
        gw.execution.stop(session, job, part["node"], grace_seconds=job.grace_seconds, reason=reason)
    session.add(PreemptionRow(victim=job.id, preemptor=preemptor or "", kind=kind, project=job.project,
                              owner=job.owner, gpus=gpus, borrowed=row.borrowed, priority_before=row.priority,
                              gpu_hours_lost=gpus * ran_h, state="stopping", at=now, ledger_seq=seq))
    notify(session, job.owner, "preempted", {
        "job_id": job.id, "reason": reason, "kind": kind, "preemptor": preemptor,
        "preemptor_project": preemptor_project,
        "expected_restart": "back in the queue once stopped, keeping its priority and wait; "
                            f"see GET /v1/jobs/{job.id}/queue for the estimate",
        "checkpoint": f"prepare signal {job.stop_signal}, {job.grace_seconds:g} s to write a checkpoint "
                      "into $JOBGATE_CHECKPOINT_DIR"}, now)
    record_outcome(gw, "outcome", {"request_id": request_id, "decision_seq": seq, "action": "job.preempt",
                                   "job_id": job.id, "result": job.state, "state_before": before,
                                   "state_after": job.state, "preemptor": preemptor, "kind": kind})


def occupancy_since(job: Job, row: SchedJob) -> datetime:
    """Start of the current occupancy period: the last renewal of this run, else the run's start.

    Renewals stay in the row across runs (they are the audit trail); one made in an earlier run, before a
    preemption or a pause, says nothing of this one: counted from it, a restarted job was at once past its
    limit, and stopped again every time it started."""
    start = job.started_at or job.submitted_at
    if row.renewals:
        last = datetime.fromisoformat(row.renewals[-1]["at"])
        if last >= start:
            return last
    return start


def check_occupancy(gw: Jobs, session: Session, now: datetime, config: SchedulerConfig) -> None:
    """P3: mark running jobs past their maximum occupancy renewal-due (owner notified); stop and requeue
    those whose renewal window passed without a renewal (ledgered as a system decision)."""
    if config.max_occupancy_s is None:
        return
    rows = session.execute(select(Job, SchedJob).join(SchedJob, SchedJob.job_id == Job.id)
                           .where(Job.state == "running")).all()
    for job, row in rows:
        verdict = occupancy(occupancy_since(job, row), now, config)
        if verdict.state == "renewal_due" and row.renewal_due_at is None:
            assert verdict.renew_by is not None
            row.renewal_due_at = verdict.limit_at
            job.state_reason = (f"renewal due: past its maximum continuous occupancy; renew by "
                                f"{verdict.renew_by.isoformat()} or it is stopped and requeued")
            record_outcome(gw, "transition", {"job_id": job.id, "renewal_due": True,
                                              "renew_by": verdict.renew_by.isoformat()})
            notify(session, job.owner, "renewal_due", {"job_id": job.id, "renew_by": verdict.renew_by.isoformat(),
                                                       "how": f"jobgate job renew {job.id} --progress ... "
                                                              "--remaining SECONDS"}, now)
        elif verdict.state == "expired":
            # Locked and read again before deciding (PostgreSQL): the owner may have renewed it, someone stopped
            # it or its node reported it ended since the query above; writing the stale copy would undo that.
            if lock_jobs(session, [job.id]).get(job.id) is None or job.state != "running":
                continue
            session.refresh(row)
            if occupancy(occupancy_since(job, row), now, config).state != "expired":
                continue
            if not job.stoppable:
                _expired_not_stoppable(gw, session, job, now)
                continue
            request_id = "req-" + secrets.token_hex(8)
            reason = ("maximum continuous occupancy reached and not renewed in time; graceful stop, "
                      "then requeued")
            seq = record_outcome(gw, "decision", {
                "request_id": request_id,
                "actor": {"id": "scheduler", "kind": "system", "real_identity": "scheduler"},
                "input": {"action": "job.preempt", "kind": "occupancy", "targets": [job.id]},
                "decision": {"effect": "allow", "reasons": [reason], "rules": ["P3.occupancy_not_renewed"]},
                "plan": {"kind": "occupancy", "victims": [{"job_id": job.id}],
                         "renew_by": verdict.renew_by.isoformat() if verdict.renew_by else None}})
            _stop_and_requeue_later(gw, session, job, request_id=request_id, seq=seq, preemptor=None,
                                    preemptor_project=None, kind="occupancy", reason=reason, now=now)


EXPIRED_NOT_STOPPABLE = ("occupancy expired, not renewed: declared not stoppable, so the system does not stop "
                         "it; its owner must stop or renew it")


def _expired_not_stoppable(gw: Jobs, session: Session, job: Job, now: datetime) -> None:
    """P3 meets R5: a job declared not stoppable is never stopped by the system (no preemption takes it, no
    emergency stop reaches it), so its unrenewed occupancy is made visible instead: ledgered, its state reason
    says so, and its owner and on-call are told, once."""
    if job.state_reason == EXPIRED_NOT_STOPPABLE:
        return
    job.state_reason = EXPIRED_NOT_STOPPABLE
    record_outcome(gw, "transition", {"job_id": job.id, "occupancy_expired": True, "stoppable": False,
                                      "rule": "P3.occupancy_not_renewed", "result": "left running (R5)"})
    how = f"jobgate job renew {job.id} --progress ... --remaining SECONDS"
    alert(session, now, "occupancy_expired", {"job_id": job.id, "why": EXPIRED_NOT_STOPPABLE, "how": how},
          also=[job.owner])


def renew(gw: Jobs, session: Session, caller: Caller, job_id: str, progress: str,
          remaining_s: float) -> dict[str, Any]:
    """P3: the owner confirms progress and the expected remaining time; a new occupancy period starts.

    Decided by policy as a reprioritisation of one's own job and ledgered. Raises NotFound, Conflict,
    PolicyDenied, LedgerUnavailable.
    """
    job = load_job(session, job_id, for_update=True)
    if job.state != "running":
        raise Conflict(f"job {job.id} is {job.state}; only a running job can be renewed", state=job.state)
    params = {"renew": {"progress": progress, "expected_remaining_seconds": remaining_s}}
    rec = decide(gw, session, caller, "job.priority", targets=[job], project=job.project, params=params,
                 reason=progress)
    refuse_unless_allowed(rec)
    if caller.real_identity != job.owner:
        raise PolicyDenied(f"only the owner of job {job.id} ({job.owner}) may renew it", ledger_seq=rec.seq,
                           reasons=list(rec.decision.reasons), rules=list(rec.decision.rules))
    now = gw.clock()
    row = priority_history.ensure(session, job)
    row.renewals = [*row.renewals, {"at": now.isoformat(), "by": caller.real_identity, "progress": progress,
                                    "expected_remaining_s": remaining_s, "decision_seq": rec.seq}]
    row.renewal_due_at = None
    config = scheduler_config(gw)
    until = (now + timedelta(seconds=config.max_occupancy_s)) if config.max_occupancy_s else None
    if job.state_reason.startswith("renewal due") or job.state_reason == EXPIRED_NOT_STOPPABLE:
        job.state_reason = f"renewed by {caller.real_identity}"
    record_outcome(gw, "outcome", {"request_id": rec.request_id, "decision_seq": rec.seq, "action": "job.renew",
                                   "job_id": job.id, "result": "renewed", "progress": progress,
                                   "expected_remaining_s": remaining_s,
                                   "occupancy_until": until.isoformat() if until else None})
    return {"job_id": job.id, "renewals": len(row.renewals), "occupancy_until": until.isoformat() if until else None}


def is_preempted(job: Job) -> bool:
    return bool(job.stop_request.get("preemption"))


def ended_before_stop(job: Job) -> None:
    """A victim whose run ended on its own (exited or failed) before the prepare signal took effect: its
    preemption record is closed as `ended`; the job finishes as its run did instead of being requeued."""
    session = object_session(job)
    assert session is not None
    pre = session.scalars(select(PreemptionRow).where(PreemptionRow.victim == job.id, PreemptionRow.state == "stopping")
                          .order_by(PreemptionRow.id.desc())).first()
    if pre is not None:
        pre.state = "ended"


def superseded(job: Job, by: str) -> None:
    """A final stop (an emergency stop) took over the victim's stop: it will end `stopped`, not requeued, so
    its preemption record is closed as `superseded` (still counted as a preemption, Q9)."""
    session = object_session(job)
    assert session is not None
    pre = session.scalars(select(PreemptionRow).where(PreemptionRow.victim == job.id, PreemptionRow.state == "stopping")
                          .order_by(PreemptionRow.id.desc())).first()
    if pre is not None:
        pre.state = "superseded"
        pre.checkpoint = {**(pre.checkpoint or {}), "superseded_by": by}


def requeue(gw: Jobs, job: Job, parts: list[Allocation], now: datetime, by: str, *,
            confirmed: dict[str, Any] | None = None) -> None:
    """Rule 3: the victim stopped; back to pending with its priority, its wait so far and compensation.

    `by` names who ended the stop (`node:ID`, or the on-call person). `confirmed`: a person vouched for the stop
    (its node could not report): no evidence says whether it exited gracefully, so the outcome says `confirmed`.
    """
    session = object_session(job)
    assert session is not None
    config = scheduler_config(gw)
    row = priority_history.ensure(session, job)
    evidence = {p.node: p.evidence for p in parts}
    outcomes = {str(p.evidence.get("outcome")) for p in parts if p.evidence.get("outcome")}
    outcome = "confirmed" if confirmed else "forced" if "forced" in outcomes else "graceful"
    checkpoints = [c for ev in evidence.values() for c in (ev.get("checkpoints") or [])]
    before = row.priority
    priority_history.keep_run(session, job, row, now)
    priority_history.carry_wait(row, run_began(job), now)
    preempted = job.stop_request["preemption"]
    # Q8 compensates the victims of a preemption (reclaim or priority). A job stopped because its owner did not
    # renew it in time (P3) is requeued with its priority and wait, but earns nothing: paid for it, leaving a
    # renewal unanswered would raise a job's priority, every time.
    earned = config.preemption_compensation if preempted.get("kind") in RULES else 0.0
    row.compensation += earned
    row.preemptions += 1
    parts_now = {**(row.parts or {}), "compensation": row.compensation}
    parts_now["total"] = before + earned
    row.priority, row.parts, row.recorded_priority = parts_now["total"], parts_now, parts_now["total"]
    row.borrowed = False
    row.restart_notice_pending = True
    if earned:
        priority_history.record(session, job.id, now, "compensation", before, parts_now,
                                note=f"preempted by {preempted['preemptor']}: keeps priority {before:g} and "
                                     f"{row.wait_credit_s:g} s of wait, +{earned:g}")
    else:
        priority_history.record(session, job.id, now, "requeue", before, parts_now,
                                note=f"stopped at its maximum continuous occupancy, not renewed: keeps priority "
                                     f"{before:g} and {row.wait_credit_s:g} s of wait, no compensation")
    pre = session.scalars(select(PreemptionRow).where(PreemptionRow.victim == job.id, PreemptionRow.state == "stopping")
                          .order_by(PreemptionRow.id.desc())).first()
    checkpoint = {"outcome": outcome, "files": checkpoints}
    if pre is not None:
        pre.state, pre.requeued_at, pre.checkpoint = "requeued", now, checkpoint
    for p in parts:  # the gang's old parts; a restart allocates afresh (one allocation per job and node)
        session.delete(p)
    job.evidence = {"last_preemption": {"nodes": evidence, "outcome": outcome, "at": now.isoformat(),
                                        "stop_request": job.stop_request,
                                        **({"confirmed": confirmed} if confirmed else {})}}
    stop_request, job.stop_request = job.stop_request, {}  # the stop is over: the next run ends on its own terms
    job.placement = []
    job.started_at = None
    job.outcome = None
    transition(job, "pending", now, by=by, reason=f"preempted ({outcome}); requeued with priority {row.priority:g}")
    record_outcome(gw, "outcome", {"action": "job.preempt", "job_id": job.id, "result": "requeued",
                                   "outcome": outcome, "state_after": "pending", "priority_before": before,
                                   "priority_after": row.priority, "wait_credit_s": row.wait_credit_s,
                                   "checkpoints": checkpoints, "stop_request": stop_request,
                                   **({"confirmed": confirmed} if confirmed else {})})
    notify(session, job.owner, "requeued", {
        "job_id": job.id, "outcome": outcome, "checkpoint": checkpoint, "priority": row.priority,
        "expected_restart": f"see GET /v1/jobs/{job.id}/queue (refreshed every scheduling cycle)"}, now)
    gw.execution.requeued(job)


def stats(session: Session, projects: set[str] | None, period: str) -> list[dict[str, Any]]:
    """Q9: preemptions per tenant and month or quarter: count and GPU-hours lost."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in session.scalars(select(PreemptionRow).order_by(PreemptionRow.at)).all():
        if projects is not None and r.project not in projects:
            continue
        key = (r.project, _period(r.at, period))
        slot = out.setdefault(key, {"tenant": r.project, "period": key[1], "count": 0, "gpu_hours_lost": 0.0})
        slot["count"] += 1
        slot["gpu_hours_lost"] = round(slot["gpu_hours_lost"] + r.gpu_hours_lost, 4)
    return [out[k] for k in sorted(out)]


def _period(at: datetime, period: str) -> str:
    if period == "quarter":
        return f"{at.year}-Q{(at.month - 1) // 3 + 1}"
    return f"{at.year}-{at.month:02d}"


