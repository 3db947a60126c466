"""Job services: submit, read, stop. Routes stay thin; every mutation passes the decision pipeline."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway import retention
from gateway.commands import enqueue
from gateway.context import Gateway
from gateway.decisions.approvals import open_request
from gateway.decisions.facts import holds_on
from gateway.decisions.obligations import notify_owners
from gateway.decisions.pipeline import Recorded, decide, durable, ledger_batch, record
from gateway.decisions.pipeline import (
    visible_projects as visible_projects,  # its home is the pipeline; callers import it here
)
from gateway.decisions.verdict import refuse_if_denied, refuse_unless_allowed
from gateway.errors import Conflict, Invalid, LedgerUnavailable, NotFound
from gateway.identity.auth import Caller
from gateway.priority_history import on_submit
from gateway.quotas import admission_problems
from gateway.schemas import JobOut, JobSubmit, StopRequest
from gateway.store.models import Job, Node, Principal, Project
from gateway.store.service_tables import Approval
from gateway.store.states import ENDED_STATES, JOB_STATES, STOPPABLE_STATES, STOPPING_STATES
from gateway.store.submission_rows import insert_submission
from ledger.errors import LedgerError
from scheduler.admission import precheck

T = TypeVar("T")


def new_job_id(now: datetime) -> str:
    """Time-ordered and random; ids are never reused because job rows are never deleted (R1)."""
    return f"j-{int(now.timestamp() * 1000):011x}{secrets.token_hex(4)}"


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


_NODE = Node.__table__.c
_SHAPE = select(_NODE.gpus, func.count()).where(_NODE.gpus > 0).group_by(_NODE.gpus)


def cluster_shape(session: Session) -> list[int]:
    """GPU counts of every registered node (lost ones too: they are expected back).

    Read grouped by size on every submission: a thousand nodes come back as a handful of rows."""
    return [gpus for gpus, count in session.connection().execute(_SHAPE) for _ in range(count)]


# Submissions are the hottest path: these reads go through Core, without the ORM's identity map and objects.
_PROJECT = Project.__table__.c
_PRINCIPAL = Principal.__table__.c
_ORGANISATION = select(_PROJECT.organisation).where(_PROJECT.id == bindparam("id"))
_KIND = select(_PRINCIPAL.kind).where(_PRINCIPAL.id == bindparam("id"))


def _organisation(session: Session, project: str) -> str | None:
    """The project's organisation; None when there is no such project."""
    return session.connection().execute(_ORGANISATION, {"id": project}).scalar()


def _member(gw: Gateway, principal: str, project: str) -> bool:
    roles = gw.policy.roles_of(principal)
    return bool(roles.get(project) or roles.get("*"))


def _principal_kind(session: Session, principal: str) -> str | None:
    return session.connection().execute(_KIND, {"id": principal}).scalar()


async def submit(gw: Gateway, authenticate: Callable[[Session], Caller], spec: JobSubmit) -> tuple[Job, Recorded]:
    """Admit a job into its queue. Raises Invalid, PolicyDenied, Conflict, LedgerUnavailable.

    Two transactions: the decision is made and queued in the ledger while only reading (so concurrent
    submissions share ledger commits instead of queueing behind one write lock); once it is durable, the
    job's rows are written in a short transaction of their own (one statement on SQLite,
    gateway/submission_rows.py). Nothing about a job that does not exist yet can change in between.

    A coroutine, run on the event loop rather than in a worker thread: its work is short, and its one long
    wait, the ledger's fsync, is awaited without holding a thread. In a worker thread each, eight of them,
    the loop and the ledger's writer took turns at CPython's interpreter lock: about 88 context switches per
    submission under load against 16 on the loop, a quarter of its CPU. Where a step would wait on the
    network (PostgreSQL, an OPA server) or on another thread's write, it runs in a worker thread (_off_loop).
    """
    remote = not gw.db.is_sqlite or gw.settings.policy_engine == "opa"
    job, rec, problems, submitter = await _off_loop(partial(_read_and_decide, gw, authenticate, spec), blocks=remote)
    assert rec.ticket is not None  # decided with wait=False
    try:
        await durable(rec.ticket)  # the decision is durable before anyone hears of it
    except LedgerError as e:
        raise LedgerUnavailable(f"the decision could not be recorded ({e}); nothing was changed") from e
    refuse_unless_allowed(rec)
    if problems:
        await _record_outcome(gw, {"request_id": rec.request_id, "decision_seq": rec.seq, "action": "job.submit",
                                   "result": "rejected", "problems": problems})
        raise Invalid("the job can never run here: " + "; ".join(problems), problems=problems)
    assert job is not None  # allowed, and nothing against it
    rows = on_submit(gw, job, submitter=submitter, mounts=spec.mounts, datasets=spec.datasets)  # Q3
    try:
        await _off_loop(partial(insert_submission, gw.db, job, *rows), blocks=remote or gw.db.writer_busy)
    except Exception as e:
        await _record_outcome(gw, {"request_id": rec.request_id, "decision_seq": rec.seq, "action": "job.submit",
                                   "job_id": job.id, "result": "failed", "error": e.__class__.__name__})
        raise
    gw.scheduler_kick.set()
    return job, rec


