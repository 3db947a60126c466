"""P3 maximum continuous occupancy: a job past its limit owes a renewal; without one in the window it is
gracefully stopped and requeued. Pure: the caller gives the times, the rule answers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from scheduler.model import DEFAULT_CONFIG, SchedulerConfig

Occupancy = Literal["ok", "renewal_due", "expired"]


@dataclass(frozen=True)
class OccupancyVerdict:
    state: Occupancy
    limit_at: datetime | None  # when the current occupancy period ends (None: unlimited)
    renew_by: datetime | None  # end of the renewal window once due


def occupancy(since: datetime, now: datetime, config: SchedulerConfig = DEFAULT_CONFIG) -> OccupancyVerdict:
    """`since`: start of the current period (the job's start, or its last renewal).

    ok until since + max_occupancy_s; renewal_due for renewal_window_s after that; expired afterwards.
    """
    if config.max_occupancy_s is None:
        return OccupancyVerdict("ok", None, None)
    limit_at = since + timedelta(seconds=config.max_occupancy_s)
    renew_by = limit_at + timedelta(seconds=config.renewal_window_s)
    if now < limit_at:
        return OccupancyVerdict("ok", limit_at, None)
    if now < renew_by:
        return OccupancyVerdict("renewal_due", limit_at, renew_by)
    return OccupancyVerdict("expired", limit_at, renew_by)
