"""One inventory of workloads (C1, R5): what runs, where, who launched it, who answers for it, what it feeds.

A workload is the set of jobs sharing a `workload` name (e.g. a sweep); a job without one is a workload of
its own. Each workload says whether it is trackable and stoppable; tracked workloads that cannot be stopped
are listed as blind spots, so an emergency stop never silently misses them (C4).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.pipeline import visible_projects
from gateway.identity.auth import Caller
from gateway.jobs.deps import Jobs
from gateway.store.models import Job, Node, Project
from gateway.store.oversight_tables import SlurmForeignJob

LIVE_STATES = ("pending", "starting", "running", "lost", "stop_requested", "stopping", "stop_failed", "paused")


def _launcher(job: Job) -> dict[str, Any]:
    out: dict[str, Any] = {"id": job.creator, "kind": job.creator_kind}
    if job.submitted_via:
        out["trigger"] = job.submitted_via.get("trigger")
        out["responsible"] = job.submitted_via.get("responsible")
    return out


def workloads(gw: Jobs, session: Session, caller: Caller, *, environment: str | None = None,
              labels: dict[str, str] | None = None, include_ended: bool = False) -> dict[str, Any]:
    """Workloads of the projects the caller may view, filtered by scope; with blind spots and totals."""
    projects = list(session.scalars(select(Project.id)).all())
    allowed = visible_projects(gw, session, caller, projects)
    stmt = select(Job).where(Job.project.in_(sorted(allowed))).order_by(Job.submitted_at, Job.id)
    if not include_ended:
        stmt = stmt.where(Job.state.in_(LIVE_STATES))
    if environment:
        stmt = stmt.where(Job.environment == environment)
    jobs = [j for j in session.scalars(stmt).all() if all(j.labels.get(k) == v for k, v in (labels or {}).items())]
    isolation = {n.id: n.isolation or "unknown" for n in session.scalars(select(Node)).all()}
    groups: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        groups[job.workload or job.id].append(job)
    out = []
    for name, members in groups.items():
        trackable = all(j.trackable for j in members)
        stoppable = all(j.stoppable for j in members)
        out.append({
            "workload": name,
            "named": members[0].workload is not None,
            "environments": sorted({j.environment for j in members}),
            "projects": sorted({j.project for j in members}),
            "launchers": [dict(t) for t in {tuple(sorted(_launcher(j).items())) for j in members}],
            "responsible": sorted({j.owner for j in members}),
            "contacts": sorted({j.contact for j in members}),
            "rights_holders": sorted({j.rights_holder for j in members}),
            "dependencies": sorted({d for j in members for d in j.dependencies}),
            "downstream": sorted({d for j in members for d in j.downstream}),
            "trackable": trackable,
            "stoppable": stoppable,
            "not_stoppable_jobs": [j.id for j in members if not j.stoppable],
            "jobs": [{"id": j.id, "name": j.name, "state": j.state, "labels": dict(j.labels),
                      "nodes": [{"node": p["node"], "isolation": isolation.get(p["node"], "unknown")}
                                for p in j.placement]} for j in members],
            "gpus": sum(j.gpus_per_node * j.nodes for j in members if j.state not in ("pending", "paused")),
        })
    out.sort(key=lambda w: (w["environments"], w["workload"]))
    blind = [{"workload": w["workload"], "environments": w["environments"], "responsible": w["responsible"],
              "jobs": w["not_stoppable_jobs"],
              "why": "tracked but not stoppable: an emergency stop cannot reach it; its owner must stop it"}
             for w in out if w["trackable"] and not w["stoppable"]]
    blind += ungoverned(gw, session, caller)
    untracked = [w["workload"] for w in out if not w["trackable"]]
    # H1: where jobs run as the agent's own user, any of them could act as the node (its token is readable).
    bare = sorted({p["node"] for j in jobs for p in j.placement if isolation.get(p["node"]) == "none"})
    return {"workloads": out, "blind_spots": blind, "untracked": untracked,
            "unisolated_nodes": [{"node": n, "why": "isolation none: its jobs run as the agent's own user and could "
                                                   "act as the node"} for n in bare],
            "totals": {"workloads": len(out), "jobs": len(jobs), "blind_spots": len(blind),
                       "ungoverned": sum(1 for b in blind if b.get("governed") is False)},
            "scope": {"environment": environment, "labels": labels or {}}}


UNGOVERNED_WHY = ("submitted straight to Slurm, not through jobgate: tracked, not governed (no decision, approval "
                  "or ledgered stop; an emergency stop does not reach it); stop it in Slurm or resubmit it through "
                  "jobgate")


def ungoverned(gw: Jobs, session: Session, caller: Caller) -> list[dict[str, Any]]:
    """R5: jobs a Slurm cluster holds that jobgate did not submit (gateway/execution/slurm/oversight.py keeps them),
    of the accounts the caller may view, as blind spots."""
    rows = list(session.scalars(select(SlurmForeignJob).where(SlurmForeignJob.live.is_(True))
                                .order_by(SlurmForeignJob.first_seen, SlurmForeignJob.id)))
    if not rows:
        return []
    allowed = visible_projects(gw, session, caller, sorted({r.account for r in rows}))
    return [{"workload": f"slurm:{r.cluster}:{r.slurm_job_id}", "environments": [], "responsible": [r.user],
             "jobs": [], "governed": False,
             "slurm": {"cluster": r.cluster, "job_id": r.slurm_job_id, "user": r.user, "account": r.account,
                       "partition": r.partition, "state": r.state, "name": r.name, "nodes": r.nodes, "gpus": r.gpus,
                       "claims_jobgate_id": r.claims, "first_seen": r.first_seen.isoformat(),
                       "ledger_seq": r.ledger_seq},
             "why": UNGOVERNED_WHY + (f"; its comment claims jobgate job {r.claims}, which jobgate did not submit"
                                      if r.claims else "")}
            for r in rows if r.account in allowed]
