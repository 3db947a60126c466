"""Q4/Q5 quota tiers and borrowing: cluster (hard), tenant (owned quota, borrow limit, lend cap), user.

A job is admitted *owned* when its tenant's owned usage plus the job stays within the tenant's quota,
otherwise *borrowed* from the pool of other tenants' idle quota (and capacity nobody owns), within the
tenant's borrow limit and the lenders' lend caps. A job is owned or borrowed as a whole (as in Kueue),
so the accounting per tenant is exact and the property tests can check every tier.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.model import ProjectId, Quotas, RunningJob


@dataclass(frozen=True)
class QuotaVerdict:
    """borrowed is meaningful only when ok; reason says which tier refused otherwise."""

    ok: bool
    borrowed: bool = False
    reason: str = ""
    tier: str = ""


@dataclass
class QuotaUsage:
    """GPUs in use per tier, mutable during one cycle (admits are added as they are decided).

    What each tenant lends (its idle owned quota within its lend cap) is kept per tenant with a running
    sum, so a borrowing check costs O(1) however many tenants there are.
    """

    quotas: Quotas
    capacity: int
    owned: dict[ProjectId, int] = field(default_factory=lambda: defaultdict(int))
    borrowed: dict[ProjectId, int] = field(default_factory=lambda: defaultdict(int))
    users: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # GPUs each user holds within each tenant, for the tenants' own user limits.
    tenant_users: dict[tuple[ProjectId, str], int] = field(default_factory=lambda: defaultdict(int))
    # Owned quota that waiting jobs of the tenant claim: not lendable, so reclaimed GPUs are not lent again.
    demand: dict[ProjectId, int] = field(default_factory=lambda: defaultdict(int))
    total: int = 0
    lent: int = 0
    _lends: dict[ProjectId, int] = field(default_factory=dict)
    _lend_sum: int = 0

    def __post_init__(self) -> None:
        self._owned_quota = sum(q.gpus for q in self.quotas.tenants.values())
        for t in self.quotas.tenants:
            self._refresh(t)

    @classmethod
    def of(cls, quotas: Quotas, capacity: int, running: Iterable[RunningJob]) -> QuotaUsage:
        usage = cls(quotas=quotas, capacity=capacity)
        for job in running:
            usage.add(job.project, job.user, job.gpus, job.borrowed)
        return usage

    def _refresh(self, project: ProjectId) -> None:
        q = self.quotas.tenant(project)
        idle = max(0, q.gpus - self.owned.get(project, 0) - self.demand.get(project, 0))
        lend = idle if q.lend_limit is None else min(idle, q.lend_limit)
        self._lend_sum += lend - self._lends.get(project, 0)
        self._lends[project] = lend

    def claim(self, pending: Iterable[tuple[ProjectId, int]]) -> None:
        """Record what waiting jobs ask of their tenants' owned quota (capped at what is idle)."""
        for project, gpus in pending:
            self.demand[project] += gpus
        for project in list(self.demand):
            idle = max(0, self.quotas.tenant(project).gpus - self.owned.get(project, 0))
            self.demand[project] = min(self.demand[project], idle)
            self._refresh(project)

    def add(self, project: ProjectId, user: str, gpus: int, borrowed: bool) -> None:
        if not borrowed and gpus > 0 and self.demand.get(project):
            self.demand[project] = max(0, self.demand[project] - gpus)
        (self.borrowed if borrowed else self.owned)[project] += gpus
        if borrowed:
            self.lent += gpus
        self.users[user] += gpus
        self.tenant_users[project, user] += gpus
        self.total += gpus
        self._refresh(project)

    def remove(self, project: ProjectId, user: str, gpus: int, borrowed: bool) -> None:
        self.add(project, user, -gpus, borrowed)

    def cluster_limit(self) -> int:
        limit = self.capacity
        if self.quotas.cluster_gpus is not None:
            limit = min(limit, self.quotas.cluster_gpus)
        return limit

    def lendable(self, borrower: ProjectId) -> int:
        """GPUs the borrower could take from others: idle owned quota within lend caps, plus unowned capacity."""
        pool = self._lend_sum - self._lends.get(borrower, 0) + max(0, self.cluster_limit() - self._owned_quota)
        return max(0, pool - self.lent)

    def check(self, project: ProjectId, user: str, gpus: int, *, may_borrow: bool = True,
              cluster: bool = True) -> QuotaVerdict:
        """Whether `gpus` more GPUs for this tenant and user fit every tier, and whether they are borrowed.

        may_borrow False (a job that cannot be stopped, so never reclaimed): only the owned quota may take it.
        cluster False: every tier but the cluster's (which a preemption can make room in)."""
        # Physical capacity is placement's business (and preemption's); this is the configured hard cap.
        if cluster and self.quotas.cluster_gpus is not None and self.total + gpus > self.cluster_limit():
            return QuotaVerdict(False, tier="cluster", reason=(
                f"cluster quota: {self.total} of {self.cluster_limit()} GPUs in use, the job needs {gpus}"))
        user_limit = self.quotas.users.get(user)
        if user_limit is not None and self.users.get(user, 0) + gpus > user_limit:
            return QuotaVerdict(False, tier="user", reason=(
                f"user quota of {user}: {self.users.get(user, 0)} of {user_limit} GPUs in use, "
                f"the job needs {gpus}"))
        q = self.quotas.tenant(project)
        user_limit = q.users.get(user)
        held = self.tenant_users.get((project, user), 0)
        if user_limit is not None and held + gpus > user_limit:
            return QuotaVerdict(False, tier="user", reason=(
                f"user quota of {user} in tenant {project}: {held} of {user_limit} GPUs in use, the job needs {gpus}"))
        owned = self.owned.get(project, 0)
        if owned + gpus <= q.gpus:
            return QuotaVerdict(True, borrowed=False)
        if not may_borrow:
            # Past the whole owned quota (lowered since submission, whose check refuses it) no stop frees enough:
            # say so, rather than leave the owner waiting for GPUs in use to come back.
            never = ", more than the tenant owns: it cannot run unless the quota grows" if gpus > q.gpus else ""
            return QuotaVerdict(False, tier="tenant", reason=(
                f"tenant quota of {project}: {owned} of {q.gpus} owned GPUs in use, the job needs {gpus}{never}; a job "
                "that cannot be stopped runs only on its tenant's own quota, as borrowed GPUs must go back when "
                "reclaimed"))
        borrowed = self.borrowed.get(project, 0)
        if q.borrow_limit is not None and borrowed + gpus > q.borrow_limit:
            return QuotaVerdict(False, tier="tenant", reason=(
                f"tenant quota of {project}: {owned} of {q.gpus} owned GPUs in use and {borrowed} of "
                f"{q.borrow_limit} borrowable GPUs borrowed, the job needs {gpus}"))
        lendable = self.lendable(project)
        if gpus > lendable:
            # Past what the lend caps allow even with every lender idle (quotas changed since submission, whose
            # check refuses it), waiting for idle GPUs is waiting for ever: say so.
            ceiling = most_lendable(self.quotas, project, self.cluster_limit())
            never = (f"; other tenants lend at most {ceiling} even when idle, so it cannot run unless the quotas "
                     "change") if gpus > ceiling else ""
            return QuotaVerdict(False, tier="borrow", reason=(
                f"tenant quota of {project}: {owned} of {q.gpus} owned GPUs in use; only {lendable} idle GPUs "
                f"of other tenants may be borrowed, the job needs {gpus}{never}"))
        return QuotaVerdict(True, borrowed=True)


