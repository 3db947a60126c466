"""Q6 reservation for the blocked head job: when and where its gang can start, from the times at which
running jobs are expected to free their GPUs (started_at + runtime_limit_s, as Slurm's backfill does; a job
that declared no limit is taken to run the configured default, as Slurm's DefaultTime).

Q7: there are no partial allocations — a gang holds nothing until all of it starts, and at most one
reservation exists per pool — so no circular wait between reservations can form. Should the stored state
ever show one anyway (a waiting job holding GPUs), the gateway's scheduling cycle releases it and ledgers
that (gateway/native/scheduler_loop.py, break_partial_holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from scheduler.model import JobId
from scheduler.placement import FreeIndex


@dataclass(frozen=True)
class Release:
    """GPUs on one node expected back at `at` (never earlier than now: overdue jobs still hold them).
    `assumed`: the job declared no runtime limit, so `at` is a guess (start + the default run time)."""

    at: datetime
    job_id: JobId
    rank: int
    gpus: tuple[int, ...]
    assumed: bool = False


@dataclass(frozen=True)
class ReservationPlan:
    start: datetime
    gpus_by_rank: dict[int, tuple[int, ...]]
    assumed: bool = False  # some of those GPUs come back at a guessed time (see Release)


def earliest_start(
    index: FreeIndex, releases: Sequence[Release], gpus: int, nodes: int
) -> ReservationPlan | None:
    """First release time at which the gang fits on free + released GPUs, with its best-fit placement there.

    `index` must hold no reservation yet. Returns None when even every expected release is not enough
    (the GPUs it needs are withheld: see Snapshot.withheld).
    """
    future: dict[int, set[int]] = {}
    guessed: set[int] = set()  # ranks some of whose GPUs come back at a guessed time
    # Nodes with at least `gpus` GPUs free at the simulated time, kept up to date release by release.
    fitting = index.count_fitting(gpus, use_held=False)
    ordered = sorted(releases, key=lambda rel: (rel.at, rel.job_id, rel.rank))
    i = 0
    while i < len(ordered):
        at = ordered[i].at
        while i < len(ordered) and ordered[i].at == at:  # everything freed at one instant counts together
            rel = ordered[i]
            free = future.get(rel.rank)
            if free is None:
                free = future[rel.rank] = set(index.free[rel.rank])
            before = len(free)
            free.update(rel.gpus)
            if rel.assumed:
                guessed.add(rel.rank)
            after = len(free)
            fitting += (after >= gpus) - (before >= gpus)
            i += 1
        if fitting >= nodes:
            placed = _place(index, future, gpus, nodes)
            return ReservationPlan(start=at, gpus_by_rank=placed, assumed=not guessed.isdisjoint(placed))
    return None


def _place(
    index: FreeIndex, future: dict[int, set[int]], gpus: int, nodes: int
) -> dict[int, tuple[int, ...]]:
    free_at = [sorted(future[r]) if r in future else index.free[r] for r in range(len(index.free))]
    candidates = sorted((len(free), r) for r, free in enumerate(free_at) if len(free) >= gpus)
    return {r: tuple(free_at[r][:gpus]) for _, r in candidates[:nodes]}
