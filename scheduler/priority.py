"""Q3 dynamic priority: queue baseline + the user's contribution + aging, kept as parts so the basis
of every priority can be logged beside its value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from scheduler.model import DEFAULT_CONFIG, PendingJob, ProjectId, SchedulerConfig, Snapshot

_HOUR_S = 3600.0


@dataclass(frozen=True)
class PriorityParts:
    """The parts of a job's effective priority; `total` is their sum.

    manual: an admin's adjustment; compensation: Q8, added each time the job was preempted;
    fairshare: Q3 weighted fair share, normal queue only (more for tenants that used less of their share).
    """

    baseline: float
    contribution: float
    aging: float
    manual: float = 0.0
    compensation: float = 0.0
    fairshare: float = 0.0

    @property
    def total(self) -> float:
        return self.baseline + self.contribution + self.aging + self.manual + self.compensation + self.fairshare

    def as_dict(self) -> dict[str, float]:
        return {"baseline": self.baseline, "contribution": self.contribution, "aging": self.aging,
                "manual": self.manual, "compensation": self.compensation, "fairshare": self.fairshare,
                "total": self.total}


def effective_priority(
    job: PendingJob, now: datetime, config: SchedulerConfig = DEFAULT_CONFIG, fairshare: float = 0.0
) -> PriorityParts:
    """Baseline of the job's queue, plus job.base_priority (the owner's contribution), plus
    min(cap, rate × hours waited, earlier stints included), plus manual, compensation and `fairshare`
    (which the caller passes for normal-queue jobs, see fair_share_points).

    A submission time in the future (clock skew between writers) counts as no wait. Raises
    TypeError if one of the two datetimes is naive and the other aware.
    """
    waited_h = max(0.0, (now - job.submitted_at).total_seconds() + job.wait_credit_s) / _HOUR_S
    aging = min(config.aging_cap[job.queue], config.aging_per_hour[job.queue] * waited_h)
    baseline = config.queue_baseline[job.queue]
    return PriorityParts(baseline=baseline, contribution=job.base_priority, aging=aging, manual=job.manual,
                         compensation=job.compensation,
                         fairshare=fairshare if job.queue == "normal" else 0.0)


def fair_share_points(snapshot: Snapshot, config: SchedulerConfig = DEFAULT_CONFIG) -> Mapping[ProjectId, float]:
    """Q3 weighted fair share: weight × 2^(-usage share / quota share) per tenant (Slurm's classic factor).

    A tenant's share is its owned quota over all owned quota (equal shares without quotas); its usage
    share is its decayed usage over everyone's. A tenant that used nothing gets the full weight.
    """
    tenants = {j.project for j in snapshot.pending} | {j.project for j in snapshot.running} | set(snapshot.usage)
    if not tenants:
        return {}
    quotas = snapshot.quotas
    weights = {t: float(quotas.tenant(t).gpus) if quotas else 1.0 for t in tenants}
    if sum(weights.values()) <= 0:
        weights = dict.fromkeys(tenants, 1.0)
    total_w = sum(weights.values())
    total_u = sum(max(0.0, u) for u in snapshot.usage.values())
    out: dict[ProjectId, float] = {}
    for t in tenants:
        used = max(0.0, snapshot.usage.get(t, 0.0)) / total_u if total_u > 0 else 0.0
        share = weights[t] / total_w
        factor = 2.0 ** (-used / share) if share > 0 else 0.0
        out[t] = config.fairshare_weight * factor
    return out
