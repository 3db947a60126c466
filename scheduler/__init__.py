"""Pure scheduling core: given a snapshot and a clock, decide admits, reservations and reasons to wait.

No I/O, no database, no wall clock; the gateway builds the Snapshot and applies the CycleResult.
"""

from __future__ import annotations

from scheduler.admission import precheck
from scheduler.cycle import Admit, Blocked, CycleResult, Reserve, run_cycle
from scheduler.errors import InconsistentSnapshot, InvalidConfig, InvalidRecord, SchedulerError
from scheduler.model import (
    DEFAULT_CONFIG,
    QUEUES,
    JobId,
    NodeId,
    NodeState,
    PendingJob,
    Placement,
    ProjectId,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)
from scheduler.priority import PriorityParts, effective_priority

__all__ = [
    "DEFAULT_CONFIG",
    "QUEUES",
    "Admit",
    "Blocked",
    "CycleResult",
    "InconsistentSnapshot",
    "InvalidConfig",
    "InvalidRecord",
    "JobId",
    "NodeId",
    "NodeState",
    "PendingJob",
    "Placement",
    "PriorityParts",
    "ProjectId",
    "Reserve",
    "RunningJob",
    "SchedulerConfig",
    "SchedulerError",
    "Snapshot",
    "effective_priority",
    "precheck",
    "run_cycle",
]
