"""Limits the system enforces by stopping a job: its declared runtime limit (Q6) and its validity period (R4).

Q6: a job is stopped once it has run past the runtime limit it declared.

A declared limit is a promise the scheduler builds on: a job that gives one may backfill onto GPUs held for a
larger job, because it will be done before that job's reservation starts (scheduler/cycle.py, rule 3). Left
to overrun, it would delay that job without bound. So, as a batch scheduler kills a job at its time limit, the
system asks the policy (rule Q6.runtime_limit) and stops it gracefully: the prepare signal, its grace window to
write a checkpoint, then SIGKILL. A job declared not stoppable (R5) is never stopped by the system; it is
never let onto held GPUs either (scheduler/cycle.py), so its limit only informs estimates.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.facts import over_runtime_limit
from gateway.decisions.notifications import notify
from gateway.decisions.pipeline import decide
from gateway.identity.auth import SYSTEM
from gateway.jobs import stops
from gateway.jobs.deps import Jobs
from gateway.jobs.records import lock_jobs
from gateway.store.models import Job

REASON = "ran past its declared runtime limit (Q6)"


def stop_overrunning(gw: Jobs, session: Session, now: datetime) -> list[str]:
    """Ask a graceful stop of every stoppable running job past its runtime limit and not already being stopped;
    the ids asked for. Each is decided and ledgered as the system's; a refusal leaves the job running."""
    due = [job.id for job in session.scalars(select(Job).where(
        Job.state == "running", Job.runtime_limit_s.is_not(None), Job.started_at.is_not(None),
        Job.stoppable.is_(True))).all() if over_runtime_limit(job, now)]
    asked = []
    # Locked and read again (PostgreSQL): its owner may have stopped it, or its node reported it ended, since.
    for job in lock_jobs(session, due).values():
        if job.state != "running" or job.started_at is None or not over_runtime_limit(job, now):
            continue
        rec = decide(gw, session, SYSTEM, "job.stop", targets=[job], project=job.project, reason=REASON)
        if rec.decision.effect != "allow":
            continue
        stops.request_stop(gw, session, job, now, by="system", reason=REASON, request_id=rec.request_id,
                           decision_seq=rec.seq, runtime_limit_s=job.runtime_limit_s)
        notify(session, job.owner, "job_runtime_limit", {"job_id": job.id, "runtime_limit_s": job.runtime_limit_s,
                                                         "started_at": job.started_at.isoformat()}, now)
        asked.append(job.id)
    return asked


def auto_offline(gw: Jobs, session: Session, now: datetime) -> list[str]:
    """R4: the system reclaims running or queued jobs past valid_until that asked for auto-offline."""
    done = []
    for job in session.scalars(select(Job).where(
            Job.auto_offline.is_(True), Job.valid_until.is_not(None), Job.valid_until <= now,
            Job.state.in_(("pending", "starting", "running")))).all():
        rec = decide(gw, session, SYSTEM, "job.stop", targets=[job], project=job.project,
                     reason="validity period ended; auto-offline (R4)")
        if rec.decision.effect != "allow":
            continue
        stops.request_stop(gw, session, job, now, by="system", reason="validity period ended; auto-offline (R4)",
                           request_id=rec.request_id, decision_seq=rec.seq, auto_offline=True)
        notify(session, job.owner, "job_auto_offline", {"job_id": job.id,
                                                        "valid_until": job.valid_until.isoformat()
                                                        if job.valid_until else None}, now)
        done.append(job.id)
    return done
