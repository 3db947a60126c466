"""Checkpoint retention by tier (P1), ledgered, and carried out by whatever runs the jobs (the execution port).

Tiers (the job's `retention` label, or `external` for external-rights data):
  normal     kept until the next job on the same quota (project) starts;
  important  kept `retention.important_days` days (policies/data.json; 14 when the policy set does not say);
  external   kept until the date the rights holder confirmed (label `rights_confirmed_until`, else valid_until).

Cleanup never deletes on the gateway's side: it sends a signed `delete_artifacts` command to the node,
which lists every file it removed; each removal is ledgered when the report comes back.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.pipeline import record, record_outcome
from gateway.jobs.deps import Jobs
from gateway.store.models import Job
from gateway.store.stop_tables import CheckpointRetention, RetentionCleanupNode

DEFAULT_IMPORTANT_DAYS = 14
TIERS = ("normal", "important", "external")


def tier_of(job: Job) -> str:
    if job.external_rights:
        return "external"
    tier = str(job.labels.get("retention", "normal"))
    return tier if tier in TIERS else "normal"


def important_days(gw: Jobs) -> int:
    """The important tier's retention in days, from the active policy set (P1: explicit configuration, checked
    at load by gateway/decisions/policy/loader.py), so a reload changes it for every checkpoint kept from then on."""
    return int(gw.policy_set.data.get("retention", {}).get("important_days", DEFAULT_IMPORTANT_DAYS))


def keep_until(job: Job, tier: str, now: datetime, important: int) -> datetime | None:
    """None means: until the next job on the same quota starts (normal tier). `important`: the important tier's
    days."""
    if tier == "important":
        return now + timedelta(days=important)
    if tier == "external":
        confirmed = job.labels.get("rights_confirmed_until")
        if confirmed:
            try:
                when = datetime.fromisoformat(str(confirmed))
                return when if when.tzinfo else when.replace(tzinfo=now.tzinfo)
            except ValueError:
                pass
        # Unconfirmed rights: keep as long as the job was valid, and never less than now.
        return job.valid_until or now
    return None


def stated(job: Job, important: int) -> dict[str, str]:
    """The retention the job's checkpoints will get when it stops, in words (A5: stated when it is paused).
    `important`: the important tier's days."""
    tier = tier_of(job)
    if tier == "important":
        return {"tier": tier, "keep": f"{important} days after the job stops"}
    if tier == "external":
        confirmed = job.labels.get("rights_confirmed_until")
        if confirmed:
            return {"tier": tier, "keep": f"until {confirmed}, as the rights holder confirmed"}
        until = job.valid_until.isoformat() if job.valid_until else "the job stops"
        return {"tier": tier, "keep": f"until {until} (the job's validity; no confirmation by the rights holder)"}
    return {"tier": tier, "keep": f"until the next job on quota {job.project} starts"}


def retention_out(session: Session, job_id: str) -> dict[str, Any] | None:
    """Where the job's checkpoints stand under retention (P1), for the job's owner to read; None if nothing was
    ever kept. state: kept, in_use (a resumed run reads it), cleaning (removal sent to the nodes), cleaned."""
    row = session.get(CheckpointRetention, job_id)
    if row is None:
        return None
    return {"tier": row.tier, "state": row.state, "kept_since": row.kept_since.isoformat(),
            "keep_until": row.keep_until.isoformat() if row.keep_until else None,
            "until_next_job_on_quota": row.quota if row.keep_until is None else None,
            "cleaned_at": row.cleaned_at.isoformat() if row.cleaned_at else None}


def keep_checkpoints(gw: Jobs, job: Job, now: datetime) -> None:
    """Put a stopped or paused job's checkpoints under its tier's retention (ledgered)."""
    from sqlalchemy.orm import object_session

    session = object_session(job)
    if session is None:
        return
    tier = tier_of(job)
    until = keep_until(job, tier, now, important_days(gw))
    row = session.get(CheckpointRetention, job.id)
    if row is None:
        row = CheckpointRetention(job_id=job.id, tier=tier, quota=job.project, kept_since=now, keep_until=until)
        session.add(row)
    else:
        row.tier, row.kept_since, row.keep_until, row.state = tier, now, until, "kept"
    record(gw, session, "retention", {"job_id": job.id, "tier": tier, "kept_since": now.isoformat(),
                                      "keep_until": until.isoformat() if until else "until the next job on quota "
                                      + job.project + " starts"})


