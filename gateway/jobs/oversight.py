"""What the watch over a Slurm cluster found, told (F3, R5, Q4): gateway/execution/slurm/oversight.py looks,
this ledgers and alerts, as for a bypass (gateway/access/breakglass.py) or a node anomaly (gateway/native/agents.py).

An act on a governed job that jobgate did not do is ledgered as `out_of_band` with who did it (where Slurm says),
on-call is alerted and the job's owner told. A job submitted straight to Slurm is ledgered once, when first seen,
as `ungoverned`; the inventory lists it among the blind spots while Slurm holds it (gateway/jobs/inventory.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.decisions.notifications import alert
from gateway.decisions.pipeline import record_outcome
from gateway.jobs.deps import Jobs
from gateway.jobs.quotas import load_quotas
from gateway.store.models import Project
from scheduler.model import Quotas

ALERT = "slurm_out_of_band"


class JobOversight:
    """The jobs room's side of the watch (gateway/execution/slurm/oversight.py's Oversight)."""

    def __init__(self, gw: Jobs) -> None:
        self.gw = gw

    def quotas(self, session: Session) -> Quotas | None:
        return load_quotas(session, self.gw.clock())

    def projects(self, session: Session) -> list[str]:
        return list(session.scalars(select(Project.id).order_by(Project.id)))

    def out_of_band(self, session: Session, finding: Mapping[str, Any]) -> int:
        body = {"result": "out_of_band", "bypass": True, **finding}
        seq = record_outcome(self.gw, "out_of_band", body)
        owner = finding.get("owner")
        alert(session, self.gw.clock(), ALERT, {**body, "ledger_seq": seq,
                                                "effect": "done in Slurm behind jobgate's back"},
              also=[owner] if isinstance(owner, str) and owner else [])
        return seq

    def ungoverned(self, session: Session, job: Mapping[str, Any]) -> int:
        return record_outcome(self.gw, "ungoverned", {"result": "tracked, not governed", **job})

    def quotas_synced(self, session: Session, entry: Mapping[str, Any]) -> int:
        return record_outcome(self.gw, "outcome", {"action": "quota.sync", "result": "applied", **entry})
