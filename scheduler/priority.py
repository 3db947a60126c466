"""Q3 dynamic priority: queue baseline + the user's contribution + aging, kept as parts so the basis
of every priority can be logged beside its value."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from scheduler.model import DEFAULT_CONFIG, PendingJob, SchedulerConfig

_HOUR_S = 3600.0


@dataclass(frozen=True)
class PriorityParts:
    """The parts of a job's effective priority; `total` is their sum.

    manual (an admin's adjustment) and compensation (Q8, after a preemption) are zero until those
    features exist; they are here so the shape logged today does not change then.
    """

    baseline: float
    contribution: float
    aging: float
    manual: float = 0.0
    compensation: float = 0.0

    @property
    def total(self) -> float:
        return self.baseline + self.contribution + self.aging + self.manual + self.compensation


def effective_priority(
    job: PendingJob, now: datetime, config: SchedulerConfig = DEFAULT_CONFIG
) -> PriorityParts:
    """Baseline of the job's queue, plus job.base_priority, plus min(cap, rate × hours waited).

    A submission time in the future (clock skew between writers) counts as no wait. Raises
    TypeError if one of the two datetimes is naive and the other aware.
    """
    waited_h = max(0.0, (now - job.submitted_at).total_seconds() / _HOUR_S)
    aging = min(config.aging_cap[job.queue], config.aging_per_hour[job.queue] * waited_h)
    baseline = config.queue_baseline[job.queue]
    return PriorityParts(baseline=baseline, contribution=job.base_priority, aging=aging)