def release(gw: Jobs, job: Job, now: datetime) -> None:
    """A resumed job's run is over, or ended before it began: it no longer reads the checkpoint its pause kept,
    which goes back under the tier's retention from now. Left `in_use`, no tier would ever clean it (P1)."""
    from sqlalchemy.orm import object_session

    session = object_session(job)
    # Only a paused job is resumed: one whose history (every state it took, C3) never passed through `paused` has
    # no checkpoint in use, and a stop of a queued job skips the lookup.
    if session is None or not any(step.get("to") == "paused" for step in job.history):
        return
    row = session.get(CheckpointRetention, job.id)
    if row is not None and row.state == "in_use":
        keep_checkpoints(gw, job, now)


def expired(session: Session, row: CheckpointRetention, now: datetime) -> str | None:
    """Why the row's checkpoints may go now, or None."""
    if row.state != "kept":
        return None
    if row.keep_until is not None:
        return f"{row.tier} retention ended {row.keep_until.isoformat()}" if row.keep_until <= now else None
    successor = session.scalars(select(Job.id).where(
        Job.project == row.quota, Job.id != row.job_id, Job.started_at.is_not(None),
        Job.started_at > row.kept_since).limit(1)).first()
    return f"job {successor} started on quota {row.quota}" if successor else None


def cleanup(gw: Jobs, session: Session, now: datetime) -> list[str]:
    """Send `delete_artifacts` for every expired retention; returns the job ids being cleaned."""
    cleaning = []
    for row in session.scalars(select(CheckpointRetention).where(CheckpointRetention.state == "kept")).all():
        why = expired(session, row, now)
        job = session.get(Job, row.job_id)
        if why is None or job is None:
            continue
        row.state = "cleaning"
        nonces = []
        for node in gw.execution.holders(session, job):
            nonces.append(gw.execution.delete_artifacts(session, job, node, what="checkpoints",
                                                        reason=f"retention: {why}"))
            _sent_to(session, job.id, node, now)
        record_outcome(gw, "retention", {"job_id": job.id, "action": "cleanup", "tier": row.tier, "why": why,
                                         "nonces": nonces, "at": now.isoformat()})
        cleaning.append(job.id)
    return cleaning


def _sent_to(session: Session, job_id: str, node: str, now: datetime) -> None:
    part = session.get(RetentionCleanupNode, (job_id, node))
    if part is None:
        session.add(RetentionCleanupNode(job_id=job_id, node=node, state="sent", sent_at=now))
    else:  # an earlier cleanup of this job (it ran again after it): this one starts over
        part.state, part.sent_at, part.reported_at = "sent", now, None


def record_deleted(gw: Jobs, session: Session, node: str, job_id: str, objects: list[dict[str, Any]],
                   reason: str, now: datetime, *, complete: bool = True) -> None:
    """Ledger every object a node deleted (one entry per object). The retention row is cleaned once every node
    the cleanup went to has reported removing everything: a gang job's checkpoints are on each of its nodes, and
    a node that left files behind keeps the cleanup open, for a person to finish."""
    for obj in objects:
        record_outcome(gw, "deletion", {"job_id": job_id, "node": node, "object": obj, "reason": reason,
                                        "at": now.isoformat()})
    row = session.get(CheckpointRetention, job_id)
    if row is None or row.state != "cleaning" or not reason.startswith("retention"):
        return
    part = session.get(RetentionCleanupNode, (job_id, node))
    if part is not None:
        part.state, part.reported_at = ("removed" if complete else "incomplete"), now
    parts = session.scalars(select(RetentionCleanupNode).where(RetentionCleanupNode.job_id == job_id)).all()
    # No parts: a cleanup sent before nodes were tracked; its one report closes it, as it did then.
    if complete and all(p.state == "removed" for p in parts):
        row.state, row.cleaned_at = "cleaned", now
        # P1 asks for the cleanup itself to be audited: its start and each object removed are, and so is its end.
        record_outcome(gw, "retention", {"job_id": job_id, "action": "cleaned", "tier": row.tier,
                                         "nodes": sorted(p.node for p in parts) or [node], "at": now.isoformat()})
