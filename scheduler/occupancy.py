"""P3 maximum continuous occupancy: a job past its limit owes a renewal; without one in the window it is
gracefully stopped and requeued. Pure: the caller gives the times, the rule answers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from scheduler.model import DEFAULT_CONFIG, RunningJob, SchedulerConfig

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


@dataclass(frozen=True)
class Freed:
    """When a running job is expected to free its GPUs, and what that rests on:
    stopping (its stop deadline), limit (its runtime limit), default (no limit: the default run time, a guess),
    occupancy (P3: its maximum continuous occupancy and renewal window end first, then its grace window; a guess
    too, since its owner may renew it)."""

    at: datetime
    basis: Literal["stopping", "limit", "default", "occupancy"]

    @property
    def assumed(self) -> bool:
        return self.basis in ("default", "occupancy")


def frees_at(job: RunningJob, config: SchedulerConfig = DEFAULT_CONFIG) -> Freed:
    """When `job` frees its GPUs (never earlier than it may: overdue jobs are the caller's to clamp to now).
    A job declared not stoppable is never stopped for its occupancy (R5), so that rule does not end it."""
    if job.stop_by is not None:
        return Freed(job.stop_by, "stopping")
    if job.runtime_limit_s is not None:
        end = Freed(job.started_at + timedelta(seconds=job.runtime_limit_s), "limit")
    else:
        end = Freed(job.started_at + timedelta(seconds=config.default_runtime_s), "default")
    if config.max_occupancy_s is not None and job.stoppable:
        since = job.occupancy_since or job.started_at
        stop = since + timedelta(seconds=config.max_occupancy_s + config.renewal_window_s + job.grace_s)
        if stop < end.at:
            return Freed(stop, "occupancy")
    return end
