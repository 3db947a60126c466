"""Pause, resume, delete and undelete (A5, A6), and on-call's confirmation of a failed stop (C3).

Pause is a graceful stop that ends in `paused` and keeps the checkpoint under the job's retention tier.
Resume puts the job back in its queue by the resume-priority rule (P2: its priority and the wait it already
accumulated are kept); the ledger records which version of that rule applied. Delete marks the job
`deleted` and, only after the stated recovery window, has the agents remove its files, each one ledgered;
until then `undelete` restores it. Job rows are never removed, so an id is never reused (R1).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gateway.decisions.approvals import open_request
from gateway.decisions.facts import recovery_window as recovery_window  # a policy number (A6); callers read it here
from gateway.decisions.notifications import notify
from gateway.decisions.pipeline import Recorded, decide, record_outcome
from gateway.decisions.verdict import refuse_if_denied, refuse_unless_allowed
from gateway.errors import Conflict
from gateway.identity.auth import Caller
from gateway.jobs import priority_history, retention, runtime_limits, stops
from gateway.jobs.deps import Jobs
from gateway.jobs.records import load_job, refuse_in_state
from gateway.store.models import Allocation, Job
from gateway.store.service_tables import Approval
from gateway.store.stop_tables import CheckpointRetention, JobDeletion

# P2 as the scheduler applies it to a resumed job: its priority and the wait it had in the queue are kept, as for a
# preempted job; time running or paused is not waiting. Version 1 kept the first queue entry time, so the hours
# a job ran before its pause aged it as if it had been queued all along.
RESUME_PRIORITY_RULE = {"rule": "P2.keep_priority_and_wait", "version": "2"}
DELETABLE_STATES = ("stopped", "paused", "succeeded", "failed")


def _notify_owner(session: Session, rec: Recorded, job: Job, caller: Caller, what: str, reason: str,
                  now: datetime) -> bool:
    """Carry out notify_owner obligations; True if the owner was told."""
    told = False
    for ob in rec.decision.obligations:
        if ob.get("kind") == "notify_owner" and ob.get("owner") and ob.get("owner") != caller.real_identity:
            notify(session, str(ob["owner"]), what, {"job_id": job.id, "by": caller.real_identity,
                                                      "reason": reason}, now)
            told = True
    return told


def confirm_stopped(gw: Jobs, session: Session, caller: Caller, job_id: str, reason: str,
                    ticket: str | None) -> tuple[Job, Recorded, Approval | None]:
    """On-call vouches that a stop_failed or lost job no longer runs; or, where the policy asks for a second
    person, opens the approval. Raises NotFound, PolicyDenied, Conflict, LedgerUnavailable."""
    job = load_job(session, job_id, for_update=True)
    rec = decide(gw, session, caller, "job.confirm_stopped", targets=[job], project=job.project,
                 reason=reason, ticket=ticket)
    refuse_if_denied(rec)
    if job.state not in ("stop_failed", "lost"):
        raise Conflict(f"job {job.id} is {job.state}; only stop_failed or lost jobs wait for a person",
                       state=job.state)
    if rec.decision.effect == "needs_approval":
        return job, rec, open_request(gw, session, caller, rec, action="job.confirm_stopped", target_ids=[job.id],
                                      project=job.project, reason=reason, ticket=ticket)
    stops.mark_confirmed_stopped(gw, session, job, by=caller.real_identity, reason=reason,
                                 request_id=rec.request_id, decision_seq=rec.seq)
    _notify_owner(session, rec, job, caller, "job_confirmed_stopped", reason, gw.clock())
    return job, rec, None


def _confirm_after_approval(gw: Jobs, session: Session, approval: Approval, targets: list[Job],
                            approver: Caller) -> dict[str, Any]:
    for job in targets:
        stops.mark_confirmed_stopped(gw, session, job, by=approval.requester_real, reason=approval.reason or "",
                                     request_id=approval.id, decision_seq=approval.decision_seq)
    return {"confirmed_stopped": [j.id for j in targets]}


def pause(gw: Jobs, session: Session, caller: Caller, job_id: str, reason: str,
          ticket: str | None) -> tuple[Job, Recorded]:
    """Graceful stop ending in `paused`. Raises NotFound, PolicyDenied, Conflict, LedgerUnavailable."""
    job = load_job(session, job_id, for_update=True)
    # A5: the pause's own entry states what the paused job is promised (its checkpoint, its way back).
    params = {"checkpoint_retention": retention.stated(job, retention.important_days(gw)),
              "resume_priority_rule": RESUME_PRIORITY_RULE}
    rec = decide(gw, session, caller, "job.pause", targets=[job], project=job.project, reason=reason, ticket=ticket,
                 params=params)
    refuse_unless_allowed(rec, f"pausing job {job.id}")
    now = gw.clock()
    told = _notify_owner(session, rec, job, caller, "job_paused", reason, now)
    stops.request_stop(gw, session, job, now, by=caller.real_identity, reason=reason, request_id=rec.request_id,
                       decision_seq=rec.seq, ticket=ticket, pause=True, owner_notified=told)
    return job, rec


def resume(gw: Jobs, session: Session, caller: Caller, job_id: str,
           reason: str | None) -> tuple[Job, Recorded, Approval | None]:
    """paused → pending by the resume-priority rule; or, where the policy asks for a second person, opens the
    approval. Raises NotFound, PolicyDenied, Conflict, LedgerUnavailable."""
    job = load_job(session, job_id, for_update=True)
    params = {"resume_priority_rule": RESUME_PRIORITY_RULE}
    rec = decide(gw, session, caller, "job.resume", targets=[job], project=job.project, reason=reason, params=params)
    refuse_if_denied(rec)
    if job.state != "paused":
        raise Conflict(f"job {job.id} is {job.state}; only a paused job can be resumed", state=job.state)
    if rec.decision.effect == "needs_approval":
        return job, rec, open_request(gw, session, caller, rec, action="job.resume", target_ids=[job.id],
                                      project=job.project, params=params, reason=reason, ticket=None)
    _notify_owner(session, rec, job, caller, "job_resumed", reason or "", gw.clock())
    _resume(gw, session, job, by=caller.real_identity, reason=reason, request_id=rec.request_id,
            decision_seq=rec.seq)
    return job, rec, None


def _resume_after_approval(gw: Jobs, session: Session, approval: Approval, targets: list[Job],
                           approver: Caller) -> dict[str, Any]:
    for job in targets:
        _resume(gw, session, job, by=approval.requester_real, reason=approval.reason, request_id=approval.id,
                decision_seq=approval.decision_seq)
    return {"resumed": [j.id for j in targets]}


def _resume(gw: Jobs, session: Session, job: Job, *, by: str, reason: str | None, request_id: str,
            decision_seq: int) -> None:
    if job.state != "paused":
        raise Conflict(f"job {job.id} is {job.state}; only a paused job can be resumed", state=job.state)
    now = gw.clock()
    # The old allocations are over (released with evidence, kept in the ledger); one row per (job, node).
    previous = [{"node": p["node"], "gpus": p["gpus"]} for p in job.placement]
    session.execute(delete(Allocation).where(Allocation.job_id == job.id, Allocation.released.is_(True)))
    retention = session.get(CheckpointRetention, job.id)
    if retention is not None and retention.state == "kept":
        retention.state = "in_use"  # the resumed job reads it; cleanup must not remove it now
    # The wait of the last stint ended when the job started, or when it was paused while still queued.
    row = priority_history.ensure(session, job)
    started = job.started_at if job.started_at is not None and job.started_at >= row.queued_at else None
    priority_history.keep_run(session, job, row, job.ended_at or now)
    priority_history.carry_wait(row, started or job.ended_at or now, now)
    # Pending again: it has not started (its last run is a PastRun now).
    job.placement, job.outcome, job.started_at, job.ended_at, job.exit_code = [], None, None, None, None
    job.stop_request = {}
    stops.ledger_transition(gw, job, "pending", now, by=by, reason=reason or "resumed", request_id=request_id,
                            decision_seq=decision_seq, resume_priority_rule=RESUME_PRIORITY_RULE,
                            priority=job.base_priority, submitted_at=job.submitted_at.isoformat(),
                            previous_placement=previous)
    gw.execution.queued(job)


def delete_job(gw: Jobs, session: Session, caller: Caller, job_id: str, reason: str,
               ticket: str | None) -> tuple[Job, Recorded, Approval | None]:
    """Decide a delete (A6: the rights holder consents); open the approval or mark the job deleted.

    Raises NotFound, PolicyDenied, Conflict (still running, already deleted), LedgerUnavailable.
    """
    job = load_job(session, job_id, for_update=True)
    if job.state not in DELETABLE_STATES:
        refuse_in_state(gw, session, caller, job, f"job {job.id} is {job.state}; stop or pause it before deleting it")
    rec = decide(gw, session, caller, "job.delete", targets=[job], project=job.project, reason=reason, ticket=ticket)
    refuse_if_denied(rec)
    if rec.decision.effect == "needs_approval":
        approval = open_request(gw, session, caller, rec, action="job.delete", target_ids=[job.id],
                                project=job.project, reason=reason, ticket=ticket)
        return job, rec, approval
    mark_deleted(gw, session, job, by=caller.real_identity, approvers=[], reason=reason, decision_seq=rec.seq)
    return job, rec, None


def _delete_after_approval(gw: Jobs, session: Session, approval: Approval, targets: list[Job],
                           approver: Caller) -> dict[str, Any]:
    for job in targets:
        mark_deleted(gw, session, job, by=approval.requester_real, approvers=[a["by"] for a in approval.approvals],
                     reason=approval.reason or "", decision_seq=approval.decision_seq)
    return {"deleted": [j.id for j in targets], "recovery_window_s": recovery_window(gw).total_seconds()}


def mark_deleted(gw: Jobs, session: Session, job: Job, *, by: str, approvers: list[str], reason: str,
                 decision_seq: int) -> JobDeletion:
    """Raises Conflict if the job is not in a deletable state."""
    if job.state not in DELETABLE_STATES:
        raise Conflict(f"job {job.id} is {job.state}; it cannot be deleted now", state=job.state)
    now = gw.clock()
    row = session.get(JobDeletion, job.id)
    window = recovery_window(gw)
    purge_after = now + window
    if row is None:
        row = JobDeletion(job_id=job.id, state="pending", state_before=job.state, requested_by=by,
                          approvers=approvers, reason=reason, requested_at=now, purge_after=purge_after, objects=[])
        session.add(row)
    else:
        row.state, row.state_before, row.requested_by, row.approvers = "pending", job.state, by, approvers
        row.reason, row.requested_at, row.purge_after = reason, now, purge_after
    stops.ledger_transition(gw, job, "deleted", now, by=by, reason=reason, decision_seq=decision_seq,
                            approvers=approvers, recovery_window_s=window.total_seconds(),
                            purge_after=purge_after.isoformat())
    return row


def undelete(gw: Jobs, session: Session, caller: Caller, job_id: str,
             reason: str) -> tuple[Job, Recorded, Approval | None]:
    """Within the recovery window, restore a deleted job to the state it had; or, where the policy asks for a
    second person, open the approval. Raises NotFound, PolicyDenied, Conflict (not deleted, or its files are
    already being removed), LedgerUnavailable."""
    job = load_job(session, job_id, for_update=True)
    rec = decide(gw, session, caller, "job.undelete", targets=[job], project=job.project, reason=reason)
    refuse_if_denied(rec)
    _check_restorable(gw, session, job)
    if rec.decision.effect == "needs_approval":
        return job, rec, open_request(gw, session, caller, rec, action="job.undelete", target_ids=[job.id],
                                      project=job.project, reason=reason, ticket=None)
    _restore(gw, session, job, by=caller.real_identity, reason=reason, request_id=rec.request_id,
             decision_seq=rec.seq)
    return job, rec, None


def _undelete_after_approval(gw: Jobs, session: Session, approval: Approval, targets: list[Job],
                             approver: Caller) -> dict[str, Any]:
    for job in targets:
        _restore(gw, session, job, by=approval.requester_real, reason=approval.reason or "", request_id=approval.id,
                 decision_seq=approval.decision_seq)
    return {"restored": [j.id for j in targets]}


def _check_restorable(gw: Jobs, session: Session, job: Job) -> JobDeletion:
    row = session.get(JobDeletion, job.id)
    if job.state != "deleted" or row is None or row.state != "pending":
        raise Conflict(f"job {job.id} is not deleted within its recovery window", state=job.state)
    if gw.clock() >= row.purge_after:
        raise Conflict(f"the recovery window of job {job.id} ended {row.purge_after.isoformat()}")
    return row


def _restore(gw: Jobs, session: Session, job: Job, *, by: str, reason: str, request_id: str,
             decision_seq: int) -> None:
    row = _check_restorable(gw, session, job)
    row.state = "restored"
    stops.ledger_transition(gw, job, row.state_before, gw.clock(), by=by, reason=reason, request_id=request_id,
                            decision_seq=decision_seq, undeleted=True)


def purge_due(gw: Jobs, session: Session, now: datetime) -> list[str]:
    """After the recovery window, ask each node of a deleted job to remove all its files."""
    done = []
    for row in session.scalars(select(JobDeletion).where(JobDeletion.state == "pending",
                                                         JobDeletion.purge_after <= now)).all():
        job = session.get(Job, row.job_id)
        if job is None:
            continue
        row.state = "purging"
        nodes = gw.execution.holders(session, job)
        for node in nodes:
            gw.execution.delete_artifacts(session, job, node, what="all", reason=f"delete: {row.reason}")
        record_outcome(gw, "deletion", {"job_id": job.id, "action": "purge", "nodes": nodes, "at": now.isoformat()})
        if not nodes:
            row.state, row.purged_at = "purged", now
        done.append(job.id)
    return done


def purge_reported(gw: Jobs, session: Session, job_id: str, node: str, objects: list[dict[str, Any]],
                   now: datetime, *, complete: bool = True) -> None:
    """A node removed a deleted job's files: keep the list; purged once every node has removed all of them
    (a node that left some behind keeps the purge open, for a person to finish)."""
    row = session.get(JobDeletion, job_id)
    if row is None or row.state != "purging":
        return
    row.objects = [*row.objects, {"node": node, "files": objects, **({} if complete else {"incomplete": True})}]
    if not complete:
        return
    job = session.get(Job, job_id)
    answered = {str(o.get("node")) for o in row.objects if not o.get("incomplete")}
    if job is None or set(gw.execution.holders(session, job)) <= answered:
        row.state, row.purged_at = "purged", now
        record_outcome(gw, "deletion", {"job_id": job_id, "action": "purged", "at": now.isoformat(),
                                        "objects": sum(len(o["files"]) for o in row.objects)})


def _retention_task(gw: Jobs, session: Session) -> object:
    return retention.cleanup(gw, session, gw.clock())


def _auto_offline_task(gw: Jobs, session: Session) -> object:
    return runtime_limits.auto_offline(gw, session, gw.clock())


def _purge_task(gw: Jobs, session: Session) -> object:
    return purge_due(gw, session, gw.clock())


def run_chores(gw: Jobs) -> None:
    """Run this area's periodic chores once, each in its own transaction (tests and `jobgate` admin use)."""
    for task in (_auto_offline_task, _retention_task, _purge_task):
        with gw.transaction() as session:
            task(gw, session)


# This area's periodic chores, registered at app start (gateway/bootstrap.py).
CHORES = (("R4 auto-offline", _auto_offline_task), ("checkpoint retention", _retention_task),
          ("deleted job purge", _purge_task))


# What this module carries out once a second person approved it (M2), bound to the running gateway at app
# start (gateway/bootstrap.py).
EXECUTORS = {"job.confirm_stopped": _confirm_after_approval, "job.resume": _resume_after_approval,
             "job.delete": _delete_after_approval, "job.undelete": _undelete_after_approval}