async def _off_loop(fn: Callable[[], T], *, blocks: bool) -> T:
    """fn() here on the event loop, or in a worker thread if it `blocks` (waits on the network, or on a lock
    another thread holds): the loop serves every other request meanwhile and must never wait."""
    return await run_in_threadpool(fn) if blocks else fn()


async def _record_outcome(gw: Gateway, body: dict[str, Any]) -> None:
    """pipeline.record_outcome, awaited on the event loop. Raises LedgerUnavailable."""
    try:
        await durable(gw.ledger.enqueue("outcome", body))
    except LedgerError as e:
        raise LedgerUnavailable(f"could not record outcome ({e})") from e


def _read_and_decide(gw: Gateway, authenticate: Callable[[Session], Caller],
                     spec: JobSubmit) -> tuple[Job | None, Recorded, list[str], str]:
    """submit()'s read-only transaction: see _admit. Also returns the person who submitted (behind a service
    account, its responsible person)."""
    with gw.transaction(immediate=False) as session:
        caller = authenticate(session)
        return (*_admit(gw, session, caller, spec), caller.real_identity)


def _admit(gw: Gateway, session: Session, caller: Caller, spec: JobSubmit) -> tuple[Job | None, Recorded, list[str]]:
    """Validate, decide and build the job row (not yet added): (job, decision, problems). The decision is
    queued in the ledger, not yet durable. Unless it allows, there is no job; if it allows, `problems` says
    why the job could never run here (then there is no job either)."""
    organisation = _organisation(session, spec.project)
    if organisation is None:
        raise Invalid(f"unknown project {spec.project!r}")
    owner_id = spec.owner or caller.real_identity
    # A person submitting for themselves was just authenticated as that person: no need to look them up.
    if not (owner_id == caller.id and caller.kind == "person") and _principal_kind(session, owner_id) != "person":
        raise Invalid(f"owner {owner_id!r} is not a known person")
    if owner_id != caller.real_identity and not _member(gw, owner_id, spec.project):
        # The owner answers for the job in its project (R2); naming an outsider also charged the job to their
        # user quota and gave it their standing (Q3, Q4).
        raise Invalid(f"owner {owner_id!r} holds no role in project {spec.project}; a job's owner must be a member"
                      " of its project")
    if spec.beneficiary_project and _organisation(session, spec.beneficiary_project) is None:
        raise Invalid(f"unknown beneficiary project {spec.beneficiary_project!r}")
    # The rights holder is a tenant (project) whose people can consent for the data (A6); its
    # organisation differing from the job's makes the job external-rights (R3).
    holder = spec.rights_holder or spec.project
    holder_organisation = _organisation(session, holder) if spec.rights_holder else organisation
    if holder_organisation is None:
        raise Invalid(f"unknown rights holder {spec.rights_holder!r}: name the project that holds the rights")
    now = gw.clock()
    job_id = new_job_id(now)
    # The policy sees the facts it judges; the full spec is kept beside the decision in the ledger.
    params: dict[str, Any] = {"job_id": job_id, "queue": spec.queue, "gpus": spec.gpus_per_node * spec.nodes}
    if holds := holds_on(session, workload=spec.workload, environment=spec.environment, labels=spec.labels):
        params["emergency_holds"] = holds  # C2: the scope of an emergency stop is closed to new jobs
    rec = decide(gw, session, caller, "job.submit", project=spec.project, params=params,
                 context={"spec": spec.model_dump(mode="json", exclude_defaults=True)}, wait=False)
    if rec.decision.effect != "allow":
        return None, rec, []
    shape = cluster_shape(session)
    problems = precheck(spec.gpus_per_node, spec.nodes, shape) if shape else []
    problems += admission_problems(session, gw.clock(), project=spec.project, owner=owner_id,  # Q1 quotas, mounts
                                   gpus=spec.gpus_per_node * spec.nodes, mounts=spec.mounts, datasets=spec.datasets,
                                   submitter=caller.real_identity, stoppable=spec.stoppable)
    if problems:
        return None, rec, problems
    job = Job(
        id=job_id,
        name=spec.name,
        project=spec.project,
        queue=spec.queue,
        gpus_per_node=spec.gpus_per_node,
        nodes=spec.nodes,
        command=list(spec.command),
        env=dict(spec.env),
        grace_seconds=spec.grace_seconds,
        stop_signal=spec.stop_signal,
        runtime_limit_s=spec.runtime_limit_seconds,
        creator=caller.id,
        creator_kind=caller.kind,
        owner=owner_id,
        beneficiary_project=spec.beneficiary_project or spec.project,
        rights_holder=holder,
        external_rights=holder_organisation != organisation,
        valid_until=spec.valid_until,
        auto_offline=spec.auto_offline,
        contact=spec.contact or owner_id,
        environment=spec.environment,
        dependencies=list(spec.dependencies),
        downstream=list(spec.downstream),
        labels=dict(spec.labels),
        workload=spec.workload,
        trackable=spec.trackable,
        stoppable=spec.stoppable,
        submitted_via=(
            {"trigger": caller.trigger, "responsible": caller.responsible} if caller.kind == "service" else {}
        ),
        state="pending",
        submitted_at=now,
        history=[{"from": None, "to": "pending", "at": now.isoformat(), "by": caller.id, "reason": "submitted"}],
    )
    return job, rec, []


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


