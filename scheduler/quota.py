"""Q4/Q5 quota tiers and borrowing: cluster (hard), tenant (owned quota, borrow limit, lend cap), user.

A job is admitted *owned* when its tenant's owned usage plus the job stays within the tenant's quota,
otherwise *borrowed* from the pool of other tenants' idle quota (and capacity nobody owns), within the
tenant's borrow limit and the lenders' lend caps. A job is owned or borrowed as a whole (as in Kueue),
so the accounting per tenant is exact and the property tests can check every tier.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.model import PendingJob, ProjectId, Quotas, RunningJob, Snapshot


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


def usage_of(snapshot: Snapshot, placeable: Callable[[PendingJob], bool]) -> QuotaUsage | None:
    """The quota tiers' use as a cycle starts from (None: no quotas): every GPU-holding job counted, withheld
    ones too, against a capacity that includes withheld GPUs on nodes that are not alive (still physically in
    use) and a degraded node's GPUs (its jobs count against the quotas although nothing is placed there).
    Waiting jobs that `placeable` says the alive nodes could hold claim their tenant's idle quota: one that
    cannot be placed now (a node it needs is lost) would keep that quota from being lent while it sits idle,
    and with it, when the tenant owns the cluster, every other tenant's work. Raises nothing."""
    if snapshot.quotas is None:
        return None
    up = {n.id: n.gpus for n in snapshot.nodes if n.alive}
    withheld_off = sum(len(p.gpus) for j in snapshot.withheld for p in j.placement if p.node not in up)
    usage = QuotaUsage.of(snapshot.quotas, sum(up.values()) + withheld_off, (*snapshot.running, *snapshot.withheld))
    usage.claim((j.project, j.gpus) for j in snapshot.pending if placeable(j))
    return usage


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


class Steps:
    """A monotone step function over a timeline's steps (0: now; k: after the k-th instant at which jobs end),
    kept as the steps where it changes, so a value or a threshold is found by bisection."""

    def __init__(self, value: int) -> None:
        self.steps: list[int] = [0]
        self.values: list[int] = [value]

    def set(self, step: int, value: int) -> None:
        if value == self.values[-1]:
            return
        if self.steps[-1] == step:
            self.values[-1] = value
        else:
            self.steps.append(step)
            self.values.append(value)

    def at(self, step: int) -> int:
        return self.values[bisect_right(self.steps, step) - 1]

    def first_at_most(self, limit: int) -> int | None:
        """First step from which a nonincreasing function is at most `limit` (None: never)."""
        i = bisect_left(self.values, -limit, key=lambda v: -v)
        return self.steps[i] if i < len(self.values) else None

    def first_at_least(self, target: int) -> int | None:
        """First step from which a nondecreasing function is at least `target` (None: never)."""
        i = bisect_left(self.values, target)
        return self.steps[i] if i < len(self.values) else None


