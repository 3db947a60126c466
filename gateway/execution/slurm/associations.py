"""jobgate's quota tiers (Q4, Q5) as Slurm association limits, and what cannot be mapped said out loud.

jobgate submits every governed job as its own Slurm user, charged to the job's project as the Slurm
account, so the tiers land on associations like this (`sacctmgr ... set GrpTRES=gres/gpu=N`):

- the cluster quota: the cluster's root association; it binds every job on the cluster;
- a tenant's quota (the GPUs it owns): the account's own association; it binds every job charged to it,
  jobgate's and direct ones;
- a user's limit in a tenant, and the cluster-wide user limit: that user's association in that account (the
  lower of the two); it binds the user's own jobs straight to Slurm.

What is not the same, and is therefore in every sync's `notes` (and the README) rather than silently different:
- Borrowing (Q5) is not available on this backend. Slurm cannot tell a job running on lent GPUs from one
  on its tenant's own, nor reclaim them for the lender, so an account's limit is the GPUs its tenant owns:
  past them its jobs wait (reason AssocGrpGRES) where jobgate's own scheduler would let them borrow. A
  tenant with no quota of its own owns none, so on Slurm its jobs wait until it is given one.
- Per-user limits bind governed jobs at jobgate's admission (Slurm sees them all as jobgate's user, whose
  association carries no limit of its own); in Slurm they bind only what a user submits there directly. The
  cluster-wide user limit is set on each of the user's associations: Slurm does not add them up across
  accounts.
- Partition-level associations are left as they are.
Until a quota is set in jobgate, jobgate leaves every association limit as the site set it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.model import ProjectId, Quotas

GPU_TRES = "gres/gpu"
ROOT = "root"


@dataclass(frozen=True, order=True)
class Assoc:
    """One association of the cluster: an account's own (user ""), a user's in an account, or the cluster's
    (account root, user "")."""

    account: str
    user: str = ""

    def label(self) -> str:
        if self.account == ROOT and not self.user:
            return "cluster"
        return f"{self.account}/{self.user}" if self.user else self.account


@dataclass(frozen=True)
class Change:
    assoc: Assoc
    before: int | None  # GPUs (None: no limit)
    after: int | None

    def as_json(self) -> dict[str, object]:
        return {"association": self.assoc.label(), "before": self.before, "after": self.after}


def gpus_of(tres: str) -> int | None:
    """The gres/gpu count in a TRES list ("cpu=4,gres/gpu=8"); None when it has none."""
    for part in tres.split(","):
        name, _, value = part.partition("=")
        if name.strip() == GPU_TRES and value.strip().lstrip("-").isdigit():
            n = int(value)
            return None if n < 0 else n
    return None


def parse_associations(text: str) -> dict[Assoc, int | None]:
    """`sacctmgr -n -P show assoc format=account,user,partition,grptres` as limits by association; rows of a
    partition are left out (jobgate does not manage them)."""
    out: dict[Assoc, int | None] = {}
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not cells[0]:
            continue
        account, user, partition, tres = cells[:4]
        if partition:
            continue
        out[Assoc(account, user)] = gpus_of(tres)
    return out


def desired(quotas: Quotas | None, present: Iterable[Assoc], *, service_user: str,
            projects: Iterable[str] = ()) -> tuple[dict[Assoc, int | None], list[str]]:
    """The GPU limit jobgate's tiers give each present association, and what does not map (see the module).
    Empty when no quota was ever set (jobgate then manages no limit)."""
    assocs = sorted(set(present))
    if quotas is None:
        return {}, ["no quota is set in jobgate: Slurm's association limits are left as the site set them"]
    notes: list[str] = []
    out: dict[Assoc, int | None] = {}
    accounts = sorted({a.account for a in assocs if a.account != ROOT})
    for a in assocs:
        if a.account == ROOT:
            if not a.user:
                out[a] = quotas.cluster_gpus
            continue
        tenant = quotas.tenant(ProjectId(a.account))
        if not a.user:
            out[a] = tenant.gpus
        elif a.user == service_user:
            out[a] = None  # every governed job's user: the account binds them, jobgate's admission the rest
        else:
            limits = [v for v in (tenant.users.get(a.user), quotas.users.get(a.user)) if v is not None]
            out[a] = min(limits) if limits else None
    for account in accounts:
        tenant = quotas.tenant(ProjectId(account))
        if ProjectId(account) not in quotas.tenants:
            notes.append(f"account {account} has no quota in jobgate: it owns no GPUs and cannot borrow on Slurm, "
                         "so its jobs wait (GrpTRES=gres/gpu=0) until it is given one")
        elif tenant.borrow_limit != 0:
            may = "any idle" if tenant.borrow_limit is None else f"up to {tenant.borrow_limit} idle"
            notes.append(f"tenant {account} may borrow {may} GPUs in jobgate; borrowing is not available on the "
                         f"Slurm backend: its jobs wait at the {tenant.gpus} it owns (AssocGrpGRES)")
        if tenant.lend_limit is not None:
            notes.append(f"tenant {account}'s lend limit has no effect on Slurm: nothing is borrowed there")
    if quotas.users and len(accounts) > 1:
        notes.append("cluster-wide user limits are set on each of the user's associations: Slurm does not add "
                     "a user's GPUs up across accounts (jobgate's admission does, for governed jobs)")
    missing = sorted(set(projects) - set(accounts))
    if missing:
        notes.append("projects with no Slurm account on this cluster (their jobs are refused by Slurm): "
                     + ", ".join(missing))
    return out, notes


def changes(want: Mapping[Assoc, int | None], have: Mapping[Assoc, int | None]) -> list[Change]:
    """The associations whose GPU limit differs from what jobgate wants, in a stable order."""
    return [Change(a, have.get(a), want[a]) for a in sorted(want) if a in have and have[a] != want[a]]


def modify_argv(cluster: str, change: Change) -> list[str]:
    """The sacctmgr command that sets one association's GPU limit (-1 clears it)."""
    value = f"{GPU_TRES}={-1 if change.after is None else change.after}"
    a = change.assoc
    where = ["user", f"name={a.user}", f"account={a.account}"] if a.user else ["account", f"name={a.account}"]
    return ["sacctmgr", "-i", "modify", *where, f"cluster={cluster}", "set", f"GrpTRES={value}"]
