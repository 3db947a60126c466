"""The stop state machine (C3): every step timestamped in the job's history AND ledgered. Stops go out through
the execution port; when a node is lost (gateway/native/node_health.py) its jobs follow the lower line.

    running → stop_requested → stopping → stopped      (evidence: group gone, exit status, GPUs released)
                                        ↘ stop_failed  (unconfirmed within grace + margin, node unreachable,
                                                        or the group survived SIGKILL) → alert → a person
    running → lost (node missed heartbeats; GPUs withheld) → running (node back, process still there)
                                                            → stop_failed / stopped (via reconcile or on-call)

Nothing here retries on its own: a stop that did not take effect waits for a person
(`confirm_stopped`) or for the node's own evidence after it returns and reconciles. Also here: the stop a
person or the system asks for (decided, or carried out once approved) and on-call's confirmation.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from gateway.decisions.approvals import open_request
from gateway.decisions.notifications import alert
from gateway.decisions.obligations import notify_owners
from gateway.decisions.pipeline import Recorded, decide, ledger_batch, record
from gateway.decisions.verdict import refuse_if_denied
from gateway.errors import Conflict
from gateway.identity.auth import Caller
from gateway.jobs import preemption, retention
from gateway.jobs.deps import Jobs
from gateway.jobs.records import load_job, lock_jobs, refuse_in_state, transition
from gateway.schemas import StopRequest
from gateway.store.models import Allocation, Job, Node
from gateway.store.service_tables import Approval
from gateway.store.states import ENDED_STATES, STOPPABLE_STATES, STOPPING_STATES

log = logging.getLogger("jobgate.stops")

# A stop not confirmed within the job's grace window plus this margin is escalated (C3).
STOP_CONFIRM_MARGIN_S = 30.0
# States in which a job still holds (or may hold) processes and GPUs on its nodes.
HOLDING_STATES = ("starting", "running", "lost", "stop_requested", "stopping", "stop_failed")
# Allocation states the node itself confirmed as over; anything else may still have a process.
PART_DONE = ("stopped", "exited", "failed")


def ledger_transition(gw: Jobs, job: Job, state: str, now: datetime, *, by: str, reason: str,
                      **extra: Any) -> int:
    """Move `job` to `state`, keep the step in its history and append it to the ledger. Raises LedgerUnavailable."""
    before = job.state
    transition(job, state, now, by=by, reason=reason)
    return record(gw, object_session(job), "transition",
                  {"job_id": job.id, "state_before": before, "state_after": state, "by": by, "reason": reason,
                   "at": now.isoformat(), **extra})


def escalate(gw: Jobs, session: Session, job: Job, now: datetime, why: str, *, unreachable: bool) -> None:
    """stop_failed: ledgered, alerted, and left for a person (`POST /v1/jobs/{id}/confirm-stopped`)."""
    reason = f"{why}; waiting for on-call to confirm"
    # A node that answered the stop with "rejected": its words are the evidence of why the stop did not take.
    rejections = list(job.stop_request.get("rejections") or [])
    if rejections:
        reason = f"{why}; the node rejected it {len(rejections)} time(s) ({rejections[-1]['detail']}); waiting " \
                 "for on-call to confirm"
    evidence = {"rejections": rejections} if rejections else {}
    ledger_transition(gw, job, "stop_failed", now, by="system", reason=reason,
                      alert="stop_failed", unreachable=unreachable, **evidence)
    job.stop_request = {**job.stop_request, "failed_at": now.isoformat(), "unreachable": unreachable,
                        "failure": why}
    alert(session, now, "stop_failed",
          {"job_id": job.id, "why": why, "unreachable": unreachable, "nodes": [p["node"] for p in job.placement],
           "action": f"POST /v1/jobs/{job.id}/confirm-stopped", **evidence}, also=[job.owner])


def escalate_unconfirmed_stops(gw: Jobs, session: Session, now: datetime) -> int:
    """Escalate stops not confirmed within grace + margin, or whose node is unreachable. Returns how many.

    Runs every scheduler cycle while thousands of jobs may be stopping, so it costs two queries, not one
    per job: deadlines are checked in memory, lost nodes' unconfirmed parts come from one query.
    """
    lost = set(session.scalars(select(Node.id).where(Node.state == "lost")).all())
    on_lost: dict[str, set[str]] = {}
    if lost:
        for job_id, node in session.execute(select(Allocation.job_id, Allocation.node).where(
                Allocation.node.in_(sorted(lost)), Allocation.state.not_in(PART_DONE))).all():
            on_lost.setdefault(job_id, set()).add(node)
    count = 0
    rows = session.execute(select(Job.id, Job.stop_request, Job.grace_seconds, Job.submitted_at)
                           .where(Job.state.in_(STOPPING_STATES))).all()
    due = []
    for job_id, stop_request, grace_seconds, submitted_at in rows:
        asked = datetime.fromisoformat(stop_request["at"]) if stop_request.get("at") else submitted_at
        grace = float(stop_request.get("grace_seconds", grace_seconds))
        if job_id in on_lost or now - asked > timedelta(seconds=grace + STOP_CONFIRM_MARGIN_S):
            due.append(job_id)
    # Each locked job is judged by its own stop request: judged by the last row's above, a stop asked for just
    # now kept every older overdue stop from escalating.
    # Locked and read again (PostgreSQL): the node's `stopped` may have committed since the query above, and
    # stop_failed written over it would page on-call for a stop that succeeded.
    for job in lock_jobs(session, due).values():
        if job.state not in STOPPING_STATES:
            continue
        if job.id in on_lost:
            escalate(gw, session, job, now, f"node {', '.join(sorted(on_lost[job.id]))} is unreachable",
                     unreachable=True)
            count += 1
        elif now - asked_at(job) > timedelta(seconds=grace_of(job) + STOP_CONFIRM_MARGIN_S):
            window = f"{grace_of(job):g}s grace + {STOP_CONFIRM_MARGIN_S:g}s margin"
            escalate(gw, session, job, now, f"stop not confirmed within {window}", unreachable=False)
            count += 1
    return count


def asked_at(job: Job) -> datetime:
    """When this stop was asked for (a job cancelled before it had a stop request: when it was submitted)."""
    at = job.stop_request.get("at")
    return datetime.fromisoformat(at) if at else job.submitted_at


def grace_of(job: Job) -> float:
    """The grace window this stop was sent with (an emergency stop may shorten the job's own)."""
    return float(job.stop_request.get("grace_seconds", job.grace_seconds))


def request_stop(gw: Jobs, session: Session, job: Job, now: datetime, *, by: str, reason: str,
                 request_id: str, decision_seq: int, ticket: str | None = None, grace_seconds: float | None = None,
                 approved_by: list[str] | None = None, pause: bool = False, lost_nodes: set[str] | None = None,
                 nodes: Collection[str] | None = None, **extra: Any) -> None:
    """running → stop_requested (ledgered) and one signed stop command per node (of `nodes` only, if given: the
    parts still running when another has ended); a queued job is cancelled.

    A job whose node is already lost goes straight to stop_failed (unreachable): nobody can confirm it.
    Raises Conflict for a job that is not running or queued, LedgerUnavailable.
    """
    grace = job.grace_seconds if grace_seconds is None else float(grace_seconds)
    if job.state not in ("pending", "starting", "running", "lost"):
        raise Conflict(f"job {job.id} is {job.state}; only queued or running jobs can be stopped", state=job.state)
    job.stop_request = {"by": by, "reason": reason, "ticket": ticket, "at": now.isoformat(),
                        "request_id": request_id, "decision_seq": decision_seq, "approved_by": approved_by or [],
                        "grace_seconds": grace, "pause": pause, **extra}
    if job.state == "pending":
        job.ended_at = now
        job.outcome = "cancelled"
        job.evidence = {"note": "stopped while queued; no process had started"}
        ledger_transition(gw, job, "paused" if pause else "stopped", now, by=by, reason=reason,
                          request_id=request_id, decision_seq=decision_seq, **extra)
        retention.release(gw, job, now)
        return
    ledger_transition(gw, job, "stop_requested", now, by=by, reason=reason, request_id=request_id,
                      decision_seq=decision_seq, grace_seconds=grace, **extra)
    lost = lost_nodes if lost_nodes is not None else set(
        session.scalars(select(Node.id).where(Node.state == "lost")).all())
    targets = [p["node"] for p in job.placement if nodes is None or p["node"] in nodes]
    for node in targets:
        gw.execution.stop(session, job, node, grace_seconds=grace, reason=reason)
    unreachable = sorted(set(targets) & lost)
    if unreachable:
        escalate(gw, session, job, now, f"node {', '.join(unreachable)} is unreachable", unreachable=True)


# A stop already under way (or failed) that a later, final stop can take over (gateway/jobs/emergency.py).
TAKEOVER_STATES = ("stop_requested", "stopping", "stop_failed")
# How a stop in progress may have been meant to end other than `stopped`: dropped when a final stop takes over.
SOFT_ENDINGS = ("preemption", "pause")


def take_over_stop(gw: Jobs, session: Session, job: Job, now: datetime, *, by: str, reason: str,
                   request_id: str, decision_seq: int, approved_by: list[str] | None = None,
                   grace_seconds: float | None = None, **extra: Any) -> None:
    """A stop already under way (or failed) becomes part of a later, final stop: it now ends `stopped`, never
    requeued as a preemption nor `paused` (which its owner could resume at once). Ledgered.

    The stop in progress goes on: the agent runs one stop per process group, and its reports must still count
    (stale_report compares commands with the request's `at`, kept as it was). Only when the later stop's grace
    window (an emergency stop's) ends before the one running does each node still stopping get a stop with it,
    which brings the kill forward, and escalation follows the earlier end. Raises Conflict for a job with no
    stop in progress.
    """
    if job.state not in TAKEOVER_STATES:
        raise Conflict(f"job {job.id} is {job.state}; no stop is in progress to take over", state=job.state)
    dropped = sorted(k for k in SOFT_ENDINGS if job.stop_request.get(k))
    if "preemption" in dropped:
        preemption.superseded(job, request_id)
    taken = {"by": by, "reason": reason, "request_id": request_id, "decision_seq": decision_seq,
             "approved_by": approved_by or [], "at": now.isoformat(), "dropped": dropped}
    stop_request = {**{k: v for k, v in job.stop_request.items() if k not in SOFT_ENDINGS}, "taken_over": taken,
                    **extra}
    cut: dict[str, Any] = {}
    asked = stop_request.get("at")
    if grace_seconds is not None and job.state != "stop_failed" and asked:
        # The window counts from the first stop's `at`: ending `grace_seconds` from now is a window this long.
        window = (now - datetime.fromisoformat(asked)).total_seconds() + grace_seconds
        if window < grace_of(job):
            stop_request["grace_seconds"] = window
            cut = {"grace_cut_to": grace_seconds}
            for node in sorted(unconfirmed_nodes(session, job)):
                gw.execution.stop(session, job, node, grace_seconds=grace_seconds, reason=reason)
    job.stop_request = stop_request
    record(gw, session, "transition", {"job_id": job.id, "state_before": job.state, "state_after": job.state,
                                       "by": by, "reason": reason, "request_id": request_id,
                                       "decision_seq": decision_seq, "takes_over_stop": True, "dropped": dropped,
                                       "at": now.isoformat(), **cut, **extra})


def unconfirmed_nodes(session: Session, job: Job) -> set[str]:
    return set(session.scalars(select(Allocation.node).where(
        Allocation.job_id == job.id, Allocation.state.not_in(PART_DONE))).all())


def mark_confirmed_stopped(gw: Jobs, session: Session, job: Job, *, by: str, reason: str, request_id: str,
                           decision_seq: int) -> None:
    """A person vouches that a stop_failed or lost job no longer runs: stopped (a preemption victim: requeued, as
    its node's own evidence would have), GPUs released, ledgered.

    Raises Conflict if the job is not waiting for a person."""
    if job.state not in ("stop_failed", "lost"):
        raise Conflict(f"job {job.id} is {job.state}; only stop_failed or lost jobs wait for a person",
                       state=job.state)
    now = gw.clock()
    parts = list(session.scalars(select(Allocation).where(Allocation.job_id == job.id)).all())
    withheld = [{"node": p.node, "gpus": list(p.gpus)} for p in parts if not p.released]
    for p in parts:
        p.released = True
    if preemption.is_preempted(job):
        # P2: a preemption victim goes back to the queue however its stop came to be confirmed. Ended `stopped`
        # here, it never ran again, its preemption stayed open for ever, and its owner, told it would be
        # requeued, was not told otherwise.
        preemption.requeue(gw, job, parts, now, by, confirmed={
            "by": by, "reason": reason, "request_id": request_id, "decision_seq": decision_seq,
            "state_before": job.state, "gpus_released_by_person": withheld})
        return
    job.outcome = "confirmed"
    job.ended_at = now
    job.evidence = {**job.evidence, "confirmed_by": by, "confirm_reason": reason,
                    "gpus_released_by_person": withheld,
                    "nodes": {p.node: p.evidence for p in parts}}
    ledger_transition(gw, job, "stopped", now, by=by, reason=f"confirmed by on-call: {reason}",
                      request_id=request_id, decision_seq=decision_seq, gpus_released=withheld)
    retention.release(gw, job, now)
    gw.execution.changed()


def stop(gw: Jobs, session: Session, caller: Caller, job_id: str,
         req: StopRequest) -> tuple[Job, Recorded, Approval | None]:
    """Decide and, if allowed, start stopping a job (C3); if a second person is needed, open an approval.

    Raises NotFound, PolicyDenied, Conflict, LedgerUnavailable.
    """
    job = load_job(session, job_id, for_update=True)
    why = not_stoppable(job)
    if why:
        refuse_in_state(gw, session, caller, job, why)
    rec = decide(gw, session, caller, "job.stop", targets=[job], project=job.project,
                 reason=req.reason, ticket=req.ticket, durable_by_commit=True)
    refuse_if_denied(rec)
    if rec.decision.effect == "needs_approval":
        approval = open_request(gw, session, caller, rec, action="job.stop", target_ids=[job.id],
                                project=job.project, reason=req.reason, ticket=req.ticket)
        return job, rec, approval
    with ledger_batch(gw, session):
        execute_stop(gw, session, job, by=caller.id, request_id=rec.request_id, decision_seq=rec.seq,
                     reason=req.reason, ticket=req.ticket, obligations=rec.decision.obligations)
    return job, rec, None


def _stop_after_approval(gw: Jobs, session: Session, approval: Approval, targets: list[Job],
                         approver: Caller) -> dict[str, Any]:
    # A target paused or deleted while the request waited is left as it is, like one that ended (approve skips
    # those); the others are stopped, or keep the stop already in progress.
    stoppable = [j for j in targets if j.state in STOPPABLE_STATES + STOPPING_STATES]
    for job in stoppable:
        execute_stop(gw, session, job, by=approval.requester, request_id=approval.id,
                     decision_seq=approval.decision_seq, reason=approval.reason or "", ticket=approval.ticket,
                     approved_by=[a["by"] for a in approval.approvals],
                     obligations=approval.resolution.get("obligations", ()))
    return {"stopping": [j.id for j in stoppable],
            "not_stoppable": [{"id": j.id, "state": j.state} for j in targets if j not in stoppable]}


def not_stoppable(job: Job) -> str | None:
    """Why a stop of this job is refused, None if it may be stopped (a batch stop asks it of each target before
    deciding, as stop does)."""
    if job.state in STOPPABLE_STATES + STOPPING_STATES:
        return None
    if job.state in ENDED_STATES:
        return f"job {job.id} already ended ({job.state})"
    return f"job {job.id} is {job.state}; only queued, running or lost jobs can be stopped"


def execute_stop(gw: Jobs, session: Session, job: Job, *, by: str, request_id: str, decision_seq: int,
                 reason: str, ticket: str | None, approved_by: list[str] | None = None,
                 obligations: Sequence[Mapping[str, Any]] = ()) -> None:
    """Carry out an allowed stop: cancel a queued job, or send signed stop commands to its nodes.

    Owners the policy says must be told (notify_owner obligations) get a notice asking for a receipt
    before the stop goes out; the outcome entry records who was notified. Raises Conflict.
    """
    now = gw.clock()
    why = not_stoppable(job)
    if why:
        raise Conflict(why, state=job.state)
    before = job.state
    notified = notify_owners(gw, session, obligations, job=job, actor=by, action="job.stop", reason=reason)
    asked = {"by": by, "reason": reason, "ticket": ticket, "at": now.isoformat(), "request_id": request_id,
             "decision_seq": decision_seq, "approved_by": approved_by or []}
    if job.state in STOPPING_STATES:
        # Already stopping: the stop in progress is taken over, not sent again. A second command and a new `at`
        # made the node's answer to the first look like one to an earlier stop (stops.stale_report): it was
        # dropped, the job never left `stopping`, and each repeat pushed escalation out. It now ends `stopped`,
        # a preemption or pause in progress neither requeued nor paused, as the person asked.
        take_over_stop(gw, session, job, now, by=by, reason=reason, request_id=request_id,
                       decision_seq=decision_seq, approved_by=approved_by)
    elif job.state == "pending":
        job.stop_request = asked
        ledger_transition(gw, job, "stopped", now, by=by, reason=reason, request_id=request_id)
        job.ended_at = now
        job.outcome = "cancelled"
        job.evidence = {"note": "stopped while queued; no process had started"}
        retention.release(gw, job, now)  # a resumed job's kept checkpoint goes back under retention
    else:
        job.stop_request = asked
        ledger_transition(gw, job, "stop_requested", now, by=by, reason=reason, request_id=request_id,
                          grace_seconds=job.grace_seconds)
        for part in job.placement:
            gw.execution.stop(session, job, part["node"], grace_seconds=job.grace_seconds, reason=reason)
    record(gw, session, "outcome", {"request_id": request_id, "decision_seq": decision_seq, "action": "job.stop",
                                    "job_id": job.id, "result": job.state, "state_before": before,
                                    "state_after": job.state, "owner_notified": notified,
                                    "took_over_stop": before in STOPPING_STATES})


def cancelled_out_of_band(gw: Jobs, session: Session, job: Job, *, by: str | None, at: float, reason: str,
                          evidence: Mapping[str, Any]) -> None:
    """pending → stopped for a job its executor's queue lost to someone else's cancel (Slurm: a `scancel` behind
    jobgate's back while it waited). It ends rather than waits: left pending, it was submitted again, and the
    cancel undone without anyone deciding so. The act itself is ledgered and alerted by the executor's watch."""
    now = gw.clock()
    who = f"out_of_band:{by or 'unknown'}"
    job.stop_request = {"by": who, "reason": reason, "at": now.isoformat(), "out_of_band": True,
                        "cancelled_by": by, "cancelled_at": datetime.fromtimestamp(at, UTC).isoformat()}
    ledger_transition(gw, job, "stopped", now, by=who, reason=reason, out_of_band=True)
    job.ended_at = datetime.fromtimestamp(at, UTC)
    job.outcome = "cancelled"
    job.evidence = {**evidence, "note": reason}
    retention.release(gw, job, now)
    record(gw, session, "outcome", {"action": "job.stop", "job_id": job.id, "result": "stopped",
                                    "state_before": "pending", "state_after": "stopped", "out_of_band": True,
                                    "cancelled_by": by, "reason": reason})


# What this module carries out once a second person approved it (M2), bound to the running gateway at app
# start (gateway/bootstrap.py).
EXECUTORS = {"job.stop": _stop_after_approval}
