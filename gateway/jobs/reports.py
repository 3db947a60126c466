"""What an executor reports about the runs it was given, folded into jobs (C3, P2, P4, Q6): a part started,
is stopping, stopped or exited with its evidence; a gang that cannot go on without a failed member is stopped; a
run that ended is finished (stopped, paused, succeeded, failed) or, a preemption's victim, requeued; removed files
are ledgered one by one. Executors call this through the execution port's Reports (gateway/execution/port.py);
trusting the report is their part, folding it is this room's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import rfc8785
from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from gateway.decisions.notifications import alert, notify
from gateway.decisions.pipeline import decide, ledger_batch, record, record_outcome
from gateway.execution.port import Evidence, PartEvent
from gateway.identity.auth import SYSTEM
from gateway.jobs import executor_preemption, lifecycle, placement, retention, stops
from gateway.jobs.deps import Jobs
from gateway.jobs.preemption import ended_before_stop, executor_preempted, requeue
from gateway.jobs.records import lock_jobs
from gateway.jobs.stops import PART_DONE, escalate, ledger_transition
from gateway.store.models import Allocation, Job

# States a node's `stopped` evidence may still finish: the stop path, and a stop a person is waiting on.
STOP_FINISHABLE = ("stop_requested", "stopping", "stop_failed", "lost")


def fold(gw: Jobs, session: Session, job: Job, part: Allocation, parts: list[Allocation], node_id: str,
         event: PartEvent, *, at: float, pid: int | None = None, evidence: Mapping[str, Any] | None = None,
         reference: str | None = None, detail: str = "") -> None:
    """Fold one part's process event into the part and its job; ledger every transition it causes (C3). The
    executor vouched for the report first (gateway/native/agents.py: a node is believed only about what it can
    know). GPUs are released only on evidence that the process group is gone."""
    now = gw.clock()
    before = job.state
    group_survived = False
    if event == "started":
        part.state, part.pid = "running", pid
    elif event == "stopping":
        if part.state not in PART_DONE:
            part.state = "stopping"
    elif event in ("stopped", "exited"):
        ev = dict(evidence or {})
        if evidence is None:
            # The agent has no such process (it keeps a record of every group it runs): nothing left there.
            ev = {"process_group_gone": True, "note": detail or "not running on this node",
                  "exit_code": None}
        # Which observed end it was: a resend of it (delivery is at-least-once) is told from a second end. A
        # report without evidence ("not running here", "already exited") saw no end, and a later one may fill in.
        part.evidence = ev if evidence is None else {**ev, "reported_at": at, "reported_event": event}
        part.exit_code = ev.get("exit_code")
        if ev.get("process_group_gone") is False:
            group_survived = True
            part.state = "stopping"
        else:
            part.released = True
            if event == "stopped":
                part.state = "stopped"
            else:
                part.state = "exited" if ev.get("exit_code") == 0 else "failed"
    if group_survived:
        record_outcome(gw, "agent_report", {"node": node_id, "job_id": job.id, "event": event,
                                            "alert": "process group survived SIGKILL; GPUs withheld"},
                       blobs={"evidence": rfc8785.dumps(part.evidence)})
        if job.state in STOP_FINISHABLE and job.state != "stop_failed":
            escalate(gw, session, job, now, f"process group on {node_id} is still alive after SIGKILL",
                     unreachable=False)
        return
    if event == "stopping" and job.state == "stop_requested":
        ledger_transition(gw, job, "stopping", now, by=f"node:{node_id}", reason="prepare signal delivered",
                          node=node_id, nonce=reference, evidence=evidence or {})
    target = _job_state_from_parts(parts)
    if part.state == "failed" and target is None and job.state in ("starting", "running"):
        _stop_gang(gw, session, job, part, parts, now)
    elif target == "running" and job.state == "starting":
        job.started_at = datetime.fromtimestamp(at, UTC)
        ledger_transition(gw, job, "running", now, by=f"node:{node_id}", reason="all gang members started",
                          node=node_id)
    elif target in ("stopped", "exited", "failed") and _may_finish(job, target):
        _finish(gw, job, parts, target, now, node_id)
    elif event in ("stopped", "exited") and job.state == before and job.state not in STOP_FINISHABLE \
            and job.state not in ("starting", "running"):
        # Evidence for a job that already ended (e.g. confirmed by on-call while its node was lost).
        record_outcome(gw, "agent_report", {"node": node_id, "job_id": job.id, "event": event,
                                            "late_evidence": True, "job_state": job.state},
                       blobs={"evidence": rfc8785.dumps(part.evidence)})
    if part.released:
        gw.execution.changed()


def _job_state_from_parts(parts: list[Allocation]) -> str | None:
    states = {p.state for p in parts}
    if states <= {"running"}:
        return "running"
    if states <= {"stopped"}:
        return "stopped"
    if states <= {"stopped", "exited", "failed"} and "stopped" in states:
        return "stopped"
    if states <= {"exited"}:
        return "exited"
    if states <= {"exited", "failed"}:
        return "failed"
    return None


def _stop_gang(gw: Jobs, session: Session, job: Job, failed: Allocation, parts: list[Allocation],
               now: datetime) -> None:
    """Q6: one member of a gang failed, and the others cannot go on without it: a distributed run waits for
    its peers, often until a collective operation times out, holding every GPU. The system stops the members
    still running (decided and ledgered like any stop); the job then ends `failed`, not `stopped`."""
    status = f"exit code {failed.exit_code}" if failed.exit_code is not None else "its node reported no exit status"
    why = f"gang member on {failed.node} failed ({status}); the other members are stopped"
    rec = decide(gw, session, SYSTEM, "job.stop", targets=[job], project=job.project, reason=why)
    if rec.decision.effect != "allow":  # the policy keeps this to people: tell on-call the GPUs are held
        alert(session, now, "gang_member_failed",
                    {"job_id": job.id, "node": failed.node, "exit_code": failed.exit_code, "decision_seq": rec.seq})
        return
    live = {p.node for p in parts if p.state not in stops.PART_DONE}
    stops.request_stop(gw, session, job, now, by="system", reason=why, request_id=rec.request_id,
                       decision_seq=rec.seq, nodes=live,
                       gang_failure={"node": failed.node, "exit_code": failed.exit_code})
    notify(session, job.owner, "job_gang_member_failed",
           {"job_id": job.id, "node": failed.node, "exit_code": failed.exit_code, "stopping": sorted(live)}, now)


def _may_finish(job: Job, target: str) -> bool:
    return job.state in ("starting", "running") or job.state in STOP_FINISHABLE


def deleted(gw: Jobs, session: Session, job_id: str, node_id: str, *, objects: Sequence[Mapping[str, Any]],
            reason: str, left: Sequence[str] = (), unlisted: int = 0) -> None:
    """The executor removed artifacts on a node (retention cleanup or a job delete): ledger every object; a
    cleanup that left files behind stays open and on-call is told."""
    now = gw.clock()
    removed = [dict(o) for o in objects]
    left = list(left)
    if unlisted:  # removed, but past what one report may carry: counted, not listed one by one
        record_outcome(gw, "deletion", {"job_id": job_id, "node": node_id, "action": "deleted_unlisted",
                                        "count": unlisted, "reason": reason, "at": now.isoformat()})
    if left:  # the node could not remove everything: the cleanup is not over, and a person must look
        record_outcome(gw, "deletion", {"job_id": job_id, "node": node_id, "action": "incomplete",
                                        "left_count": len(left), "left": left[:100], "reason": reason,
                                        "at": now.isoformat()})
        alert(session, now, "deletion_incomplete",
              {"node": node_id, "job_id": job_id, "left_count": len(left), "left": left[:20]})
    retention.record_deleted(gw, session, node_id, job_id, removed, reason, now, complete=not left)
    lifecycle.purge_reported(gw, session, job_id, node_id, removed, now, complete=not left)


def _finish(gw: Jobs, job: Job, parts: list[Allocation], target: str, now: datetime, node_id: str) -> None:
    preempted = bool(job.stop_request.get("preemption"))
    if preempted and target == "stopped":  # P2: a preempted job goes back to the queue (gateway/jobs/preemption.py)
        requeue(gw, job, parts, now, f"node:{node_id}")
        return
    if preempted:  # it ended on its own before the prepare signal: finished, not preempted, so never rerun
        ended_before_stop(job)
    evidence = {p.node: p.evidence for p in parts}
    outcomes = {str(p.evidence.get("outcome")) for p in parts if p.evidence.get("outcome")}
    paused = bool(job.stop_request.get("pause"))
    # Stopped because a member failed (_stop_gang): the run failed, with that member's code; unless a final stop
    # (an emergency's) took the stop over, which ends it `stopped` like any other it takes over.
    gang_failure = None if "taken_over" in job.stop_request else job.stop_request.get("gang_failure")
    codes = [p.exit_code for p in parts if p.exit_code is not None]
    job.exit_code = max(codes, key=abs) if codes else None
    if gang_failure:
        job.outcome = None
        state = "failed"
        job.exit_code = gang_failure.get("exit_code")
    elif target == "stopped" or (job.state in ("stop_requested", "stopping", "stop_failed") and not preempted):
        job.outcome = "forced" if "forced" in outcomes else "graceful" if "graceful" in outcomes else "exited"
        state = "paused" if paused else "stopped"
    else:
        job.outcome = None
        state = "succeeded" if target == "exited" else "failed"
    job.ended_at = now
    job.evidence = {"nodes": evidence, "gpus_released": all(p.released for p in parts),
                    "process_groups_gone": all(p.evidence.get("process_group_gone") is not False for p in parts)}
    action = "job.pause" if paused else "job.stop" if state == "stopped" else "job.exit"
    stops.ledger_transition(gw, job, state, now, by=f"node:{node_id}",
                            reason=job.outcome or (f"exit code {job.exit_code}" if job.exit_code is not None
                                                   else "its node reported no exit status"), node=node_id)
    blob = rfc8785.dumps(job.evidence)
    record(gw, object_session(job), "outcome",
                 {"action": action, "job_id": job.id, "result": state, "outcome": job.outcome,
                  "exit_code": job.exit_code, "stop_request": job.stop_request}, blobs={"evidence": blob})
    if state in ("stopped", "paused"):
        retention.keep_checkpoints(gw, job, now)
    else:
        retention.release(gw, job, now)


class JobReports:
    """The execution port's Reports (gateway/execution/port.py) for an executor whose word needs no vouching: one
    this process runs (gateway/execution/inprocess.py) or one that reads its word from its own
    scheduler (gateway/execution/slurm/). Node agents' reports are vouched for first and then folded
    the same way (gateway/native/agents.py)."""

    def __init__(self, gw: Jobs) -> None:
        self.gw = gw

    def placed(self, session: Session, job_id: str, parts: Sequence[tuple[str, Sequence[int]]], *,
               borrowed: bool, priority: Mapping[str, float]) -> bool:
        job = lock_jobs(session, [job_id]).get(job_id)
        if job is None or job.state != "pending":
            return False
        placement.admit(self.gw, session, job, parts, borrowed=borrowed, priority=priority, now=self.gw.clock())
        return True

    def part_event(self, session: Session, job_id: str, node: str, event: PartEvent, *, at: float,
                   pid: int | None = None, evidence: Evidence | None = None, reference: str | None = None,
                   detail: str = "") -> None:
        """Raises LookupError for a job or a part the gateway does not hold (an executor's bug, never a node's)."""
        job = lock_jobs(session, [job_id]).get(job_id)
        parts = list(session.scalars(select(Allocation).where(Allocation.job_id == job_id)))
        part = next((p for p in parts if p.node == node), None)
        if job is None or part is None:
            raise LookupError(f"no part of job {job_id} on {node} to report {event} about")
        with session.no_autoflush, ledger_batch(self.gw, session):
            fold(self.gw, session, job, part, parts, node, event, at=at, pid=pid,
                 evidence=dict(evidence) if evidence is not None else None, reference=reference, detail=detail)

    def preempted(self, session: Session, job_id: str, *, preemptor: str | None, reason: str) -> bool:
        job = lock_jobs(session, [job_id]).get(job_id)
        if job is None or job.state not in ("starting", "running"):
            return False
        with session.no_autoflush, ledger_batch(self.gw, session):
            executor_preempted(self.gw, session, job, preemptor=preemptor, reason=reason)
        return True

    def may_preempt(self, session: Session, waiting: Sequence[str]) -> bool:
        return executor_preemption.may_preempt(self.gw, session, waiting)

    def preempt_for(self, session: Session, waiting: Sequence[str], ungoverned: Mapping[str, int]) -> list[int]:
        with session.no_autoflush, ledger_batch(self.gw, session):
            return executor_preemption.preempt_for(self.gw, session, waiting, ungoverned)

    def cancelled_while_waiting(self, session: Session, job_id: str, *, by: str | None, at: float, reason: str,
                                evidence: Evidence) -> bool:
        job = lock_jobs(session, [job_id]).get(job_id)
        if job is None or job.state != "pending":
            return False
        with session.no_autoflush, ledger_batch(self.gw, session):
            stops.cancelled_out_of_band(self.gw, session, job, by=by, at=at, reason=reason, evidence=evidence)
        return True

    def deleted(self, session: Session, job_id: str, node: str, *, objects: Sequence[Mapping[str, Any]],
                reason: str, left: Sequence[str] = (), unlisted: int = 0) -> None:
        deleted(self.gw, session, job_id, node, objects=objects, reason=reason, left=left, unlisted=unlisted)
