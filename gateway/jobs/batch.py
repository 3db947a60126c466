"""Batch operations by explicit ids or a selector, with a dry run and the blast radius (H2).

A selector is resolved to a concrete, sorted id list before anything is decided; that exact list is what
the policy judges, what the ledger records and what an approval is bound to — so a wrong label selector
shows its blast radius instead of emptying a queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.approvals import open_request
from gateway.decisions.pipeline import Recorded, decide, ledger_batch, visible_projects
from gateway.decisions.verdict import decision_out, refuse_if_denied
from gateway.errors import Forbidden, Invalid
from gateway.identity.auth import Caller
from gateway.jobs.deps import Jobs
from gateway.jobs.priority import apply_priority
from gateway.jobs.records import refuse_in_state
from gateway.jobs.stops import execute_stop, not_stoppable
from gateway.schemas import BatchPriorityRequest, BatchRequest, Selector
from gateway.store.models import Job, Project
from gateway.store.states import ACTIVE_STATES, ENDED_STATES, STOPPABLE_STATES, STOPPING_STATES

# A selector without a state matches the jobs a stop can act on, as a single stop does (a lost job too).
SELECTED_STATES = STOPPABLE_STATES + STOPPING_STATES


# The batch decides and writes from the rows it resolves: they are locked (PostgreSQL FOR UPDATE, in id order
# like jobs.lock_jobs, so that two lockers never deadlock) and read afresh. Unlocked, a node's report or the
# scheduler committing in between was undone: a job that had exited went back to stop_requested.
_FRESH = {"populate_existing": True}


def resolve(gw: Jobs, session: Session, caller: Caller, ids: Sequence[str] | None,
            selector: Selector | None) -> list[Job]:
    """Explicit ids (all must exist) or a selector over the projects the caller may see, locked (see _FRESH).
    Raises Invalid."""
    if ids is not None:
        wanted = sorted(set(ids))
        if len(wanted) != len(ids):
            raise Invalid("the same job id is named more than once")
        jobs = list(session.scalars(select(Job).where(Job.id.in_(wanted)).order_by(Job.id).with_for_update(),
                                    execution_options=_FRESH).all())
        missing = sorted(set(wanted) - {j.id for j in jobs})
        if missing:
            raise Invalid(f"no such job(s): {', '.join(missing)}", missing=missing)
        return jobs
    assert selector is not None
    projects = [selector.project] if selector.project else list(session.scalars(select(Project.id)).all())
    allowed = visible_projects(gw, session, caller, projects)
    stmt = select(Job).where(Job.project.in_(sorted(allowed)))
    stmt = stmt.where(Job.state.in_([selector.state] if selector.state else SELECTED_STATES))
    for column, value in (("queue", selector.queue), ("environment", selector.environment),
                          ("workload", selector.workload), ("owner", selector.owner)):
        if value is not None:
            stmt = stmt.where(getattr(Job, column) == value)
    jobs = list(session.scalars(stmt.order_by(Job.id).with_for_update(), execution_options=_FRESH).all())
    # Labels are JSON; matching in Python keeps SQLite and PostgreSQL identical.
    return [j for j in jobs if all(j.labels.get(k) == v for k, v in selector.labels.items())]


def _refuse_unseen(gw: Jobs, session: Session, caller: Caller, jobs: Sequence[Job]) -> None:
    """A dry run answers with its targets' projects, GPUs and running work: named by id, jobs the caller may not
    view would be shown to them that way (A1). A selector only reaches projects they may view. As for a single
    job (jobs.refuse_in_state), seeing is the person's right, whatever actions their token names. Raises
    Forbidden."""
    viewer = replace(caller, token_actions=(*caller.token_actions, "job.view"))
    seen = visible_projects(gw, session, viewer, sorted({j.project for j in jobs}))
    unseen = [j.id for j in jobs if j.project not in seen and j.owner != caller.real_identity]
    if unseen:
        named = ", ".join(unseen[:5]) + (f" and {len(unseen) - 5} more" if len(unseen) > 5 else "")
        raise Forbidden(f"{caller.real_identity} may not view {named}; a dry run shows a blast radius only to those"
                        " who may see every target")


def blast_radius(jobs: Sequence[Job], now: datetime) -> dict[str, Any]:
    """What a batch puts at stake: jobs, projects, GPUs, and GPU-hours of work already running."""
    gpus = sum(j.gpus_per_node * j.nodes for j in jobs)
    hours = sum(j.gpus_per_node * j.nodes * (now - j.started_at).total_seconds() / 3600
                for j in jobs if j.started_at and j.state in ACTIVE_STATES)
    return {"jobs": len(jobs), "projects": sorted({j.project for j in jobs}), "gpus": gpus,
            "gpu_hours_at_stake": round(hours, 3), "running": sum(1 for j in jobs if j.state in ACTIVE_STATES)}


def run_batch(gw: Jobs, session: Session, caller: Caller, req: BatchRequest, *, action: str,
              params: dict[str, Any], apply: Callable[[Job, Recorded], object],
              refusal: Callable[[Job], str | None]) -> dict[str, Any]:
    """Resolve, measure, decide once for the whole selection, then apply to each job or open one approval
    bound to the exact id list (executed later by the action's registered executor with `params`).
    `refusal` says why the action cannot be applied to a job in its state (None: it can).

    Raises Invalid, PolicyDenied, LedgerUnavailable.
    """
    jobs = resolve(gw, session, caller, req.ids, req.selector)
    if req.dry_run and req.ids is not None:
        _refuse_unseen(gw, session, caller, jobs)
    radius = blast_radius(jobs, gw.clock())
    ids = [j.id for j in jobs]
    out: dict[str, Any] = {"dry_run": req.dry_run, "targets": ids, "blast_radius": radius}
    if not jobs:
        raise Invalid("the selection matches no job; nothing to do", **out)
    # Like a single job's route: a job the action cannot apply to (one that ended; for a stop, one paused or
    # deleted too) is a 409 before anything is decided (to those who may see it; for anyone else the decision
    # below refuses). Decided, the batch would be ledgered as allowed and then fail on that job, leaving an
    # allow without an outcome.
    for job in jobs:
        why = refusal(job)
        if why:
            refuse_in_state(gw, session, caller, job, f"{why}; nothing was done")
    project = jobs[0].project if len(radius["projects"]) == 1 else None
    granularity = "job" if len(jobs) == 1 else "workload"
    rec = decide(gw, session, caller, action, targets=jobs, project=project, reason=req.reason,
                 ticket=req.ticket, granularity=granularity, params={**params, "blast_radius": radius},
                 record=not req.dry_run)
    out["decision"] = decision_out(rec).model_dump()
    if req.dry_run:
        return out
    refuse_if_denied(rec)
    if rec.decision.effect == "needs_approval":
        approval = open_request(gw, session, caller, rec, action=action, target_ids=ids, project=project,
                                params=params, reason=req.reason, ticket=req.ticket, granularity=granularity,
                                blast_radius=radius)
        out["approval_id"] = approval.id
        return out
    with ledger_batch(gw, session):  # every job's outcome entries in one group commit
        for job in jobs:
            apply(job, rec)
    out["states"] = {j.id: j.state for j in jobs}
    return out


def stop_many(gw: Jobs, session: Session, caller: Caller, req: BatchRequest) -> dict[str, Any]:
    """Stop every selected job (C3 per job). Raises Invalid, PolicyDenied, LedgerUnavailable."""

    def apply(job: Job, rec: Recorded) -> None:
        execute_stop(gw, session, job, by=caller.id, request_id=rec.request_id, decision_seq=rec.seq,
                     reason=req.reason, ticket=req.ticket, obligations=rec.decision.obligations)

    return run_batch(gw, session, caller, req, action="job.stop", params={}, apply=apply, refusal=not_stoppable)


def reprioritize_many(gw: Jobs, session: Session, caller: Caller, req: BatchPriorityRequest) -> dict[str, Any]:
    """Set the priority of every selected job (A2/A3). Raises Invalid, PolicyDenied, LedgerUnavailable."""
    def apply(job: Job, rec: Recorded) -> None:
        apply_priority(gw, session, job, req.priority, by=caller.id, request_id=rec.request_id,
                       decision_seq=rec.seq, reason=req.reason, approved_by=[], obligations=rec.decision.obligations)

    def refusal(job: Job) -> str | None:
        return f"job {job.id} already ended ({job.state})" if job.state in ENDED_STATES else None

    return run_batch(gw, session, caller, req, action="job.priority", params={"priority": req.priority},
                     apply=apply, refusal=refusal)
