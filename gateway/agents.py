"""The gateway side of the node-agent channel: heartbeats, command delivery, reports of process events.

Delivery is at-least-once: a command counts as delivered only when a report carrying its nonce comes back
(an agent's `rejected: replayed` counts too for a start or a delete, since it proves the agent holds the nonce).
Until then the very same signed envelope is handed out again, so an agent that died between fetching and
obeying gets it after restart, and its nonce store keeps it from running twice. A stop is different: a
"rejected" answer never acknowledges it. The stop is idempotent, so it goes out again until the node says it is
stopping or stopped, and a stop that never takes escalates to stop_failed with the rejections as evidence.

A node is believed only about what that node can know (H1, F3): a report is about the job's allocation on that
node, an acknowledgement names a nonce issued to that node, a stop's evidence carries that stop's nonce. A report
that contradicts the gateway's own record (another job's or another node's nonce, a second end of the same run,
GPUs other than the ones it holds, a job its heartbeat still runs after it said it ended) is not applied: it is
ledgered as a node anomaly and on-call is alerted, as for a bypass.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import rfc8785
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, object_session

from gateway import stops
from gateway.context import Gateway
from gateway.decisions.notifications import notify
from gateway.decisions.pipeline import decide, ledger_batch, record, record_outcome
from gateway.errors import Forbidden, NotFound
from gateway.identity.auth import Caller
from gateway.jobs import lock_jobs
from gateway.schemas import AgentReport, Heartbeat
from gateway.store.models import Allocation, Job, Node, NodeCommand
from gateway.store.stop_tables import CommandAck

# An unacknowledged envelope is handed out again after this long (same nonce, same signature).
RESEND_AFTER_S = 3.0
# Commands that stop jobs: a "rejected" answer to one is never its acknowledgement.
STOP_KINDS = ("stop", "reconcile")
MAX_REJECTIONS_KEPT = 20
# States a node's `stopped` evidence may still finish: the stop path, and a stop a person is waiting on.
_STOP_FINISHABLE = ("stop_requested", "stopping", "stop_failed", "lost")


def require_node(caller: Caller, node_id: str) -> None:
    """Only the node's own agent token may speak for it."""
    if caller.kind != "node" or caller.id != node_id:
        raise Forbidden(f"only the agent of node {node_id!r} may use this endpoint")


def heartbeat(gw: Gateway, session: Session, node_id: str, beat: Heartbeat, instance: str = "") -> None:
    """Record the beat; a node coming back (or an agent restarted) gets a `reconcile` command."""
    now = gw.clock()
    node = session.get(Node, node_id)
    if node is None:
        node = Node(id=node_id, gpus=beat.gpus, state="registered", last_heartbeat=now, running=beat.running)
        session.add(node)
        session.flush()
    was = node.state
    if node.state != "alive" or node.gpus != beat.gpus:
        gw.scheduler_kick.set()
    if node.gpus != beat.gpus:
        _alert_if_short(gw, session, node_id, beat.gpus, now)
    if beat.isolation != node.isolation:
        if beat.isolation == "none":
            stops.alert(gw, session, now, "node_not_isolated", {
                "node": node_id, "isolation": "none",
                "effect": "its jobs run as the agent's own user: any of them could read the node's token and act "
                          "as the node"})
        record_outcome(gw, "node", {"node": node_id, "isolation_before": node.isolation,
                                    "isolation": beat.isolation, "at": now.isoformat()})
        node.isolation = beat.isolation
        gw.scheduler_kick.set()
    node.gpus = beat.gpus
    node.state = "alive"
    node.last_heartbeat = now
    node.running = beat.running
    _contradicted_by_beat(gw, session, node_id, beat.running, now, beat.at)
    stops.on_heartbeat(gw, session, node, was, instance, beat.running, now)


