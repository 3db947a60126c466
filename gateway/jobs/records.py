"""Reading and locking jobs, and the one way a job changes state: the step kept in its history (C3), its run's
start, and the job as the API shows it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from gateway.decisions.pipeline import decide, visible_projects
from gateway.decisions.verdict import refuse_unless_allowed
from gateway.errors import Conflict, Invalid, NotFound
from gateway.identity.auth import Caller
from gateway.jobs.deps import Jobs
from gateway.schemas import JobOut
from gateway.store.models import Job, Project
from gateway.store.states import JOB_STATES


def transition(job: Job, state: str, now: datetime, *, by: str, reason: str = "") -> None:
    """Move a job to a new state and keep the timestamped step in its history (C3)."""
    job.history = [*job.history, {"from": job.state, "to": state, "at": now.isoformat(), "by": by, "reason": reason}]
    job.state = state
    job.state_reason = reason


def run_began(job: Job) -> datetime:
    """When the job's current run began: its start as its nodes reported it, else (a gang still starting) when
    the scheduler placed it, which is when its GPUs stopped being free and its wait in the queue ended. Not its
    submission: counted from there, a job placed seconds ago after an hour in the queue had already served its
    minimum runtime and could be preempted before it ever ran, and lost that hour of wait when requeued."""
    if job.started_at is not None:
        return job.started_at
    for step in reversed(job.history):
        if step.get("to") == "starting" and step.get("at"):
            return datetime.fromisoformat(step["at"])
    return job.submitted_at


def job_out(job: Job) -> JobOut:
    return JobOut(
        id=job.id,
        name=job.name,
        project=job.project,
        queue=job.queue,
        state=job.state,
        state_reason=job.state_reason,
        gpus_per_node=job.gpus_per_node,
        nodes=job.nodes,
        command=list(job.command),
        grace_seconds=job.grace_seconds,
        stop_signal=job.stop_signal,
        ownership={
            "creator": job.creator,
            "creator_kind": job.creator_kind,
            "owner": job.owner,
            "beneficiary_project": job.beneficiary_project,
            "rights_holder": job.rights_holder,
            "external_rights": job.external_rights,
            "contact": job.contact,
            "valid_until": job.valid_until.isoformat() if job.valid_until else None,
            "auto_offline": job.auto_offline,
            "submitted_via": job.submitted_via,
        },
        environment=job.environment,
        dependencies=list(job.dependencies),
        downstream=list(job.downstream),
        labels=dict(job.labels),
        workload=job.workload,
        placement=list(job.placement),
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        ended_at=job.ended_at,
        outcome=job.outcome,
        exit_code=job.exit_code,
        stop_request=dict(job.stop_request),
        evidence=dict(job.evidence),
        history=list(job.history),
    )


_JOB_BY_ID = select(Job).where(Job.id == bindparam("id"))  # built once: building costs more than running


_JOB_BY_ID_FOR_UPDATE = _JOB_BY_ID.with_for_update()


def load_job(session: Session, job_id: str, *, for_update: bool = False) -> Job:
    job = session.scalars(_JOB_BY_ID_FOR_UPDATE if for_update else _JOB_BY_ID, {"id": job_id}).first()
    if job is None:
        raise NotFound(f"no job with id {job_id!r}")
    return job


def lock_jobs(session: Session, job_ids: Iterable[str]) -> dict[str, Job]:
    """Lock these jobs' rows (PostgreSQL FOR UPDATE, in id order so that two lockers never deadlock)
    and read them again, also those this session already holds: a copy read earlier without the lock may be
    stale, and writing it back would undo a change committed since (a stop, a node's report). SQLite has
    nothing to lock: the transaction holds the write lock. Returns the jobs that exist, by id."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    stmt = select(Job).where(Job.id.in_(ids)).order_by(Job.id).with_for_update()
    return {j.id: j for j in session.scalars(stmt, execution_options={"populate_existing": True})}


def list_jobs(gw: Jobs, session: Session, caller: Caller, *, project: str | None, state: str | None,
              limit: int) -> list[Job]:
    """Raises Forbidden for a token whose scope has no job.view (or not that project): its answer was an empty
    list, which read as "no jobs" to a pipeline or an on-call engineer holding the wrong token."""
    caller.check_scope("job.view", [project] if project else [])
    if state is not None and state not in JOB_STATES:  # a typo answered an empty list, read as "no jobs"
        raise Invalid(f"unknown state {state!r}; a job is in one of: {', '.join(JOB_STATES)}")
    projects = [project] if project else list(session.scalars(select(Project.id)).all())
    allowed = visible_projects(gw, session, caller, projects)
    if not allowed:
        return []
    stmt = select(Job).where(Job.project.in_(sorted(allowed)))
    if state:
        stmt = stmt.where(Job.state == state)
    return list(session.scalars(stmt.order_by(Job.submitted_at.desc(), Job.id.desc()).limit(limit)).all())


def get_job(gw: Jobs, session: Session, caller: Caller, job_id: str) -> Job:
    job = load_job(session, job_id)
    rec = decide(gw, session, caller, "job.view", targets=[job], project=job.project, record=False)
    refuse_unless_allowed(rec)
    return job


def refuse_in_state(gw: Jobs, session: Session, caller: Caller, job: Job, detail: str) -> None:
    """Raise a 409 about the job's state to a caller who may see the job. To anyone else its state is as
    private as the rest of it (A1): they go on to the decision, which refuses them, in the ledger. Seeing is
    the person's right, so a token scoped to, say, job.stop alone still counts as one that may see."""
    viewer = replace(caller, token_actions=(*caller.token_actions, "job.view"))
    seen = decide(gw, session, viewer, "job.view", targets=[job], project=job.project, record=False)
    if seen.decision.effect == "allow":
        raise Conflict(detail, state=job.state)
