"""Gang placement onto free GPUs: a working copy of the cluster's free GPUs, indexed by free count.

Best fit (Q6 gang, packing against fragmentation): a gang of `n` nodes × `g` GPUs takes the `n` nodes
whose available count is smallest but at least `g`, ties broken by node id, and on each node the lowest
free GPU indices. Nodes sit in buckets by available count, so a fit check costs O(buckets) and a
placement O(buckets + n), whatever the number of nodes.

Held GPUs: once a blocked head job has a reservation, the GPUs it will start on are *held*. A job that
would still be running at the reservation's start sees only unheld free GPUs (`use_held=False`); a job
that finishes before then may use held ones too (`use_held=True`), unheld ones first. Buckets are keyed
by the unheld count; the few reserved nodes are merged in by hand when held GPUs may be used.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence

from scheduler.model import NodeId, NodeState, Placement


class FreeIndex:
    """Free GPUs of the alive nodes, mutable for the duration of one cycle. Nodes must come sorted by id."""

    def __init__(self, nodes: Sequence[NodeState]) -> None:
        self.node_ids: list[NodeId] = [n.id for n in nodes]
        self.free: list[list[int]] = [sorted(n.free) for n in nodes]
        self.held: dict[int, frozenset[int]] = {}
        self._held_free = [0] * len(nodes)
        self.top = max((n.gpus for n in nodes), default=0)
        # buckets[k]: ranks (positions in node_ids) with k unheld free GPUs, ascending.
        self.buckets: list[list[int]] = [[] for _ in range(self.top + 1)]
        self._key: list[int] = []
        # Answers of count_fitting since the last change; most jobs of a cycle ask the same few questions.
        self._counts: dict[tuple[int, bool], int] = {}
        for rank, gpus in enumerate(self.free):
            self._key.append(len(gpus))
            self.buckets[len(gpus)].append(rank)

    def available(self, rank: int, use_held: bool) -> int:
        """Free GPUs on one node that a job may take."""
        return len(self.free[rank]) if use_held else self._key[rank]

    # The three queries below are what the naive ScanIndex replaces with full scans.

    def max_available(self, use_held: bool) -> int:
        """The most GPUs any single node can offer one job right now."""
        best = next((k for k in range(self.top, 0, -1) if self.buckets[k]), 0)
        if use_held:
            best = max([best, *(len(self.free[r]) for r in self.held)])
        return best

    def count_fitting(self, gpus: int, use_held: bool, exclude: frozenset[int] = frozenset()) -> int:
        """Number of nodes offering at least `gpus` GPUs (not counting the ranks in `exclude`)."""
        if exclude:
            return self.count_fitting(gpus, use_held) - sum(self.available(r, use_held) >= gpus for r in exclude)
        cached = self._counts.get((gpus, use_held))
        if cached is not None:
            return cached
        total = sum(map(len, self.buckets[gpus:]))
        if use_held:
            for r in self.held:
                total += (len(self.free[r]) >= gpus) - (self._key[r] >= gpus)
        self._counts[gpus, use_held] = total
        return total

    def best_fit(self, gpus: int, nodes: int, use_held: bool, exclude: frozenset[int] = frozenset()
                 ) -> list[int] | None:
        """Ranks of the `nodes` best-fitting nodes (none of `exclude`), or None when fewer than `nodes` can take
        `gpus`."""
        skip = self.held if use_held else {}
        chosen: list[tuple[int, int]] = []
        for k in range(gpus, self.top + 1):
            for r in self.buckets[k]:
                if r not in skip and r not in exclude:
                    chosen.append((k, r))
                    if len(chosen) == nodes:
                        break
            if len(chosen) == nodes:
                break
        if skip:
            chosen += [(len(self.free[r]), r) for r in skip if len(self.free[r]) >= gpus and r not in exclude]
            chosen.sort()
        if len(chosen) < nodes:
            return None
        return [r for _, r in chosen[:nodes]]

    def allocate(self, ranks: Sequence[int], gpus: int, use_held: bool) -> tuple[Placement, ...]:
        """Take `gpus` GPUs on each of `ranks` (which best_fit returned) and return the placement."""
        out: list[Placement] = []
        for r in sorted(ranks):
            held = self.held.get(r)
            if held is None:
                take = self.free[r][:gpus]
                self.free[r] = self.free[r][gpus:]
            else:
                unheld = [x for x in self.free[r] if x not in held]
                # Unheld first: the reservation keeps as many of its own GPUs as it can.
                order = unheld + [x for x in self.free[r] if x in held] if use_held else unheld
                take = sorted(order[:gpus])
                taken = set(take)
                self.free[r] = [x for x in self.free[r] if x not in taken]
                self._held_free[r] -= len(taken & held)
            self._counts.clear()
            if len(take) != gpus:  # best_fit guarantees this; a short take would over-allocate silently
                raise AssertionError(f"node {self.node_ids[r]} cannot give {gpus} GPUs")
            self._rekey(r)
            out.append(Placement(node=self.node_ids[r], gpus=tuple(take)))
        return tuple(out)

    def hold(self, gpus_by_rank: Mapping[int, Sequence[int]]) -> None:
        """Hold these GPUs (free now or later) for a reservation."""
        for r, gpus in gpus_by_rank.items():
            held = frozenset(gpus)
            self.held[r] = held
            self._held_free[r] = sum(1 for x in self.free[r] if x in held)
            self._counts.clear()
            self._rekey(r)

    def _rekey(self, rank: int) -> None:
        new = len(self.free[rank]) - self._held_free[rank]
        old = self._key[rank]
        if new == old:
            return
        bucket = self.buckets[old]
        del bucket[bisect_left(bucket, rank)]
        insort(self.buckets[new], rank)
        self._key[rank] = new


class ScanIndex(FreeIndex):
    """The naive reference: every query sorts and scans all nodes. Same answers, O(nodes log nodes) each.

    Kept beside FreeIndex so tests can check the two agree and the benchmark can show the difference.
    """

    def max_available(self, use_held: bool) -> int:
        return max((self.available(r, use_held) for r in range(len(self.free))), default=0)

    def count_fitting(self, gpus: int, use_held: bool, exclude: frozenset[int] = frozenset()) -> int:
        return sum(1 for r in range(len(self.free)) if self.available(r, use_held) >= gpus and r not in exclude)

    def best_fit(self, gpus: int, nodes: int, use_held: bool, exclude: frozenset[int] = frozenset()
                 ) -> list[int] | None:
        order = sorted(range(len(self.free)), key=lambda r: (self.available(r, use_held), r))
        chosen = [r for r in order if self.available(r, use_held) >= gpus and r not in exclude][:nodes]
        return chosen if len(chosen) == nodes else None