def _alert_if_short(gw: Gateway, session: Session, node_id: str, reported: int, now: datetime) -> None:
    """A node now reporting fewer GPUs than its jobs hold takes no new work until they fit (the scheduler marks
    it degraded, gateway/scheduling.py); its jobs are not touched. Told once per change of count, not per beat."""
    beyond: set[int] = set()
    jobs: set[str] = set()
    for job_id, gpus in session.execute(select(Allocation.job_id, Allocation.gpus).where(
            Allocation.node == node_id, Allocation.released.is_(False))).all():
        missing = {g for g in gpus if g >= reported}
        if missing:
            beyond |= missing
            jobs.add(job_id)
    if beyond:
        stops.alert(gw, session, now, "node_gpus_missing", {
            "node": node_id, "reported_gpus": reported, "allocated_beyond": sorted(beyond), "jobs": sorted(jobs),
            "effect": "no new work is placed on this node until its jobs fit the GPUs it reports"})


def take_commands(gw: Gateway, session: Session, node_id: str) -> list[dict[str, Any]]:
    """Hand out the node's unacknowledged, unexpired commands in issue order (new ones, and old ones due again)."""
    now = gw.clock()
    due = now - timedelta(seconds=RESEND_AFTER_S)
    rows = session.scalars(
        select(NodeCommand)
        .outerjoin(CommandAck, CommandAck.nonce == NodeCommand.nonce)
        .where(NodeCommand.node == node_id, NodeCommand.expires_at > now, CommandAck.nonce.is_(None),
               or_(NodeCommand.delivered_at.is_(None), NodeCommand.delivered_at < due))
        .order_by(NodeCommand.created_at, NodeCommand.nonce)
    ).all()
    for row in rows:
        row.delivered_at = now
    return [row.envelope for row in rows]


def has_unacked(gw: Gateway, session: Session, node_id: str) -> bool:
    """Whether some delivered command still waits for its acknowledgement (the long poll then wakes to resend)."""
    now = gw.clock()
    found = session.scalars(
        select(NodeCommand.nonce)
        .outerjoin(CommandAck, CommandAck.nonce == NodeCommand.nonce)
        .where(and_(NodeCommand.node == node_id, NodeCommand.expires_at > now, CommandAck.nonce.is_(None),
                    NodeCommand.delivered_at.is_not(None)))
        .limit(1)
    ).first()
    return found is not None


class _Batch:
    """What one report batch touches, loaded in four queries instead of several per report."""

    def __init__(self, session: Session, reports: list[AgentReport]) -> None:
        nonces = sorted({r.nonce for r in reports if r.nonce})
        job_ids = sorted({r.job_id for r in reports if r.job_id})
        self.commands = {c.nonce: c for c in session.scalars(
            select(NodeCommand).where(NodeCommand.nonce.in_(nonces)))} if nonces else {}
        self.acked = set(session.scalars(select(CommandAck.nonce).where(CommandAck.nonce.in_(nonces)))) \
            if nonces else set()
        # Loaded into the identity map, so session.get(Job, id) below costs no query. Locked (PostgreSQL): a stop
        # or the scheduler's preemption committed between this read and the write would otherwise be undone.
        self.jobs = lock_jobs(session, job_ids)
        self.parts: dict[str, list[Allocation]] = {}
        if job_ids:
            for part in session.scalars(select(Allocation).where(Allocation.job_id.in_(job_ids))):
                self.parts.setdefault(part.job_id, []).append(part)


def apply_reports(gw: Gateway, session: Session, node_id: str, reports: list[AgentReport]) -> None:
    """Fold a batch of reports in order, in the caller's transaction; ledger appends go out together."""
    with session.no_autoflush, ledger_batch(gw, session):
        batch = _Batch(session, reports)
        for report in reports:
            apply_report(gw, session, node_id, report, batch)


def _sent(session: Session, nonce: str, batch: _Batch | None) -> NodeCommand | None:
    return batch.commands.get(nonce) if batch is not None else session.get(NodeCommand, nonce)


def _foreign_nonce(session: Session, node_id: str, report: AgentReport, batch: _Batch | None) -> str | None:
    """Why the report's nonce cannot be this node's to answer (never issued to it, or a `reconciled` naming
    another kind of command), or None."""
    if not report.nonce:
        return "a reconciled report without the reconcile's nonce" if report.event == "reconciled" else None
    sent = _sent(session, report.nonce, batch)
    if sent is None or sent.node != node_id:
        return "it answers a nonce the gateway never issued to this node"
    if report.event == "reconciled" and sent.kind != "reconcile":
        return f"it calls a {sent.kind} command reconciled"
    return None


