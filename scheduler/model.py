"""The scheduler's input: a frozen snapshot of nodes, waiting jobs and running jobs, plus its configuration.

Per-record invariants are checked at construction (an impossible record cannot exist); checks across
records (unique ids, running GPUs not listed as free) are done by `run_cycle`, which sees them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import NewType

from scheduler.errors import InvalidConfig, InvalidRecord

JobId = NewType("JobId", str)
NodeId = NewType("NodeId", str)
ProjectId = NewType("ProjectId", str)

# Q2: three queue levels, highest first.
QUEUES: tuple[str, ...] = ("urgent", "normal", "batch")


@dataclass(frozen=True)
class NodeState:
    """One node: GPU indices 0..gpus-1, the free ones, and whether its agent is alive."""

    id: NodeId
    gpus: int
    free: frozenset[int]
    alive: bool = True

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise InvalidRecord("node", self.id, f"negative GPU count {self.gpus}")
        stray = sorted(g for g in self.free if not 0 <= g < self.gpus)
        if stray:
            raise InvalidRecord("node", self.id, f"free GPUs {stray} outside 0..{self.gpus - 1}")


@dataclass(frozen=True)
class Placement:
    """The GPUs one job holds on one node."""

    node: NodeId
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class PendingJob:
    """A job waiting in a queue for `nodes` distinct nodes with `gpus_per_node` GPUs each (a gang)."""

    id: JobId
    project: ProjectId
    user: str
    queue: str
    gpus_per_node: int
    nodes: int
    submitted_at: datetime
    base_priority: float = 0.0
    runtime_limit_s: float | None = None

    def __post_init__(self) -> None:
        _check_job(self.id, self.queue, self.runtime_limit_s)
        if self.gpus_per_node < 1:
            raise InvalidRecord("job", self.id, f"gpus_per_node must be at least 1, got {self.gpus_per_node}")
        if self.nodes < 1:
            raise InvalidRecord("job", self.id, f"nodes must be at least 1, got {self.nodes}")


@dataclass(frozen=True)
class RunningJob:
    """A job holding GPUs. With a runtime limit it is expected to free them at started_at + limit."""

    id: JobId
    project: ProjectId
    user: str
    queue: str
    priority: float
    started_at: datetime
    placement: tuple[Placement, ...]
    runtime_limit_s: float | None = None

    def __post_init__(self) -> None:
        _check_job(self.id, self.queue, self.runtime_limit_s)


def _check_job(job_id: JobId, queue: str, runtime_limit_s: float | None) -> None:
    if queue not in QUEUES:
        raise InvalidRecord("job", job_id, f"unknown queue {queue!r}; expected one of {', '.join(QUEUES)}")
    if runtime_limit_s is not None and not runtime_limit_s > 0:
        raise InvalidRecord("job", job_id, f"runtime_limit_s must be positive, got {runtime_limit_s}")


def _per_queue(**values: float) -> Mapping[str, float]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class SchedulerConfig:
    """Numbers the scheduler runs on. Mappings are keyed by queue name and must cover every queue.

    reservation_window_s: a blocked head job gets GPUs held for it only when it is expected to start
    within this window, so the pool never sits idle-held for longer (Q6 "bounded window").
    backfill_depth: how many waiting jobs behind the first blocked one are tried per cycle (Slurm's
    bf_max_job_test); the rest wait for a later cycle.
    """

    queue_baseline: Mapping[str, float] = field(
        default_factory=lambda: _per_queue(urgent=1000.0, normal=500.0, batch=100.0))
    aging_per_hour: Mapping[str, float] = field(
        default_factory=lambda: _per_queue(urgent=0.0, normal=10.0, batch=5.0))
    aging_cap: Mapping[str, float] = field(
        default_factory=lambda: _per_queue(urgent=0.0, normal=200.0, batch=300.0))
    reservation_window_s: float = 3600.0
    backfill_depth: int = 500

    def __post_init__(self) -> None:
        """Raises InvalidConfig for a missing or unknown queue, a negative rate or cap, or a bad limit."""
        for name in ("queue_baseline", "aging_per_hour", "aging_cap"):
            values: Mapping[str, float] = getattr(self, name)
            if set(values) != set(QUEUES):
                expected = ", ".join(QUEUES)
                raise InvalidConfig(name, f"needs exactly the queues {expected}, got {sorted(values)}")
            if name != "queue_baseline" and any(v < 0 for v in values.values()):
                raise InvalidConfig(name, "must not be negative")
            # Frozen all the way down: a caller keeping the dict it passed cannot change the config later.
            object.__setattr__(self, name, MappingProxyType(dict(values)))
        if not self.reservation_window_s > 0:
            raise InvalidConfig("reservation_window_s", f"must be positive, got {self.reservation_window_s}")
        if self.backfill_depth < 0:
            raise InvalidConfig("backfill_depth", f"must not be negative, got {self.backfill_depth}")


DEFAULT_CONFIG = SchedulerConfig()


@dataclass(frozen=True)
class Snapshot:
    """Everything one cycle decides on. Order of the tuples does not matter: the cycle sorts by id."""

    nodes: tuple[NodeState, ...]
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...] = ()