class QuotaTimeline:
    """Q4/Q5 use of every tier as running jobs end, instant after instant: from when a waiting job passes
    QuotaUsage.check.

    Use only falls as jobs end, and each part of the check then passes more easily (owned, borrowed, user and
    cluster use shrink; the idle quota others lend grows), so each part holds from some step on: the job passes
    from the latest of them, the tenant part being the earlier of its owned and its borrowed way. Each quantity is
    kept as a Steps, so one job's answer costs a few bisections, not a replay of every end.
    """

    def __init__(self, usage: QuotaUsage, ends: Sequence[Sequence[RunningJob]]) -> None:
        """`usage`: as the cycle starts (it is used up); `ends`: the jobs ending at each instant, in time order."""
        self.usage = usage
        self.total, self.lent, self.lend_sum = Steps(usage.total), Steps(usage.lent), Steps(usage._lend_sum)
        self.owned: dict[ProjectId, Steps] = {}
        self.borrowed: dict[ProjectId, Steps] = {}
        self.lends: dict[ProjectId, Steps] = {}
        self.users: dict[str, Steps] = {}
        self.tenant_users: dict[tuple[ProjectId, str], Steps] = {}
        pool = [usage._lend_sum - usage.lent]
        for step, jobs in enumerate(ends, start=1):
            for job in jobs:
                p, u = job.project, job.user
                series: list[tuple[dict[Any, Steps], Any, dict[Any, int]]] = [
                    (self.owned, p, usage.owned), (self.borrowed, p, usage.borrowed),
                          (self.lends, p, usage._lends), (self.users, u, usage.users),
                          (self.tenant_users, (p, u), usage.tenant_users)]
                for kept, key, live in series:
                    if key not in kept:
                        kept[key] = Steps(live.get(key, 0))
                usage.remove(p, u, job.gpus, job.borrowed)
                for kept, key, live in series:
                    kept[key].set(step, live.get(key, 0))
            self.total.set(step, usage.total)
            self.lent.set(step, usage.lent)
            self.lend_sum.set(step, usage._lend_sum)
            pool.append(usage._lend_sum - usage.lent)
        self.last = len(ends)
        # What every lender lends, less what is lent, step by step (it only grows): one bisection finds when a
        # borrower whose own lending stays put may borrow enough.
        self.pool = pool

    def _of(self, kept: dict[Any, Steps], key: Any, live: dict[Any, int]) -> Steps:
        # A key no end touched kept its value throughout.
        return kept.get(key) or Steps(live.get(key, 0))

    def first_step(self, project: ProjectId, user: str, gpus: int, *, may_borrow: bool = True) -> int | None:
        """The first step from which QuotaUsage.check would let these GPUs in (None: no end does). Raises nothing."""
        usage, quotas = self.usage, self.usage.quotas
        parts: list[int | None] = []
        if quotas.cluster_gpus is not None:
            parts.append(self.total.first_at_most(usage.cluster_limit() - gpus))
        if (limit := quotas.users.get(user)) is not None:
            parts.append(self._of(self.users, user, usage.users).first_at_most(limit - gpus))
        q = quotas.tenant(project)
        if (limit := q.users.get(user)) is not None:
            parts.append(self._of(self.tenant_users, (project, user), usage.tenant_users).first_at_most(limit - gpus))
        own = self._of(self.owned, project, usage.owned).first_at_most(q.gpus - gpus)
        borrow: int | None = None
        if may_borrow:
            capped = (0 if q.borrow_limit is None
                      else self._of(self.borrowed, project, usage.borrowed).first_at_most(q.borrow_limit - gpus))
            lendable = self._first_lendable(project, gpus)
            borrow = None if capped is None or lendable is None else max(capped, lendable)
        parts.append(own if borrow is None else borrow if own is None else min(own, borrow))
        return None if any(p is None for p in parts) else max(p for p in parts if p is not None)

    def _first_lendable(self, borrower: ProjectId, gpus: int) -> int | None:
        """First step at which QuotaUsage.lendable(borrower) >= gpus. It only grows as jobs end: it is the pool
        (every lender's lending less what is lent) less the borrower's own lending, plus unowned capacity. Within
        a run of steps where the borrower's own lending stays put that is the pool alone, so the first run whose
        last step suffices is found by bisection, and the step in it by another."""
        own = self._of(self.lends, borrower, self.usage._lends)
        unowned = max(0, self.usage.cluster_limit() - self.usage._owned_quota)
        runs = len(own.steps)

        def run_end(i: int) -> int:
            return own.steps[i + 1] - 1 if i + 1 < runs else self.last

        def enough(i: int, step: int) -> bool:
            return self.pool[step] - own.values[i] + unowned >= gpus

        if not enough(runs - 1, self.last):
            return None
        lo, hi = 0, runs - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if enough(mid, run_end(mid)):
                hi = mid
            else:
                lo = mid + 1
        return bisect_left(self.pool, gpus + own.values[lo] - unowned, lo=own.steps[lo], hi=run_end(lo) + 1)
