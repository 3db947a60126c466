"""What the job services use of the running gateway (app.py composes it; gateway/decisions/deps.py)."""

from __future__ import annotations

from typing import Protocol

from gateway.decisions.deps import Decider
from gateway.settings import Settings
from gateway.store.db import Database
from scheduler.model import SchedulerConfig


class Jobs(Decider, Protocol):
    """Deciding and recording (whatever runs the jobs is reached only through the execution port, `execution`),
    plus: the business DB (a submission writes its rows in a transaction of its own), the settings, and the
    scheduler's numbers when they were set rather than read from JOBGATE_SCHEDULER_CONFIG
    (gateway/jobs/scheduler_config.py)."""

    db: Database
    settings: Settings
    scheduler_config: SchedulerConfig | None
