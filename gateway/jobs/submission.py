"""Job services: submit, read, stop. Routes stay thin; every mutation passes the decision pipeline."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import String, bindparam, cast, exists, func, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.decisions.facts import holds_on
from gateway.decisions.pipeline import Recorded, decide, durable
from gateway.decisions.policy_sync import NAMED_COLUMNS
from gateway.decisions.verdict import refuse_unless_allowed
from gateway.errors import Invalid, LedgerUnavailable
from gateway.identity.auth import Caller
from gateway.jobs.deps import Jobs
from gateway.jobs.priority_history import on_submit
from gateway.jobs.quotas import admission_problems
from gateway.schemas import JobSubmit
from gateway.store.db import transient
from gateway.store.models import Job, Node, Principal, Project
from gateway.store.stop_tables import EmergencyHold
from gateway.store.submission_rows import insert_submission
from ledger.errors import LedgerError
from scheduler.admission import precheck

T = TypeVar("T")


def new_job_id(now: datetime) -> str:
    """Time-ordered and random; ids are never reused because job rows are never deleted (R1)."""
    return f"j-{int(now.timestamp() * 1000):011x}{secrets.token_hex(4)}"


# Submissions are the hottest path: these reads go through Core, without the ORM's identity map and objects.
_PROJECT = Project.__table__.c
_PRINCIPAL = Principal.__table__.c
_NODE = Node.__table__.c
_ORGANISATION = select(_PROJECT.organisation).where(_PROJECT.id == bindparam("id"))
_KIND = select(_PRINCIPAL.kind).where(_PRINCIPAL.id == bindparam("id"))
# The cluster's shape as "gpus:nodes,..." (one per node size: a thousand nodes are a handful of sizes).
_SIZES = select(_NODE.gpus, func.count().label("nodes")).where(_NODE.gpus > 0).group_by(_NODE.gpus).subquery()
_SHAPE = select(func.aggregate_strings(cast(_SIZES.c.gpus, String) + ":" + cast(_SIZES.c.nodes, String), ","))
# A submission's first facts in one statement, one round trip on PostgreSQL rather than four: the project's
# organisation, whether any emergency hold is in force, the cluster's shape and, where replicas share the
# database, the policy set it names (PolicySync.read_with).
_FACTS = select(
    _ORGANISATION.scalar_subquery().label("organisation"),
    exists().where(EmergencyHold.lifted_at.is_(None)).label("held"),
    _SHAPE.scalar_subquery().label("shape"),
)
_FACTS_OF_REPLICAS = _FACTS.add_columns(*NAMED_COLUMNS)


@dataclass(frozen=True)
class _Facts:
    organisation: str | None  # None: no such project
    held: bool  # some emergency hold is in force (which ones, and whether they cover the job: holds_on)
    shape: list[int]  # GPU counts of every registered node (lost ones too: they are expected back)


def _first_facts(gw: Jobs, session: Session, project: str) -> _Facts:
    replicas = gw.policy_sync.enabled
    row = session.connection().execute(_FACTS_OF_REPLICAS if replicas else _FACTS, {"id": project}).one()
    if replicas:
        gw.policy_sync.read_with(session, (row.policy_hash, row.bindings_version))
    sizes = (size.split(":") for size in row.shape.split(",")) if row.shape else ()
    return _Facts(row.organisation, bool(row.held), [int(gpus) for gpus, nodes in sizes for _ in range(int(nodes))])


def _organisation(session: Session, project: str) -> str | None:
    """The project's organisation; None when there is no such project."""
    return session.connection().execute(_ORGANISATION, {"id": project}).scalar()


def _member(gw: Jobs, principal: str, project: str) -> bool:
    roles = gw.policy.roles_of(principal)
    return bool(roles.get(project) or roles.get("*"))


def _principal_kind(session: Session, principal: str) -> str | None:
    return session.connection().execute(_KIND, {"id": principal}).scalar()


async def submit(gw: Jobs, authenticate: Callable[[Session], Caller], spec: JobSubmit) -> tuple[Job, Recorded]:
    """Admit a job into its queue. Raises Invalid, PolicyDenied, Conflict, LedgerUnavailable.

    Two transactions: the decision is made and queued in the ledger while only reading (so concurrent
    submissions share ledger commits instead of queueing behind one write lock); once it is durable, the
    job's rows are written in a short transaction of their own (one statement on SQLite,
    gateway/store/submission_rows.py). Nothing about a job that does not exist yet can change in between.

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
    gw.execution.queued(job)
    return job, rec


async def _off_loop(fn: Callable[[], T], *, blocks: bool) -> T:
    """fn() here on the event loop, or in a worker thread if it `blocks` (waits on the network, or on a lock
    another thread holds): the loop serves every other request meanwhile and must never wait."""
    return await run_in_threadpool(fn) if blocks else fn()


async def _record_outcome(gw: Jobs, body: dict[str, Any]) -> None:
    """pipeline.record_outcome, awaited on the event loop. Raises LedgerUnavailable."""
    try:
        await durable(gw.ledger.enqueue("outcome", body))
    except LedgerError as e:
        raise LedgerUnavailable(f"could not record outcome ({e})") from e


def _read_and_decide(gw: Jobs, authenticate: Callable[[Session], Caller],
                     spec: JobSubmit) -> tuple[Job | None, Recorded, list[str], str]:
    """submit()'s reads, in a session that only reads (Database.reading): see _admit. Also returns the person
    who submitted (behind a service account, its responsible person)."""
    with gw.db.reading() as session:
        caller = authenticate(session)
        return (*_admit(gw, session, caller, spec), caller.real_identity)


def _admit(gw: Jobs, session: Session, caller: Caller, spec: JobSubmit) -> tuple[Job | None, Recorded, list[str]]:
    """Validate, decide and build the job row (not yet added): (job, decision, problems). The decision is
    queued in the ledger, not yet durable. Unless it allows, there is no job; if it allows, `problems` says
    why the job could never run here (then there is no job either)."""
    facts = _first_facts(gw, session, spec.project)
    organisation = facts.organisation
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
    if facts.held and (holds := holds_on(session, workload=spec.workload, environment=spec.environment,
                                         labels=spec.labels)):
        params["emergency_holds"] = holds  # C2: the scope of an emergency stop is closed to new jobs
    rec = decide(gw, session, caller, "job.submit", project=spec.project, params=params,
                 context={"spec": spec.model_dump(mode="json", exclude_defaults=True)}, wait=False)
    if rec.decision.effect != "allow":
        return None, rec, []
    problems = precheck(spec.gpus_per_node, spec.nodes, facts.shape) if facts.shape else []
    problems += admission_problems(session, gw.clock(), project=spec.project, owner=owner_id,  # Q1 quotas, mounts
                                   gpus=spec.gpus_per_node * spec.nodes, mounts=spec.mounts, datasets=spec.datasets,
                                   submitter=caller.real_identity, stoppable=spec.stoppable)
    if problems:
        return None, rec, problems
    job = transient(
        Job,
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