def _acknowledge(session: Session, node_id: str, report: AgentReport, now: datetime, batch: _Batch | None) -> None:
    """Mark the command the report answers as delivered (once the report is known to be the node's to make)."""
    if not report.nonce:
        return
    sent = _sent(session, report.nonce, batch)
    if sent is None or (report.event == "rejected" and sent.kind in STOP_KINDS):
        return  # a rejected stop is never acknowledged: it goes out again (see the module docstring)
    if batch is not None:
        if report.nonce in batch.acked:
            return
        batch.acked.add(report.nonce)
    elif session.get(CommandAck, report.nonce) is not None:
        return
    session.add(CommandAck(nonce=report.nonce, node=node_id, acked_at=now, event=report.event,
                           detail=report.detail[:500]))


def anomaly(gw: Gateway, session: Session, node_id: str, report: AgentReport | None, why: str, now: datetime,
            **body: Any) -> None:
    """A node said something it cannot know or that contradicts the gateway's record: not applied, ledgered and
    alerted as a node anomaly (F3). Either its agent is broken, or something on the node speaks as the agent."""
    about = {} if report is None else {"job_id": report.job_id or None, "event": report.event, "nonce": report.nonce,
                                        "pid": report.pid, "detail": report.detail[:500]}
    entry = {"node": node_id, "anomaly": why, **about, **body, "at": now.isoformat()}
    record_outcome(gw, "agent_report", entry)
    stops.alert(gw, session, now, "node_anomaly", {**entry, "effect": "the report was not applied"})


def _contradiction(session: Session, job: Job, part: Allocation, report: AgentReport, batch: _Batch | None
                   ) -> str | None:
    """Why this report about `part` contradicts the gateway's own record, or None."""
    if report.event in ("stopping", "stopped") and not _answers_stop(session, job, part, report, batch):
        return "stop evidence without the nonce of a stop sent to this node for this job"
    if report.event not in ("stopped", "exited") or report.evidence is None:
        return None
    if part.state in stops.PART_DONE and part.evidence.get("reported_at") is not None \
            and (part.evidence.get("reported_at"), part.evidence.get("reported_event")) != (report.at, report.event):
        return f"a second end of the same run: the node already reported it {part.state}"
    released = report.evidence.get("gpus_released")
    if report.evidence.get("process_group_gone") is not False and isinstance(released, list) \
            and not set(released) <= set(part.gpus):
        return f"it releases GPUs {released}, but this job holds {sorted(part.gpus)} there"
    return None


def _answers_stop(session: Session, job: Job, part: Allocation, report: AgentReport, batch: _Batch | None) -> bool:
    """A stop's report must carry the nonce of a stop of this job sent to this node, or of a reconcile of this node
    that asked for this job to be stopped."""
    sent = _sent(session, report.nonce, batch) if report.nonce else None
    if sent is None or sent.node != part.node:
        return False
    if sent.kind == "stop":
        return sent.job_id == job.id
    return sent.kind == "reconcile" and job.id in (sent.envelope_params().get("stop") or [])


def _contradicted_by_beat(gw: Gateway, session: Session, node_id: str, running: list[dict[str, Any]],
                          now: datetime, at: float | None) -> None:
    """A heartbeat taken after the node said a run ended, still listing that very process: the GPUs it freed
    are still held (or the end was false). Alerted once per run."""
    if at is None or not running:
        return
    listed = {str(r.get("job_id")): r.get("pid") for r in running}
    for part in session.scalars(select(Allocation).where(
            Allocation.node == node_id, Allocation.job_id.in_(sorted(listed)), Allocation.state.in_(stops.PART_DONE))):
        ended_at = part.evidence.get("reported_at")
        if ended_at is None or at <= ended_at or listed[part.job_id] != part.pid or part.evidence.get("contradicted"):
            continue
        part.evidence = {**part.evidence, "contradicted": now.isoformat()}
        anomaly(gw, session, node_id, None, "its heartbeat still runs a process it reported ended: the GPUs it freed"
                " are not free", now, job_id=part.job_id, pid=part.pid, state=part.state, gpus=list(part.gpus))


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


