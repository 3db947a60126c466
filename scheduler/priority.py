"""Q3 dynamic priority: queue baseline + the user's contribution + aging, kept as parts so the basis
of every priority can be logged beside its value."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from scheduler.model import DEFAULT_CONFIG, JobId, PendingJob, ProjectId, SchedulerConfig, Snapshot

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


def priority_totals(jobs: Iterable[PendingJob], now: datetime, config: SchedulerConfig,
                    fairshare: Mapping[ProjectId, float]) -> dict[JobId, float]:
    """effective_priority(...).total of every job, without building the parts (the cycle's hot path).

    Same arithmetic in the same order as effective_priority, so the floats are identical.
    """
    baseline, rate, cap = config.queue_baseline, config.aging_per_hour, config.aging_cap
    out: dict[JobId, float] = {}
    for job in jobs:
        q = job.queue
        waited_h = max(0.0, (now - job.submitted_at).total_seconds() + job.wait_credit_s) / _HOUR_S
        aging = min(cap[q], rate[q] * waited_h)
        share = fairshare.get(job.project, 0.0) if q == "normal" else 0.0
        out[job.id] = baseline[q] + job.base_priority + aging + job.manual + job.compensation + share
    return out


class LazyParts(Mapping[JobId, PriorityParts]):
    """Priority parts by job id, computed when asked (a cycle orders 10,000 jobs by total alone)."""

    def __init__(self, jobs: Mapping[JobId, PendingJob], now: datetime, config: SchedulerConfig,
                 fairshare: Mapping[ProjectId, float]) -> None:
        self._jobs, self._now, self._config, self._share = jobs, now, config, fairshare
        self._cache: dict[JobId, PriorityParts] = {}

    def __getitem__(self, job_id: JobId) -> PriorityParts:
        parts = self._cache.get(job_id)
        if parts is None:
            job = self._jobs[job_id]
            parts = self._cache[job_id] = effective_priority(job, self._now, self._config,
                                                             self._share.get(job.project, 0.0))
        return parts

    def __iter__(self) -> Iterator[JobId]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    __hash__ = None  # type: ignore[assignment]


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
