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

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from gateway.decisions.notifications import alert
from gateway.decisions.pipeline import ledger_batch, record_outcome
from gateway.errors import Forbidden, NotFound
from gateway.identity.auth import Caller
from gateway.jobs import reports, stops
from gateway.jobs.records import lock_jobs
from gateway.jobs.reports import STOP_FINISHABLE
from gateway.native import node_health
from gateway.native.deps import Native
from gateway.schemas import AgentReport, Heartbeat
from gateway.store.models import Allocation, Job, Node, NodeCommand
from gateway.store.stop_tables import CommandAck

# An unacknowledged envelope is handed out again after this long (same nonce, same signature).
RESEND_AFTER_S = 3.0
# Commands that stop jobs: a "rejected" answer to one is never its acknowledgement.
STOP_KINDS = ("stop", "reconcile")
MAX_REJECTIONS_KEPT = 20


def require_node(caller: Caller, node_id: str) -> None:
    """Only the node's own agent token may speak for it."""
    if caller.kind != "node" or caller.id != node_id:
        raise Forbidden(f"only the agent of node {node_id!r} may use this endpoint")


def heartbeat(gw: Native, session: Session, node_id: str, beat: Heartbeat, instance: str = "") -> None:
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
            alert(session, now, "node_not_isolated", {
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
    node_health.on_heartbeat(gw, session, node, was, instance, beat.running, now)


def _alert_if_short(gw: Native, session: Session, node_id: str, reported: int, now: datetime) -> None:
    """A node now reporting fewer GPUs than its jobs hold takes no new work until they fit (the scheduler marks
    it degraded, gateway/native/scheduler_loop.py); its jobs are not touched. Told once per change of count, not per
    beat."""
    beyond: set[int] = set()
    jobs: set[str] = set()
    for job_id, gpus in session.execute(select(Allocation.job_id, Allocation.gpus).where(
            Allocation.node == node_id, Allocation.released.is_(False))).all():
        missing = {g for g in gpus if g >= reported}
        if missing:
            beyond |= missing
            jobs.add(job_id)
    if beyond:
        alert(session, now, "node_gpus_missing", {
            "node": node_id, "reported_gpus": reported, "allocated_beyond": sorted(beyond), "jobs": sorted(jobs),
            "effect": "no new work is placed on this node until its jobs fit the GPUs it reports"})


def take_commands(gw: Native, session: Session, node_id: str) -> list[dict[str, Any]]:
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


def has_unacked(gw: Native, session: Session, node_id: str) -> bool:
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


def apply_reports(gw: Native, session: Session, node_id: str, reports: list[AgentReport]) -> None:
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


def anomaly(gw: Native, session: Session, node_id: str, report: AgentReport | None, why: str, now: datetime,
            **body: Any) -> None:
    """A node said something it cannot know or that contradicts the gateway's record: not applied, ledgered and
    alerted as a node anomaly (F3). Either its agent is broken, or something on the node speaks as the agent."""
    about = {} if report is None else {"job_id": report.job_id or None, "event": report.event, "nonce": report.nonce,
                                        "pid": report.pid, "detail": report.detail[:500]}
    entry = {"node": node_id, "anomaly": why, **about, **body, "at": now.isoformat()}
    record_outcome(gw, "agent_report", entry)
    alert(session, now, "node_anomaly", {**entry, "effect": "the report was not applied"})


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


def _contradicted_by_beat(gw: Native, session: Session, node_id: str, running: list[dict[str, Any]],
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


def apply_report(gw: Native, session: Session, node_id: str, report: AgentReport,
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
            _deleted(gw, session, node_id, report)
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
    stale = node_health.stale_report(session, job, part, report.event, report.pid, report.nonce)
    if stale is not None:
        record_outcome(gw, "agent_report", {"node": node_id, "job_id": job.id, "event": report.event,
                                            "detail": report.detail, "nonce": report.nonce, "pid": report.pid,
                                            "stale": stale, "job_state": job.state})
        return
    reports.fold(gw, session, job, part, parts, node_id, report.event, at=report.at, pid=report.pid,
                 evidence=report.evidence, reference=report.nonce, detail=report.detail)


def _rejected(gw: Native, session: Session, node_id: str, report: AgentReport, now: datetime,
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
        alert(session, now, "command_rejected",
                    {"node": node_id, "job_id": report.job_id or None, "nonce": report.nonce,
                     "detail": report.detail})


def _note_stop_rejection(session: Session, sent: NodeCommand, node_id: str, report: AgentReport, now: datetime
                         ) -> None:
    """Keep the rejection on the job's stop request: if the stop never takes, it is the escalation's evidence."""
    jobs = [sent.job_id] if sent.kind == "stop" else list(sent.envelope_params().get("stop") or [])
    for job_id in jobs:
        job = session.get(Job, job_id)
        if job is None or job.state not in STOP_FINISHABLE:
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


def _deleted(gw: Native, session: Session, node_id: str, report: AgentReport) -> None:
    """The node removed artifacts it was asked to: its report's list, read as the agent writes it."""
    ev = report.evidence or {}
    objects = [dict(o) for o in ev.get("deleted") or [] if isinstance(o, dict)]
    left = [str(p) for p in ev.get("left") or []]
    truncated = ev.get("truncated") if isinstance(ev.get("truncated"), dict) else {}
    unlisted = max(0, int(truncated.get("deleted") or 0) - len(objects)) if truncated else 0
    reports.deleted(gw, session, report.job_id, node_id, objects=objects, reason=str(ev.get("reason") or ""),
                    left=left, unlisted=unlisted)


def _unknown(gw: Native, session: Session, node_id: str, report: AgentReport, job: Job | None,
             now: datetime) -> None:
    """A process the gateway does not expect on that node: reported and alerted, never stopped unasked (H1)."""
    record_outcome(gw, "agent_report", {"node": node_id, "job_id": report.job_id or None, "event": report.event,
                                        "detail": report.detail, "nonce": report.nonce, "known_job": job is not None,
                                        "job_state": job.state if job else None, "pid": report.pid})
    if report.event == "deleted":
        alert(session, now, "unsolicited_deletion",
                    {"node": node_id, "job_id": report.job_id, "nonce": report.nonce, "detail": report.detail})
    if report.event == "unknown":
        alert(session, now, "unknown_process",
                    {"node": node_id, "job_id": report.job_id, "pid": report.pid,
                     "known_job": job is not None, "detail": report.detail})


def node_or_404(session: Session, node_id: str) -> Node:
    node = session.get(Node, node_id)
    if node is None:
        raise NotFound(f"no node {node_id!r}")
    return node
