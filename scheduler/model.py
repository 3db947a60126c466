"""The scheduler's input: a frozen snapshot of nodes, waiting jobs and running jobs, plus its configuration.

Per-record invariants are checked at construction (an impossible record cannot exist); checks across
records (unique ids, running GPUs not listed as free) are done by `run_cycle`, which sees them all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
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
    # Alive, but closed to new work: the gateway marks a node whose agent reports fewer GPUs than its jobs hold,
    # since which physical GPU an index names is then in doubt. Its jobs run on and count against capacity and
    # quotas, but nothing is placed or held on it, and no plan counts on the GPUs it frees.
    degraded: bool = False
    # H1: whether its agent runs each job under an identity of its own. Jobs that need that never go elsewhere.
    isolated: bool = True

    @property
    def schedulable(self) -> bool:
        """Whether new work may be placed here: alive and not degraded."""
        return self.alive and not self.degraded

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
    # P2: wait accumulated in earlier stints in the queue (before a preemption) still ages the job.
    wait_credit_s: float = 0.0
    # Q8 compensation after being preempted, and an admin's manual adjustment (Q3 parts).
    compensation: float = 0.0
    manual: float = 0.0
    # R5: declared stoppable from here. One that is not runs only on its tenant's owned quota: borrowed GPUs go
    # back when their lender reclaims them, by preempting the borrower, and such a job is never a victim.
    stoppable: bool = True
    # H1: placed only on nodes that isolate jobs (policy decides which jobs need it, e.g. external-rights ones).
    needs_isolation: bool = False

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def __post_init__(self) -> None:
        _check_job(self.id, self.queue, self.runtime_limit_s)
        if self.wait_credit_s < 0:
            raise InvalidRecord("job", self.id, f"wait_credit_s must not be negative, got {self.wait_credit_s}")
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
    # Q5: admitted on GPUs borrowed from other tenants' idle quota (evicted first on reclaim).
    borrowed: bool = False
    # Already being stopped (graceful window running): its GPUs come back by `stop_by`; never a victim.
    stop_by: datetime | None = None
    # R5: declared stoppable from here. One that is not (its owner must stop it) is never a victim: a plan
    # counting on its GPUs would wait for a stop that cannot come, or stop what was promised to keep running.
    stoppable: bool = True
    # P4: its graceful window. Stopped (preempted, or its occupancy ended), it frees its GPUs this long after.
    grace_s: float = 0.0
    # P3: start of its current occupancy period (its start, or its last renewal); None: its start.
    occupancy_since: datetime | None = None

    @property
    def gpus(self) -> int:
        return sum(len(p.gpus) for p in self.placement)

    def __post_init__(self) -> None:
        _check_job(self.id, self.queue, self.runtime_limit_s)
        if not 0 <= self.grace_s <= MAX_DURATION_S:
            raise InvalidRecord("job", self.id, f"grace_s must be between 0 and {MAX_DURATION_S:g}, got {self.grace_s}")


def _check_job(job_id: JobId, queue: str, runtime_limit_s: float | None) -> None:
    if queue not in QUEUES:
        raise InvalidRecord("job", job_id, f"unknown queue {queue!r}; expected one of {', '.join(QUEUES)}")
    if runtime_limit_s is not None and not runtime_limit_s > 0:
        raise InvalidRecord("job", job_id, f"runtime_limit_s must be positive, got {runtime_limit_s}")


def _per_queue(**values: float) -> Mapping[str, float]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class TenantQuota:
    """Q4/Q5 for one tenant (project): GPUs it owns, how many it may borrow, how many it lends at most, and
    per-user limits on what each user holds within this tenant (their jobs in other tenants do not count).

    borrow_limit / lend_limit None means unlimited (lending is then bounded only by idle quota).
    """

    gpus: int
    borrow_limit: int | None = 0
    lend_limit: int | None = None
    users: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        for name in ("gpus", "borrow_limit", "lend_limit"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise InvalidRecord("quota", name, f"must not be negative, got {v}")
        for user, limit in self.users.items():
            if limit < 0:
                raise InvalidRecord("quota", user, f"user limit must not be negative, got {limit}")
        object.__setattr__(self, "users", MappingProxyType(dict(self.users)))


@dataclass(frozen=True)
class Quotas:
    """The three quota tiers (Q4). cluster_gpus None: the physical capacity is the only cluster limit.

    Tenants without an entry get `default_tenant`: by default they own nothing and may borrow idle GPUs.
    `users` limits what a user holds across all tenants; a tenant's own `users` limit them within it.
    Users without an entry in either are limited only by their tenant.
    """

    cluster_gpus: int | None = None
    tenants: Mapping[ProjectId, TenantQuota] = field(default_factory=lambda: MappingProxyType({}))
    users: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    default_tenant: TenantQuota = TenantQuota(gpus=0, borrow_limit=None)

    def __post_init__(self) -> None:
        if self.cluster_gpus is not None and self.cluster_gpus < 0:
            raise InvalidRecord("quota", "cluster", f"must not be negative, got {self.cluster_gpus}")
        for user, limit in self.users.items():
            if limit < 0:
                raise InvalidRecord("quota", user, f"user limit must not be negative, got {limit}")
        object.__setattr__(self, "tenants", MappingProxyType(dict(self.tenants)))
        object.__setattr__(self, "users", MappingProxyType(dict(self.users)))

    def tenant(self, project: ProjectId) -> TenantQuota:
        return self.tenants.get(project, self.default_tenant)


@dataclass(frozen=True)
class SchedulerConfig:
    """Numbers the scheduler runs on. Mappings are keyed by queue name and must cover every queue.

    reservation_window_s: a blocked head job gets GPUs held for it when it is expected to start within this
    window, so the pool seldom sits idle-held for longer (Q6 "bounded window"), or once it has waited this
    long, so backfill cannot delay it for ever.
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
    # P2/Q8: a running job is never preempted before it has run this long (per queue of the victim).
    min_runtime_s: Mapping[str, float] = field(
        default_factory=lambda: _per_queue(urgent=3600.0, normal=600.0, batch=300.0))
    # Q8: priority added to a preempted job when it is requeued, on top of what it had.
    preemption_compensation: float = 50.0
    # Queues whose jobs may preempt lower-priority running jobs (Q2: urgent has the preemption right).
    preempting_queues: tuple[str, ...] = ("urgent",)
    # Waiting jobs per cycle for which a victim search is tried (the first ones in priority order).
    max_preemption_attempts: int = 3
    # Q3 weighted fair share in the normal queue: up to this many points for a tenant with no recent usage.
    fairshare_weight: float = 100.0
    # Assumed run time of a job that declared no runtime limit: Q10 estimates, and when the head job's GPUs
    # come back (rule 3 of run_cycle), as Slurm's DefaultTime.
    default_runtime_s: float = 86400.0
    # Q3: half-life of the decayed usage behind fair share (applied by whoever keeps the usage).
    fairshare_half_life_s: float = 7 * 86400.0
    # P3: maximum continuous occupancy (None: unlimited) and how long the owner then has to renew.
    max_occupancy_s: float | None = None
    renewal_window_s: float = 3600.0

    def __post_init__(self) -> None:
        """Raises InvalidConfig for a missing or unknown queue, a negative rate or cap, a bad limit, a number
        that is not finite, or a duration past MAX_DURATION_S."""
        self._check_numbers()
        for name in ("queue_baseline", "aging_per_hour", "aging_cap", "min_runtime_s"):
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
        if self.max_preemption_attempts < 0:
            raise InvalidConfig("max_preemption_attempts", f"must not be negative, got {self.max_preemption_attempts}")
        unknown = [q for q in self.preempting_queues if q not in QUEUES]
        if unknown:
            raise InvalidConfig("preempting_queues", f"unknown queues {unknown}")
        for name in ("preemption_compensation", "fairshare_weight"):
            if getattr(self, name) < 0:
                raise InvalidConfig(name, "must not be negative")
        if self.max_occupancy_s is not None and not self.max_occupancy_s > 0:
            raise InvalidConfig("max_occupancy_s", f"must be positive, got {self.max_occupancy_s}")
        if not self.renewal_window_s > 0:
            raise InvalidConfig("renewal_window_s", f"must be positive, got {self.renewal_window_s}")
        if not self.fairshare_half_life_s > 0:
            raise InvalidConfig("fairshare_half_life_s", f"must be positive, got {self.fairshare_half_life_s}")
        if not self.default_runtime_s > 0:
            raise InvalidConfig("default_runtime_s", f"must be positive, got {self.default_runtime_s}")


    def _check_numbers(self) -> None:
        # A NaN compares false with everything, so it slips past every other check and makes priorities NaN;
        # an infinite or huge duration overflows the first datetime it is added to, failing every cycle.
        for f in fields(self):
            value = getattr(self, f.name)
            items = value.items() if isinstance(value, Mapping) else [(None, value)]
            for key, v in items:
                if not isinstance(v, int | float) or isinstance(v, bool):
                    continue
                name = f.name if key is None else f"{f.name}.{key}"
                if not math.isfinite(v):
                    raise InvalidConfig(name, f"must be a finite number, got {v}")
                if f.name in _DURATIONS and v > MAX_DURATION_S:
                    raise InvalidConfig(name, f"must be at most {MAX_DURATION_S:g} s (ten years), got {v:g}")


# Settings that are added to a datetime, and the most any of them may be.
_DURATIONS = frozenset({"reservation_window_s", "min_runtime_s", "default_runtime_s", "fairshare_half_life_s",
                        "max_occupancy_s", "renewal_window_s"})
MAX_DURATION_S = 10 * 365 * 86400.0

DEFAULT_CONFIG = SchedulerConfig()


@dataclass(frozen=True)
class Snapshot:
    """Everything one cycle decides on. Order of the tuples does not matter: the cycle sorts by id."""

    nodes: tuple[NodeState, ...]
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...] = ()
    # None: no quota tiers configured; every allocation is owned and only capacity limits.
    quotas: Quotas | None = None
    # Q3 fair share: each tenant's decayed GPU usage (any unit; only ratios matter).
    usage: Mapping[ProjectId, float] = field(default_factory=lambda: MappingProxyType({}))
    # Jobs whose GPUs are withheld without a known end: node lost, or a stop nobody could confirm. Their
    # processes may still run, so they count against every quota tier; they free nothing and are never victims.
    withheld: tuple[RunningJob, ...] = ()