def apply_report(gw: Gateway, session: Session, node_id: str, report: AgentReport,
                 batch: _Batch | None = None) -> None:
    """Fold one agent report into allocation and job state; ledger every transition it causes (C3).

    GPUs are released only on the node's evidence that the process group is gone.
    """
    now = gw.clock()
    foreign = _foreign_nonce(session, node_id, report, batch)
    if foreign is not None:
        anomaly(gw, session, node_id, report, foreign, now)
        return
    if report.event not in ("started", "stopping", "stopped", "exited"):
        _acknowledge(session, node_id, report, now, batch)  # about a command, not (yet) a job's processes
    if report.event == "reconciled":
        return
    if report.event == "rejected":
        _rejected(gw, session, node_id, report, now, batch)
        return
    if report.event == "deleted":
        if _asked_to_delete(session, node_id, report, batch):
            _deleted(gw, session, node_id, report, now)
        else:
            _unknown(gw, session, node_id, report, session.get(Job, report.job_id), now)
        return
    job = session.get(Job, report.job_id) if report.job_id else None
    if job is None or report.event == "unknown":
        _unknown(gw, session, node_id, report, job, now)
        return
    if batch is not None:
        parts = batch.parts.get(job.id, [])
    else:
        parts = list(session.scalars(select(Allocation).where(Allocation.job_id == job.id)).all())
    part = next((p for p in parts if p.node == node_id), None)
    if part is None:
        anomaly(gw, session, node_id, report, "a report about a job that has no allocation on this node", now,
                job_state=job.state, placed_on=sorted(p.node for p in parts))
        return
    contradiction = _contradiction(session, job, part, report, batch)
    if contradiction is not None:
        anomaly(gw, session, node_id, report, contradiction, now, job_state=job.state, part_state=part.state)
        return
    _acknowledge(session, node_id, report, now, batch)
    stale = stops.stale_report(session, job, part, report.event, report.pid, report.nonce)
    if stale is not None:
        record_outcome(gw, "agent_report", {"node": node_id, "job_id": job.id, "event": report.event,
                                            "detail": report.detail, "nonce": report.nonce, "pid": report.pid,
                                            "stale": stale, "job_state": job.state})
        return
    before = job.state
    group_survived = False
    if report.event == "started":
        part.state, part.pid = "running", report.pid
    elif report.event == "stopping":
        if part.state not in stops.PART_DONE:
            part.state = "stopping"
    elif report.event in ("stopped", "exited"):
        ev = dict(report.evidence or {})
        if report.evidence is None:
            # The agent has no such process (it keeps a record of every group it runs): nothing left there.
            ev = {"process_group_gone": True, "note": report.detail or "not running on this node",
                  "exit_code": None}
        # Which observed end it was: a resend of it (delivery is at-least-once) is told from a second end. A
        # report without evidence ("not running here", "already exited") saw no end, and a later one may fill in.
        part.evidence = ev if report.evidence is None else {**ev, "reported_at": report.at,
                                                            "reported_event": report.event}
        part.exit_code = ev.get("exit_code")
        if ev.get("process_group_gone") is False:
            group_survived = True
            part.state = "stopping"
        else:
            part.released = True
            if report.event == "stopped":
                part.state = "stopped"
            else:
                part.state = "exited" if ev.get("exit_code") == 0 else "failed"
    if group_survived:
        record_outcome(gw, "agent_report", {"node": node_id, "job_id": job.id, "event": report.event,
                                            "alert": "process group survived SIGKILL; GPUs withheld"},
                       blobs={"evidence": rfc8785.dumps(part.evidence)})
        if job.state in _STOP_FINISHABLE and job.state != "stop_failed":
            stops.escalate(gw, session, job, now, f"process group on {node_id} is still alive after SIGKILL",
                           unreachable=False)
        return
    if report.event == "stopping" and job.state == "stop_requested":
        stops.ledger_transition(gw, job, "stopping", now, by=f"node:{node_id}", reason="prepare signal delivered",
                                node=node_id, nonce=report.nonce, evidence=report.evidence or {})
    target = _job_state_from_parts(parts)
    if part.state == "failed" and target is None and job.state in ("starting", "running"):
        _stop_gang(gw, session, job, part, parts, now)
    elif target == "running" and job.state == "starting":
        job.started_at = datetime.fromtimestamp(report.at, UTC)
        stops.ledger_transition(gw, job, "running", now, by=f"node:{node_id}", reason="all gang members started",
                                node=node_id)
    elif target in ("stopped", "exited", "failed") and _may_finish(job, target):
        _finish(gw, job, parts, target, now, node_id)
    elif report.event in ("stopped", "exited") and job.state == before and job.state not in _STOP_FINISHABLE \
            and job.state not in ("starting", "running"):
        # Evidence for a job that already ended (e.g. confirmed by on-call while its node was lost).
        record_outcome(gw, "agent_report", {"node": node_id, "job_id": job.id, "event": report.event,
                                            "late_evidence": True, "job_state": job.state},
                       blobs={"evidence": rfc8785.dumps(part.evidence)})
    if part.released:
        gw.scheduler_kick.set()


