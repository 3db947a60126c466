"""Emergency stops (C2, C6): stop a job, a workload or a whole scope at once, with the trigger and deciders recorded.

The scope is resolved to job ids when the request is made and frozen: the approval is bound to exactly those
ids, so the stop never widens to jobs that appeared later. Policy (emergency.rego) decides how many people
must agree for each granularity; once allowed, every target gets its stop command in one transaction, so the
agents stop them in parallel with the (short) grace window of the request.

A workload or scope stop also holds its scope (unless asked not to): from its execution on, the policy refuses
new jobs that fall in it, and paused ones resuming there (rule C2.emergency_hold), so what was stopped cannot
simply come back, until on-call lifts the hold with a written reason (`lift`). Jobs submitted while the stop
waited for its approval are not among its targets; the hold refuses only what comes after.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gateway.decisions.approvals import open_request
from gateway.decisions.facts import in_scope
from gateway.decisions.pipeline import Recorded, decide, ledger_batch, record_outcome
from gateway.decisions.verdict import refuse_if_denied, refuse_unless_allowed
from gateway.errors import Conflict, Forbidden, Invalid, NotFound
from gateway.identity.auth import Caller
from gateway.jobs import stops
from gateway.jobs.deps import Jobs
from gateway.store.models import Job, Node
from gateway.store.service_tables import Approval
from gateway.store.states import STOPPABLE_STATES
from gateway.store.stop_tables import EmergencyHold, EmergencyStop

# Jobs an emergency stop takes are those a stop can act on (queued ones are cancelled so they cannot start after it).
# Jobs whose stop is already under way or failed are in scope too: their stop is taken over, so one being
# preempted (or paused) ends stopped instead of going back to the queue after the emergency.
SCOPE_STATES = STOPPABLE_STATES + stops.TAKEOVER_STATES
GRANULARITY = {"job": "job", "workload": "workload", "environment": "scope", "selector": "scope"}
# A stop in one of these has ended: done (every target accounted for), or refused / run out before anything stopped.
FINAL_STATES = ("done", "rejected", "expired")
VIEW_CAPABILITIES = ("emergency.stop", "ledger.read")


def resolve_scope(session: Session, kind: str, value: Any) -> tuple[list[Job], list[dict[str, Any]]]:
    """Jobs in scope that can be stopped now, and the tracked ones that cannot (blind spots, R5).

    Raises Invalid for an unknown kind or a malformed value, NotFound for an unknown job id.
    """
    stmt = select(Job).where(Job.state.in_(SCOPE_STATES)).order_by(Job.id)
    if kind == "job":
        if not isinstance(value, str):
            raise Invalid("a job scope names one job id: {\"kind\": \"job\", \"value\": \"j-...\"}")
        if session.get(Job, value) is None:
            raise NotFound(f"no job with id {value!r}")
        stmt = stmt.where(Job.id == value)
    elif kind == "workload":
        if not isinstance(value, str) or not value:
            raise Invalid("a workload scope names the workload: {\"kind\": \"workload\", \"value\": \"sweep-7\"}")
        stmt = stmt.where(Job.workload == value)
    elif kind == "environment":
        if not isinstance(value, str):
            raise Invalid("an environment scope names one of research, staging, production")
        if value not in ("research", "staging", "production"):
            raise Invalid(f"unknown environment {value!r}; one of research, staging, production")
        stmt = stmt.where(Job.environment == value)
    elif kind == "selector":
        if not isinstance(value, dict) or not value or not all(isinstance(v, str) for v in value.values()):
            raise Invalid("a selector scope is a non-empty map of label names to values, e.g. {\"team\": \"x\"}")
    else:
        raise Invalid(f"unknown scope kind {kind!r}; one of job, workload, environment, selector")
    jobs = list(session.scalars(stmt).all())
    if kind == "selector":
        jobs = [j for j in jobs if in_scope(kind, value, workload=j.workload, environment=j.environment,
                                            labels=j.labels)]
    targets = [j for j in jobs if j.stoppable]
    blind = [{"job_id": j.id, "reason": "tracked but declared not stoppable (R5)", "state": j.state}
             for j in jobs if not j.stoppable]
    return targets, blind


def create(gw: Jobs, session: Session, caller: Caller, *, kind: str, value: Any, trigger: str, reason: str,
           grace_seconds: float, ticket: str | None, hold: bool = True) -> tuple[EmergencyStop, Recorded]:
    """Decide and record an emergency stop; execute it now if policy allows, else open an approval.
    `hold`: a workload or scope stop keeps its scope closed to new jobs until lifted (see the module's doc).

    Raises Invalid, NotFound, PolicyDenied, LedgerUnavailable.
    """
    targets, blind = resolve_scope(session, kind, value)
    if not targets:
        raise Invalid(f"no running, stopping or queued stoppable job matches {kind} {value!r}", blind_spots=blind)
    granularity = GRANULARITY[kind]
    hold = hold and kind != "job"  # a job id is never submitted again: there is nothing to hold
    # `hold` is a parameter of the decision, so the approval's digest binds it: approvers agree to it too.
    params = {"scope": {"kind": kind, "value": value}, "trigger": trigger, "grace_seconds": grace_seconds,
              "hold": hold}
    rec = decide(gw, session, caller, "emergency.stop", targets=targets, params=params, reason=reason,
                 ticket=ticket, granularity=granularity)
    refuse_if_denied(rec)
    now = gw.clock()
    row = EmergencyStop(
        id="es-" + secrets.token_hex(8), scope_kind=kind, scope_value={"value": value, "hold": hold},
        granularity=granularity,
        trigger=trigger, reason=reason, requested_by=caller.real_identity, deciders=[caller.real_identity],
        grace_seconds=grace_seconds, state="pending_approval", request_id=rec.request_id, decision_seq=rec.seq,
        target_ids=[j.id for j in targets], skipped=blind, created_at=now,
    )
    session.add(row)
    session.flush()
    record_outcome(gw, "emergency", {"emergency_id": row.id, "request_id": rec.request_id, "decision_seq": rec.seq,
                                     "trigger": trigger, "scope": params["scope"], "granularity": granularity,
                                     "requested_by": caller.real_identity, "reason": reason,
                                     "targets": row.target_ids, "blind_spots": blind, "hold": hold,
                                     "result": rec.decision.effect})
    if rec.decision.effect == "needs_approval":
        approval = open_request(gw, session, caller, rec, action="emergency.stop", target_ids=row.target_ids,
                                project=None, params=params, reason=reason, ticket=ticket, granularity=granularity,
                                blast_radius={"jobs": len(targets), "gpus": sum(j.gpus_per_node * j.nodes
                                                                                for j in targets),
                                              "projects": sorted({j.project for j in targets})})
        row.approval_id = approval.id
        return row, rec
    execute(gw, session, row, targets, deciders=[caller.real_identity], decision_seq=rec.seq)
    return row, rec


def _after_approval(gw: Jobs, session: Session, approval: Approval, targets: list[Job],
                    approver: Caller) -> dict[str, Any]:
    row = session.scalars(select(EmergencyStop).where(EmergencyStop.approval_id == approval.id)).first()
    if row is None:
        raise NotFound(f"approval {approval.id} belongs to no emergency stop")
    deciders = [approval.requester_real, *[str(a["by"]) for a in approval.approvals]]
    execute(gw, session, row, targets, deciders=deciders, decision_seq=approval.decision_seq)
    return {"emergency_id": row.id, "stopping": [j.id for j in targets]}


def execute(gw: Jobs, session: Session, row: EmergencyStop, targets: list[Job], *, deciders: list[str],
            decision_seq: int) -> None:
    """Send every target its stop command in this one transaction (the agents then stop them in parallel)."""
    now = gw.clock()
    row.state, row.approved_at, row.deciders = "executing", now, list(dict.fromkeys(deciders))
    reason = f"emergency stop {row.id} ({row.trigger}): {row.reason}"
    lost = set(session.scalars(select(Node.id).where(Node.state == "lost")).all())
    with ledger_batch(gw, session):
        for job in targets:
            if job.state in stops.TAKEOVER_STATES:
                stops.take_over_stop(gw, session, job, now, by=row.requested_by, reason=reason,
                                     request_id=row.request_id, decision_seq=decision_seq,
                                     approved_by=row.deciders[1:], grace_seconds=row.grace_seconds,
                                     emergency_id=row.id, trigger=row.trigger)
            elif job.state in STOPPABLE_STATES:
                stops.request_stop(gw, session, job, now, by=row.requested_by, reason=reason,
                                   request_id=row.request_id, decision_seq=decision_seq,
                                   grace_seconds=row.grace_seconds, approved_by=row.deciders[1:], lost_nodes=lost,
                                   emergency_id=row.id, trigger=row.trigger)
    held = bool(row.scope_value.get("hold"))
    if held:
        session.add(EmergencyHold(emergency_id=row.id, scope_kind=row.scope_kind,
                                  scope_value={"value": row.scope_value.get("value")}, trigger=row.trigger, since=now))
    record_outcome(gw, "emergency", {"emergency_id": row.id, "result": "executing", "deciders": row.deciders,
                                     "trigger": row.trigger, "at": now.isoformat(), "targets": row.target_ids,
                                     "hold": held})


def lift(gw: Jobs, session: Session, caller: Caller, emergency_id: str, reason: str
         ) -> tuple[EmergencyHold, Recorded]:
    """Lift the hold an emergency stop keeps on its scope, so new jobs may be submitted there again.

    Raises NotFound (no such stop, or it holds nothing), Conflict (already lifted), PolicyDenied,
    LedgerUnavailable."""
    stop = session.get(EmergencyStop, emergency_id)
    if stop is None:
        raise NotFound(f"no emergency stop {emergency_id!r}")
    # Locked (PostgreSQL): two people lifting at once lift it once.
    hold = session.get(EmergencyHold, emergency_id, with_for_update=True)
    if hold is None:
        why = ("a job stop holds nothing" if stop.scope_kind == "job"
               else "it was made without one" if not stop.scope_value.get("hold")
               else "a stop holds its scope once it is carried out, and this one waits for its approval")
        raise NotFound(f"emergency stop {emergency_id} holds no scope: {why}")
    if hold.lifted_at is not None:
        raise Conflict(f"the hold of emergency stop {emergency_id} was lifted at {hold.lifted_at.isoformat()} by"
                       f" {hold.lifted_by}", lifted_by=hold.lifted_by)
    scope = {"kind": hold.scope_kind, "value": hold.scope_value.get("value")}
    rec = decide(gw, session, caller, "emergency.lift", params={"emergency_id": emergency_id, "scope": scope,
                                                                "trigger": hold.trigger},
                 reason=reason, granularity=GRANULARITY[hold.scope_kind])
    refuse_unless_allowed(rec, f"lifting the hold of emergency stop {emergency_id}")
    now = gw.clock()
    hold.lifted_at, hold.lifted_by, hold.lift_reason, hold.lift_decision_seq = (
        now, caller.real_identity, reason, rec.seq)
    record_outcome(gw, "emergency", {"emergency_id": emergency_id, "request_id": rec.request_id,
                                     "decision_seq": rec.seq, "result": "hold_lifted", "scope": scope,
                                     "lifted_by": caller.real_identity, "reason": reason, "at": now.isoformat()})
    return hold, rec


def load(gw: Jobs, session: Session, caller: Caller, emergency_id: str) -> EmergencyStop:
    """Raises NotFound, Forbidden (only on-call, security reviewers, auditors and the deciders may look)."""
    row = session.get(EmergencyStop, emergency_id)
    if row is None:
        raise NotFound(f"no emergency stop {emergency_id!r}")
    may_view(gw, caller, row)
    return row


def may_view(gw: Jobs, caller: Caller, row: EmergencyStop | None) -> None:
    who = caller.real_identity
    if row is not None and who in row.deciders:
        return
    held = gw.policy.capabilities(who, "*")
    if not any(c in held for c in VIEW_CAPABILITIES):
        raise Forbidden(f"{who} may not view emergency stops (needs emergency.stop or ledger.read)")


def job_status(job: Any, row: EmergencyStop, lost_nodes: set[str]) -> dict[str, Any]:
    """One target's outcome category; `job` is a row of the columns `report` selects (or a Job)."""
    nodes = [p["node"] for p in job.placement]
    unreachable = bool(job.stop_request.get("unreachable")) or (
        job.state in ("stop_requested", "stopping", "stop_failed") and bool(set(nodes) & lost_nodes))
    if job.state == "stopped" and job.outcome in ("graceful", "forced", "cancelled", "exited", "confirmed"):
        category = {"graceful": "stopped_graceful", "forced": "stopped_forced", "exited": "stopped_graceful",
                    "cancelled": "cancelled", "confirmed": "confirmed_by_person"}[job.outcome]
    elif job.state == "stop_failed":
        category = "unreachable" if unreachable else "stop_failed"
    elif job.state in ("succeeded", "failed"):
        category = "exited_before_stop"
    elif job.state in ("stop_requested", "stopping"):
        category = "in_progress"
    else:
        category = "not_stopped"
    latency = None
    if job.ended_at and row.approved_at and job.ended_at >= row.approved_at:
        latency = (job.ended_at - row.approved_at).total_seconds()
    gone = job.evidence.get("process_groups_gone") if isinstance(job.evidence, dict) else None
    return {"job_id": job.id, "state": job.state, "outcome": job.outcome, "category": category, "nodes": nodes,
            "project": job.project, "owner": job.owner, "stop_latency_s": latency, "process_groups_gone": gone}


SUMMARY_KEYS = ("stopped_graceful", "stopped_forced", "cancelled", "confirmed_by_person", "stop_failed",
                "unreachable", "in_progress", "exited_before_stop", "not_stopped")


def report(session: Session, row: EmergencyStop, now: datetime) -> dict[str, Any]:
    """Per-job state and the summary of one stop (see `reports`)."""
    return reports(session, [row], now)[0]


# Only the columns a report needs: polled while a thousand stops land, it must stay cheap.
_REPORT_COLUMNS = (Job.id, Job.state, Job.outcome, Job.placement, Job.project, Job.owner, Job.ended_at,
                   Job.stop_request, Job.evidence)
_IN_CHUNK = 5000  # ids per IN list: well below the bound values one SQLite statement may hold


def reports(session: Session, rows: list[EmergencyStop], now: datetime) -> list[dict[str, Any]]:
    """Per-job state and the summary of each stop, in a handful of queries however many stops there are.

    Only reads: the state a report shows is derived from its targets (`done` once every one is accounted for)
    or its approval (refused or run out), so a GET needs no write lock; `settle` stores what changed."""
    ids = sorted({i for row in rows for i in row.target_ids})
    jobs = {j.id: j for k in range(0, len(ids), _IN_CHUNK)
            for j in session.execute(select(*_REPORT_COLUMNS).where(Job.id.in_(ids[k:k + _IN_CHUNK]))).all()}
    lost = set(session.scalars(select(Node.id).where(Node.state == "lost")).all())
    holds = {h.emergency_id: h for h in session.scalars(
        select(EmergencyHold).where(EmergencyHold.emergency_id.in_([row.id for row in rows]))).all()}
    asked = [row.approval_id for row in rows if row.state == "pending_approval" and row.approval_id is not None]
    approvals = {a.id: a for a in session.scalars(select(Approval).where(Approval.id.in_(asked))).all()}
    out = []
    for row in rows:
        per_job = [job_status(jobs[i], row, lost) for i in row.target_ids if i in jobs]
        out.append(_report(session, row, per_job, holds.get(row.id), approvals.get(row.approval_id or ""), now))
    return out


def _report(session: Session, row: EmergencyStop, per_job: list[dict[str, Any]], hold: EmergencyHold | None,
            approval: Approval | None, now: datetime) -> dict[str, Any]:
    summary = dict.fromkeys(SUMMARY_KEYS, 0)
    for j in per_job:
        summary[j["category"]] += 1
    state, finished_at = row.state, row.finished_at
    if state == "executing" and summary["in_progress"] == 0 and summary["not_stopped"] == 0:
        # When the last target was accounted for, not when someone first looked.
        state, finished_at = "done", _last_step_at(session, row.target_ids) or now
    elif state == "pending_approval" and approval is not None and approval.state in ("rejected", "expired"):
        # Refused, withdrawn or run out: nothing was stopped and nothing will be (without this the stop
        # showed as waiting for an approval that can no longer come).
        state, finished_at = approval.state, approval.resolved_at or approval.expires_at
    latencies = sorted(j["stop_latency_s"] for j in per_job if j["stop_latency_s"] is not None)
    return {
        "id": row.id, "state": state, "scope": {"kind": row.scope_kind, "value": row.scope_value.get("value")},
        "granularity": row.granularity, "trigger": row.trigger, "reason": row.reason,
        "requested_by": row.requested_by, "deciders": row.deciders, "grace_seconds": row.grace_seconds,
        "approval_id": row.approval_id, "decision_seq": row.decision_seq,
        "created_at": row.created_at.isoformat(),
        "approved_at": row.approved_at.isoformat() if row.approved_at else None,
        "finished_at": finished_at.isoformat() if finished_at else None,
        "summary": {**summary, "targets": len(per_job), "blind_spots": len(row.skipped),
                    "accounted_for": len(per_job) - summary["in_progress"] - summary["not_stopped"]},
        "last_confirmed_after_s": latencies[-1] if latencies and summary["in_progress"] == 0 else None,
        "hold": hold_out(hold, asked=bool(row.scope_value.get("hold")) and state == "pending_approval"),
        "jobs": per_job, "blind_spots": row.skipped,
    }


def _last_step_at(session: Session, job_ids: list[str]) -> datetime | None:
    """The latest state change among these jobs (each change is timestamped in the job's history, C3)."""
    last: datetime | None = None
    for k in range(0, len(job_ids), _IN_CHUNK):
        for history in session.scalars(select(Job.history).where(Job.id.in_(job_ids[k:k + _IN_CHUNK]))):
            if history:
                at = datetime.fromisoformat(history[-1]["at"])
                last = at if last is None or at > last else last
    return last


def settle(session: Session, rows: list[EmergencyStop], shown: list[dict[str, Any]]) -> None:
    """Store the states `reports` derived where they differ from the rows': once per stop, the first time
    it is seen done (or refused); only if the row still holds the state the report started from, so two
    readers settling at once store it once."""
    for row, out in zip(rows, shown, strict=True):
        if out["state"] != row.state:
            session.execute(update(EmergencyStop).where(EmergencyStop.id == row.id, EmergencyStop.state == row.state)
                            .values(state=out["state"], finished_at=datetime.fromisoformat(out["finished_at"])))


def settle_after_read(gw: Jobs, rows: list[EmergencyStop], shown: list[dict[str, Any]]) -> None:
    """`settle` in a short write transaction of its own, after reports read without the write lock; only when
    one of them found its stop ended, which happens once per stop."""
    if any(out["state"] != row.state for row, out in zip(rows, shown, strict=True)):
        with gw.transaction() as session:
            settle(session, rows, shown)


def hold_out(hold: EmergencyHold | None, *, asked: bool) -> dict[str, Any]:
    """state: none (not asked for, or the stop was refused), pending (asked for, the stop waits for its
    approval), in_force, or lifted."""
    if hold is None:
        return {"state": "pending" if asked else "none"}
    if hold.lifted_at is None:
        return {"state": "in_force", "since": hold.since.isoformat()}
    return {"state": "lifted", "since": hold.since.isoformat(), "lifted_at": hold.lifted_at.isoformat(),
            "lifted_by": hold.lifted_by, "reason": hold.lift_reason, "decision_seq": hold.lift_decision_seq}


def list_stops(session: Session, limit: int = 100) -> list[EmergencyStop]:
    return list(session.scalars(select(EmergencyStop).order_by(EmergencyStop.created_at.desc()).limit(limit)).all())


# What this module carries out once a second person approved it (M2), bound to the running gateway at app
# start (gateway/bootstrap.py).
EXECUTORS = {"emergency.stop": _after_approval}