def most_lendable(quotas: Quotas, borrower: ProjectId, cluster_limit: int) -> int:
    """The most GPUs `borrower` could ever borrow, with every other tenant idle: their owned quota within their
    lend caps, plus the capacity nobody owns (QuotaUsage.lendable with nothing in use). Raises nothing."""
    lends = sum(q.gpus if q.lend_limit is None else min(q.gpus, q.lend_limit)
                for t, q in quotas.tenants.items() if t != borrower)
    return lends + max(0, cluster_limit - sum(q.gpus for q in quotas.tenants.values()))


def hard_limit_problems(quotas: Quotas, project: ProjectId, user: str, gpus: int, capacity: int, *,
                        stoppable: bool = True) -> list[str]:
    """Q1: what makes a job of `gpus` GPUs impossible under the quotas even on an empty cluster.

    stoppable False: the job may only ever run on its tenant's owned quota (QuotaUsage.check never lets it
    borrow), so anything past that quota can never run, whatever the borrow limit says. Raises nothing."""
    problems: list[str] = []
    limit = capacity if quotas.cluster_gpus is None else min(capacity, quotas.cluster_gpus)
    if gpus > limit:
        problems.append(f"asks for {gpus} GPUs, more than the cluster's hard quota of {limit}")
    q = quotas.tenant(project)
    reachable = q.gpus + (limit if q.borrow_limit is None else q.borrow_limit)
    if not stoppable and gpus > q.gpus:
        problems.append(f"asks for {gpus} GPUs and cannot be stopped, but tenant {project} owns only {q.gpus}: "
                        "a job that cannot be stopped runs only on its tenant's own quota, as borrowed GPUs must "
                        "go back when their lender reclaims them; declare it stoppable or ask for more quota")
    elif q.borrow_limit is not None and gpus > max(q.gpus, q.borrow_limit):
        problems.append(f"asks for {gpus} GPUs, more than tenant {project} may ever hold for one job "
                        f"(quota {q.gpus}, borrow limit {q.borrow_limit})")
    elif gpus > reachable:
        problems.append(f"asks for {gpus} GPUs, more than tenant {project} can reach")
    elif gpus > q.gpus and gpus > (ceiling := most_lendable(quotas, project, limit)):
        problems.append(f"asks for {gpus} GPUs, more than tenant {project} owns ({q.gpus}), and other tenants "
                        f"lend at most {ceiling} even when idle (their lend limits)")
    user_limit = quotas.users.get(user)
    if user_limit is not None and gpus > user_limit:
        problems.append(f"asks for {gpus} GPUs, more than the user quota of {user} ({user_limit})")
    user_limit = q.users.get(user)
    if user_limit is not None and gpus > user_limit:
        problems.append(f"asks for {gpus} GPUs, more than the user quota of {user} in tenant {project} "
                        f"({user_limit})")
    return problems