def _stop_gang(gw: Gateway, session: Session, job: Job, failed: Allocation, parts: list[Allocation],
               now: datetime) -> None:
    """Q6: one member of a gang failed, and the others cannot go on without it: a distributed run waits for
    its peers, often until a collective operation times out, holding every GPU. The system stops the members
    still running (decided and ledgered like any stop); the job then ends `failed`, not `stopped`."""
    from gateway.retention import SYSTEM  # late: retention imports this module's neighbours

    status = f"exit code {failed.exit_code}" if failed.exit_code is not None else "its node reported no exit status"
    why = f"gang member on {failed.node} failed ({status}); the other members are stopped"
    rec = decide(gw, session, SYSTEM, "job.stop", targets=[job], project=job.project, reason=why)
    if rec.decision.effect != "allow":  # the policy keeps this to people: tell on-call the GPUs are held
        stops.alert(gw, session, now, "gang_member_failed",
                    {"job_id": job.id, "node": failed.node, "exit_code": failed.exit_code, "decision_seq": rec.seq})
        return
    live = {p.node for p in parts if p.state not in stops.PART_DONE}
    stops.request_stop(gw, session, job, now, by="system", reason=why, request_id=rec.request_id,
                       decision_seq=rec.seq, nodes=live,
                       gang_failure={"node": failed.node, "exit_code": failed.exit_code})
    notify(session, job.owner, "job_gang_member_failed",
           {"job_id": job.id, "node": failed.node, "exit_code": failed.exit_code, "stopping": sorted(live)}, now)


def _may_finish(job: Job, target: str) -> bool:
    return job.state in ("starting", "running") or job.state in _STOP_FINISHABLE


def _rejected(gw: Gateway, session: Session, node_id: str, report: AgentReport, now: datetime,
              batch: _Batch | None) -> None:
    sent = _sent(session, report.nonce, batch) if report.nonce else None
    stop = sent is not None and sent.kind in STOP_KINDS
    # `replayed` is the agent telling us it already has this nonce: not an attack, and for a start or a delete an
    # acknowledgement; a stop only the node's own stopping, stopped or reconciled answers (it is sent again).
    replay = report.detail.startswith("replayed")
    record_outcome(gw, "agent_report", {"node": node_id, "job_id": report.job_id or None, "event": "rejected",
                                        "detail": report.detail, "nonce": report.nonce,
                                        "acknowledgement": replay and not stop, "at": now.isoformat(),
                                        **({"stop_resent": True} if stop else {})})
    if stop and sent is not None and not replay:
        _note_stop_rejection(session, sent, node_id, report, now)
    if not replay:
        stops.alert(gw, session, now, "command_rejected",
                    {"node": node_id, "job_id": report.job_id or None, "nonce": report.nonce,
                     "detail": report.detail})


def _note_stop_rejection(session: Session, sent: NodeCommand, node_id: str, report: AgentReport, now: datetime
                         ) -> None:
    """Keep the rejection on the job's stop request: if the stop never takes, it is the escalation's evidence."""
    jobs = [sent.job_id] if sent.kind == "stop" else list(sent.envelope_params().get("stop") or [])
    for job_id in jobs:
        job = session.get(Job, job_id)
        if job is None or job.state not in _STOP_FINISHABLE:
            continue
        seen = list(job.stop_request.get("rejections") or [])[-(MAX_REJECTIONS_KEPT - 1):]
        job.stop_request = {**job.stop_request, "rejections": [
            *seen, {"node": node_id, "nonce": report.nonce, "detail": report.detail[:200], "at": now.isoformat()}]}