def list_jobs(gw: Gateway, session: Session, caller: Caller, *, project: str | None, state: str | None,
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


def get_job(gw: Gateway, session: Session, caller: Caller, job_id: str) -> Job:
    job = load_job(session, job_id)
    rec = decide(gw, session, caller, "job.view", targets=[job], project=job.project, record=False)
    refuse_unless_allowed(rec)
    return job


def refuse_in_state(gw: Gateway, session: Session, caller: Caller, job: Job, detail: str) -> None:
    """Raise a 409 about the job's state to a caller who may see the job. To anyone else its state is as
    private as the rest of it (A1): they go on to the decision, which refuses them, in the ledger. Seeing is
    the person's right, so a token scoped to, say, job.stop alone still counts as one that may see."""
    viewer = replace(caller, token_actions=(*caller.token_actions, "job.view"))
    seen = decide(gw, session, viewer, "job.view", targets=[job], project=job.project, record=False)
    if seen.decision.effect == "allow":
        raise Conflict(detail, state=job.state)


def stop(gw: Gateway, session: Session, caller: Caller, job_id: str,
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


def _stop_after_approval(gw: Gateway, session: Session, approval: Approval, targets: list[Job],
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


def execute_stop(gw: Gateway, session: Session, job: Job, *, by: str, request_id: str, decision_seq: int,
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
    from gateway.stops import ledger_transition, take_over_stop  # late: stops builds on this module

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
            enqueue(gw, session, part["node"], job.id, "stop",
                    {"grace_seconds": job.grace_seconds, "stop_signal": job.stop_signal, "reason": reason})
    record(gw, session, "outcome", {"request_id": request_id, "decision_seq": decision_seq, "action": "job.stop",
                                    "job_id": job.id, "result": job.state, "state_before": before,
                                    "state_after": job.state, "owner_notified": notified,
                                    "took_over_stop": before in STOPPING_STATES})


# What this module carries out once a second person approved it (M2), bound to the running gateway at app
# start (gateway/bootstrap.py).
EXECUTORS = {"job.stop": _stop_after_approval}
