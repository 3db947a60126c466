"""The stop state machine (C3) and node health: every step timestamped in the job's history AND ledgered.

    running → stop_requested → stopping → stopped      (evidence: group gone, exit status, GPUs released)
                                        ↘ stop_failed  (unconfirmed within grace + margin, node unreachable,
                                                        or the group survived SIGKILL) → alert → a person
    running → lost (node missed heartbeats; GPUs withheld) → running (node back, process still there)
                                                            → stop_failed / stopped (via reconcile or on-call)

Nothing here retries on its own: a stop that did not take effect waits for a person
(`confirm_stopped`) or for the node's own evidence after it returns and reconciles.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from gateway import preemption, retention
from gateway.commands import enqueue
from gateway.context import Gateway
from gateway.decisions.notifications import notify
from gateway.decisions.pipeline import record, record_outcome
from gateway.errors import Conflict
from gateway.jobs import lock_jobs, transition
from gateway.runtime_limits import stop_overrunning
from gateway.store.models import Allocation, Job, Node, NodeCommand, RoleBinding
from gateway.store.stop_tables import AgentSession, CommandAck

log = logging.getLogger("jobgate.stops")

# A stop not confirmed within the job's grace window plus this margin is escalated (C3).
STOP_CONFIRM_MARGIN_S = 30.0
STOPPING_STATES = ("stop_requested", "stopping")
# States in which a job still holds (or may hold) processes and GPUs on its nodes.
HOLDING_STATES = ("starting", "running", "lost", "stop_requested", "stopping", "stop_failed")
# Allocation states the node itself confirmed as over; anything else may still have a process.
PART_DONE = ("stopped", "exited", "failed")
ONCALL_ROLE = "oncall"


def ledger_transition(gw: Gateway, job: Job, state: str, now: datetime, *, by: str, reason: str,
                      **extra: Any) -> int:
    """Move `job` to `state`, keep the step in its history and append it to the ledger. Raises LedgerUnavailable."""
    before = job.state
    transition(job, state, now, by=by, reason=reason)
    return record(gw, object_session(job), "transition",
                  {"job_id": job.id, "state_before": before, "state_after": state, "by": by, "reason": reason,
                   "at": now.isoformat(), **extra})


def oncall_people(session: Session) -> list[str]:
    return sorted(set(session.scalars(select(RoleBinding.principal_id).where(RoleBinding.role == ONCALL_ROLE))))


def alert(gw: Gateway, session: Session, now: datetime, kind: str, body: dict[str, Any],
          *, also: Iterable[str] = ()) -> None:
    """Escalate to people: one structured log line, a notification per on-call engineer (and `also`)."""
    log.warning(json.dumps({"alert": kind, "at": now.isoformat(), **body}, sort_keys=True, default=str))
    for who in sorted(set(oncall_people(session)) | set(also)):
        notify(session, who, kind, body, now)


def escalate(gw: Gateway, session: Session, job: Job, now: datetime, why: str, *, unreachable: bool) -> None:
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
    alert(gw, session, now, "stop_failed",
          {"job_id": job.id, "why": why, "unreachable": unreachable, "nodes": [p["node"] for p in job.placement],
           "action": f"POST /v1/jobs/{job.id}/confirm-stopped", **evidence}, also=[job.owner])


def escalate_unconfirmed_stops(gw: Gateway, session: Session, now: datetime) -> int:
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


def request_stop(gw: Gateway, session: Session, job: Job, now: datetime, *, by: str, reason: str,
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
        enqueue(gw, session, node, job.id, "stop", {"grace_seconds": grace, "stop_signal": job.stop_signal,
                                                     "reason": reason})
    unreachable = sorted(set(targets) & lost)
    if unreachable:
        escalate(gw, session, job, now, f"node {', '.join(unreachable)} is unreachable", unreachable=True)


# A stop already under way (or failed) that a later, final stop can take over (gateway/emergency.py).
TAKEOVER_STATES = ("stop_requested", "stopping", "stop_failed")
# How a stop in progress may have been meant to end other than `stopped`: dropped when a final stop takes over.
SOFT_ENDINGS = ("preemption", "pause")


def take_over_stop(gw: Gateway, session: Session, job: Job, now: datetime, *, by: str, reason: str,
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
                enqueue(gw, session, node, job.id, "stop",
                        {"grace_seconds": grace_seconds, "stop_signal": job.stop_signal, "reason": reason})
    job.stop_request = stop_request
    record(gw, session, "transition", {"job_id": job.id, "state_before": job.state, "state_after": job.state,
                                       "by": by, "reason": reason, "request_id": request_id,
                                       "decision_seq": decision_seq, "takes_over_stop": True, "dropped": dropped,
                                       "at": now.isoformat(), **cut, **extra})


def stale_report(session: Session, job: Job, part: Allocation, event: str, pid: int | None,
                 nonce: str | None) -> str | None:
    """Why a node's report is about an earlier run or an earlier stop of this job (so it must not touch the
    current part), or None. Reports are delivered at least once and a requeued or resumed job may run again on
    the same node, so a resent `stopped` would otherwise end the new run and release GPUs it is about to use."""
    if event == "started":
        if part.released:
            return "the part already ended; a start report cannot revive it"
        # Before this run's own report the part knows no pid, so the start command it answers tells them apart.
        latest = session.scalars(select(NodeCommand.nonce).where(
            NodeCommand.job_id == job.id, NodeCommand.node == part.node, NodeCommand.kind == "start")
            .order_by(NodeCommand.created_at.desc()).limit(1)).first()
        return "answers an earlier start of this job" if nonce and latest and nonce != latest else None
    if pid is not None and part.pid is not None and pid != part.pid:
        return f"about process {pid}; this run's process is {part.pid}"
    if event not in ("stopping", "stopped"):
        return None
    if job.state in ("starting", "running"):
        return "no stop of this run was requested"
    command = session.get(NodeCommand, nonce) if nonce else None
    asked = job.stop_request.get("at")
    if command is not None and command.kind == "stop" and command.job_id == job.id and asked \
            and command.created_at < datetime.fromisoformat(asked):
        return "answers a stop sent before the current one"
    return None


def unconfirmed_nodes(session: Session, job: Job) -> set[str]:
    return set(session.scalars(select(Allocation.node).where(
        Allocation.job_id == job.id, Allocation.state.not_in(PART_DONE))).all())


def mark_lost_nodes(gw: Gateway, session: Session, now: datetime) -> list[str]:
    """Nodes silent past the heartbeat timeout become `lost`; their running jobs become `lost` with GPUs
    withheld, their stopping jobs `stop_failed` (unreachable). Returns the node ids marked now."""
    cutoff = now - timedelta(seconds=gw.settings.node_heartbeat_timeout_s)
    marked = []
    for node in session.scalars(select(Node).where(Node.state == "alive")).all():
        if node.last_heartbeat is not None and node.last_heartbeat >= cutoff:
            continue
        node.state = "lost"
        marked.append(node.id)
        seen = node.last_heartbeat.isoformat() if node.last_heartbeat else None
        record_outcome(gw, "node", {"node": node.id, "state_before": "alive", "state_after": "lost",
                                    "last_heartbeat": seen, "at": now.isoformat()})
        # Locked and read again (PostgreSQL): a stop committed since jobs_on_node read them must not be undone.
        jobs = list(lock_jobs(session, [j.id for j in jobs_on_node(session, node.id)]).values())
        alert(gw, session, now, "node_lost", {"node": node.id, "last_heartbeat": seen,
                                              "jobs": [j.id for j in jobs]})
        for job in jobs:
            if job.state in ("starting", "running"):
                ledger_transition(gw, job, "lost", now, by="system",
                                  reason=f"node {node.id} missed heartbeats; GPUs withheld until it returns "
                                         "or on-call confirms", node=node.id)
            elif job.state in STOPPING_STATES:
                escalate(gw, session, job, now, f"node {node.id} is unreachable", unreachable=True)
    return marked


def jobs_on_node(session: Session, node_id: str) -> list[Job]:
    """Jobs with a part on the node that the node has not confirmed as over."""
    ids = session.scalars(select(Allocation.job_id).where(
        Allocation.node == node_id, Allocation.state.not_in(PART_DONE))).all()
    if not ids:
        return []
    return list(session.scalars(select(Job).where(Job.id.in_(sorted(set(ids)))).order_by(Job.id)).all())


def reconcile_params(session: Session, node_id: str, now: datetime) -> dict[str, list[str]]:
    """What the node should run (`expected`) and what it must stop (`stop`): every job with an unconfirmed part
    there that the gateway no longer wants running; and the nonces of the commands still in flight to it
    (`pending`), the only ones issued before this reconcile that a restarted agent may still obey."""
    expected: list[str] = []
    stop: list[str] = []
    for job in jobs_on_node(session, node_id):
        (expected if job.state in ("starting", "running", "lost") else stop).append(job.id)
    pending = sorted(session.scalars(
        select(NodeCommand.nonce).outerjoin(CommandAck, CommandAck.nonce == NodeCommand.nonce)
        .where(NodeCommand.node == node_id, NodeCommand.expires_at > now, CommandAck.nonce.is_(None))).all())
    return {"expected": expected, "stop": stop, "pending": pending}


def send_reconcile(gw: Gateway, session: Session, node_id: str, now: datetime, why: str) -> str:
    params = reconcile_params(session, node_id, now)
    nonce = enqueue(gw, session, node_id, "", "reconcile", params)
    row = session.get(AgentSession, node_id)
    if row is not None:
        row.last_reconcile_nonce = nonce
    record_outcome(gw, "node", {"node": node_id, "action": "reconcile", "why": why, "nonce": nonce,
                                "at": now.isoformat(), **params})
    return nonce


def on_heartbeat(gw: Gateway, session: Session, node: Node, was: str, instance: str,
                 running: list[dict[str, Any]], now: datetime) -> None:
    """A heartbeat from a node that was lost, new, or whose agent restarted: fold and reconcile."""
    row = session.get(AgentSession, node.id)
    restarted = row is not None and bool(instance) and row.instance != instance
    if row is None:
        row = AgentSession(node=node.id, instance=instance, since=now)
        session.add(row)
        session.flush()
    elif restarted:
        row.instance, row.since = instance, now
    if was == "alive" and not restarted:
        return
    if was == "lost":
        record_outcome(gw, "node", {"node": node.id, "state_before": "lost", "state_after": "alive",
                                    "at": now.isoformat()})
        here = {str(r.get("job_id")) for r in running}
        alive = set(session.scalars(select(Node.id).where(Node.state == "alive")).all()) | {node.id}
        for job in jobs_on_node(session, node.id):
            if job.state == "lost" and job.id in here and {p["node"] for p in job.placement} <= alive:
                ledger_transition(gw, job, "running", now, by=f"node:{node.id}",
                                  reason=f"node {node.id} returned and the process still runs")
    why = {"lost": "node returned", "registered": "agent started"}.get(was, "agent restarted")
    if was == "alive" and restarted:
        why = "agent restarted"
    send_reconcile(gw, session, node.id, now, why)


def mark_confirmed_stopped(gw: Gateway, session: Session, job: Job, *, by: str, reason: str, request_id: str,
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
    gw.scheduler_kick.set()


def housekeeping(gw: Gateway, session: Session, now: datetime) -> None:
    """Called once per scheduler cycle, in its transaction: node health, stop escalation and runtime limits
    (seconds matter).
    Retention, R4 auto-offline and purges run in the slower housekeeping loop (gateway/lifecycle.py)."""
    mark_lost_nodes(gw, session, now)
    escalate_unconfirmed_stops(gw, session, now)
    stop_overrunning(gw, session, now)  # Q6: a reservation counts on declared runtime limits being kept