def _asked_to_delete(session: Session, node_id: str, report: AgentReport, batch: _Batch | None) -> bool:
    """A deletion counts only as the answer to our signed delete_artifacts for that job on that node:
    a node token must not close another node's retention, or purge and ledger files it never held."""
    if not report.nonce:
        return False
    sent = batch.commands.get(report.nonce) if batch is not None else session.get(NodeCommand, report.nonce)
    return sent is not None and sent.kind == "delete_artifacts" and sent.node == node_id \
        and sent.job_id == report.job_id


def _deleted(gw: Gateway, session: Session, node_id: str, report: AgentReport, now: datetime) -> None:
    """The node removed artifacts (retention cleanup or a job delete): ledger every object."""
    from gateway import lifecycle, retention  # late: both import this module's neighbours

    ev = report.evidence or {}
    objects = [dict(o) for o in ev.get("deleted") or [] if isinstance(o, dict)]
    reason = str(ev.get("reason") or "")
    left = [str(p) for p in ev.get("left") or []]
    truncated = ev.get("truncated") if isinstance(ev.get("truncated"), dict) else {}
    unlisted = max(0, int(truncated.get("deleted") or 0) - len(objects)) if truncated else 0
    if unlisted:  # removed, but past what one report may carry: counted, not listed one by one
        record_outcome(gw, "deletion", {"job_id": report.job_id, "node": node_id, "action": "deleted_unlisted",
                                        "count": unlisted, "reason": reason, "at": now.isoformat()})
    if left:  # the node could not remove everything: the cleanup is not over, and a person must look
        record_outcome(gw, "deletion", {"job_id": report.job_id, "node": node_id, "action": "incomplete",
                                        "left_count": len(left), "left": left[:100], "reason": reason,
                                        "at": now.isoformat()})
        stops.alert(gw, session, now, "deletion_incomplete",
                    {"node": node_id, "job_id": report.job_id, "left_count": len(left), "left": left[:20]})
    retention.record_deleted(gw, session, node_id, report.job_id, objects, reason, now, complete=not left)
    lifecycle.purge_reported(gw, session, report.job_id, node_id, objects, now, complete=not left)


def _unknown(gw: Gateway, session: Session, node_id: str, report: AgentReport, job: Job | None,
             now: datetime) -> None:
    """A process the gateway does not expect on that node: reported and alerted, never stopped unasked (H1)."""
    record_outcome(gw, "agent_report", {"node": node_id, "job_id": report.job_id or None, "event": report.event,
                                        "detail": report.detail, "nonce": report.nonce, "known_job": job is not None,
                                        "job_state": job.state if job else None, "pid": report.pid})
    if report.event == "deleted":
        stops.alert(gw, session, now, "unsolicited_deletion",
                    {"node": node_id, "job_id": report.job_id, "nonce": report.nonce, "detail": report.detail})
    if report.event == "unknown":
        stops.alert(gw, session, now, "unknown_process",
                    {"node": node_id, "job_id": report.job_id, "pid": report.pid,
                     "known_job": job is not None, "detail": report.detail})


def _finish(gw: Gateway, job: Job, parts: list[Allocation], target: str, now: datetime, node_id: str) -> None:
    preempted = bool(job.stop_request.get("preemption"))
    if preempted and target == "stopped":  # P2: a preempted job goes back to the queue (gateway/preemption.py)
        from gateway.preemption import requeue

        requeue(gw, job, parts, now, f"node:{node_id}")
        return
    if preempted:  # it ended on its own before the prepare signal: finished, not preempted, so never rerun
        from gateway.preemption import ended_before_stop

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
    from gateway import retention  # imported late: retention imports the agent channel's helpers

    if state in ("stopped", "paused"):
        retention.keep_checkpoints(gw, job, now)
    else:
        retention.release(gw, job, now)


def node_or_404(session: Session, node_id: str) -> Node:
    node = session.get(Node, node_id)
    if node is None:
        raise NotFound(f"no node {node_id!r}")
    return node
